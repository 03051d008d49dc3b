"""The NameServer: a stateless-per-instance route registry brokers register with."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tidemq.config import NamesrvSettings
from tidemq.namesrv.kvconfig import KVConfigManager
from tidemq.namesrv.processor import NamesrvProcessor
from tidemq.namesrv.routeinfo import RouteInfoManager
from tidemq.tasks import supervise
from tidemq.transport import Connection

log = logging.getLogger(__name__)

#: NameServer settings a client may change at run time with UPDATE_NAMESRV_CONFIG.
_RUNTIME_KEYS = {"broker_expire_s": float, "scan_interval_s": float}


class NameServer:
    """Serve routes over ``transport``; several NameServers run independently of each other."""

    def __init__(
        self,
        settings: NamesrvSettings | None = None,
        transport: Any = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings or NamesrvSettings()
        if transport is None:
            from tidemq.plugins import get_plugin_manager

            transport = get_plugin_manager().create("transport", "tcp")
        self.transport = transport
        self.route_info = RouteInfoManager(clock)
        kv_path = (
            Path(self.settings.data_dir).expanduser() / "kvConfig.json" if self.settings.data_dir else None
        )
        self.kv_config = KVConfigManager(kv_path)
        self.processor = NamesrvProcessor(self)
        self._server: Any = None
        self._scan_task: asyncio.Task[None] | None = None
        self._watched: set[int] = set()

    async def start(self) -> None:
        self.kv_config.load()
        self._server = self.transport.server(
            self.settings.host,
            self.settings.port,
            self.processor.handle,
            max_frame_size=self.settings.max_frame_size,
        )
        await self._server.start()
        self._scan_task = supervise(self._scan_loop, "tidemq-namesrv-expiry")
        log.info("NameServer listening on %s", self.address)

    @property
    def address(self) -> str:
        if self._server is None:
            return self.settings.listen
        host, port = self._server.address
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self._scan_task is not None:
            self._scan_task.cancel()
            try:
                await self._scan_task
            except asyncio.CancelledError:
                pass
            self._scan_task = None
        if self._server is not None:
            await self._server.stop(drain_timeout=2.0)
            self._server = None

    # ------------------------------------------------------------------ liveness
    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.scan_interval_s)
            try:
                self.scan_not_active_brokers()
            except Exception:  # the scan must survive anything
                log.exception("broker scan failed")

    def scan_not_active_brokers(self) -> int:
        """Drop brokers silent for ``broker_expire_s`` and close their connections."""
        expired = self.route_info.scan_not_active_brokers(self.settings.broker_expire_s)
        for live in expired:
            if live.connection is not None and not getattr(live.connection, "closed", True):
                live.connection.close()
        return len(expired)

    def watch_connection(self, conn: Connection) -> None:
        """Remove the broker registered over ``conn`` when it closes (once per connection)."""
        if conn is None or not hasattr(conn, "add_close_callback") or id(conn) in self._watched:
            return
        self._watched.add(id(conn))

        def closed(c: Any) -> None:
            self._watched.discard(id(c))
            self.route_info.on_connection_closed(c)

        conn.add_close_callback(closed)

    # ------------------------------------------------------------------ config over the wire
    def config_properties(self) -> str:
        s = self.settings
        items = {
            "listen": s.listen,
            "broker_expire_s": s.broker_expire_s,
            "scan_interval_s": s.scan_interval_s,
            "data_dir": s.data_dir,
            "max_frame_size": s.max_frame_size,
        }
        return "".join(f"{k}={v}\n" for k, v in items.items())

    def update_config_properties(self, text: str) -> str | None:
        """Apply ``key=value`` lines; returns an error message, or None when applied."""
        updates: dict[str, float] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            key = key.strip()
            if not sep or key not in _RUNTIME_KEYS:
                return f"cannot update {key!r} at run time; updatable: {', '.join(sorted(_RUNTIME_KEYS))}"
            try:
                updates[key] = _RUNTIME_KEYS[key](value.strip())
            except ValueError:
                return f"{key} = {value.strip()!r} is not a number"
        try:
            # The ranges of the [namesrv] table (finite, > 0...): "nan" parses as a float and a
            # nan or inf interval would end the expiry of silent brokers.
            checked = attrs.evolve(self.settings, **updates)  # type: ignore[arg-type]  # keys from _RUNTIME_KEYS
        except ValueError as exc:
            return str(exc)
        for key in updates:
            setattr(self.settings, key, getattr(checked, key))
        return None
