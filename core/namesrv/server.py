"""The NameServer: a stateless-per-instance route registry brokers register with."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from tidemq.config import NamesrvSettings
from tidemq.namesrv.auth import NamesrvAuth, load_namesrv_auth
from tidemq.namesrv.kvconfig import KVConfigManager
from tidemq.namesrv.processor import PATH_REFUSAL, NamesrvProcessor
from tidemq.namesrv.routeinfo import RouteInfoManager
from tidemq.protected import check_namesrv_settings
from tidemq.tasks import supervise
from tidemq.transport import Connection

log = logging.getLogger(__name__)

#: NameServer settings a client may change at run time with UPDATE_NAMESRV_CONFIG.
_RUNTIME_KEYS = {"broker_expire_s": float, "scan_interval_s": float}
#: RocketMQ's NamesrvConfig keys UPDATE_NAMESRV_CONFIG takes too: the key -> (tidemq key, factor).
#: ``scanNotActiveBrokerInterval`` is RocketMQ 5's name (4.9 scans every 10 s, fixed), in ms.
_ROCKETMQ_KEYS = {"scanNotActiveBrokerInterval": ("scan_interval_s", 0.001)}
#: The shortest broker expiry UPDATE_NAMESRV_CONFIG may set (the [namesrv] table may go lower, for tests).
MIN_WIRE_EXPIRE_S = 10.0
#: RocketMQ refuses these with NO_PERMISSION and this remark.
PATH_KEYS = ("kvConfigPath", "configStorePath")
#: A Java properties line: the key ends at the first '=', ':' or white space.
_PROPERTY = re.compile(r"([^=:\s]+)\s*(?:[=:]|\s)\s*(.*)")


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
        #: The accounts trusted to write (``[namesrv] credentials_file``); None: writes are open.
        self.auth: NamesrvAuth | None = (
            load_namesrv_auth(self.settings.credentials_file) if self.settings.credentials_file else None
        )
        self.processor = NamesrvProcessor(self)
        self._server: Any = None
        self._scan_task: asyncio.Task[None] | None = None
        self._watched: set[int] = set()
        #: NamesrvConfig.orderMessageEnable: routes carry the topic's ORDER_TOPIC_CONFIG entry.
        #: On by default here (RocketMQ's default is off); UPDATE_NAMESRV_CONFIG can turn it off.
        self.order_message_enable = True

    async def start(self) -> None:
        check_namesrv_settings(self.settings)  # protected mode: refuses an open non-loopback listener
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
        """GET_NAMESRV_CONFIG's body: ``key=value`` lines, RocketMQ's NamesrvConfig/NettyServerConfig
        names for what tidemq has, then tidemq's own ``[namesrv]`` keys."""
        s = self.settings
        kv_path = self.kv_config.path
        items = {
            # RocketMQ's names (what mqadmin getNamesrvConfig and exportConfigs look for).
            "kvConfigPath": str(kv_path) if kv_path is not None else "",
            "orderMessageEnable": "true" if self.order_message_enable else "false",
            "listenPort": self._port(),
            "scanNotActiveBrokerInterval": int(s.scan_interval_s * 1000),
            # tidemq's [namesrv] table.
            "listen": s.listen,
            "broker_expire_s": s.broker_expire_s,
            "scan_interval_s": s.scan_interval_s,
            "data_dir": s.data_dir,
            "max_frame_size": s.max_frame_size,
        }
        return "".join(f"{k}={v}\n" for k, v in items.items())

    def _port(self) -> int:
        if self._server is not None:
            return int(self._server.address[1])
        return self.settings.port

    def update_config_properties(self, text: str) -> str | None:
        """Apply ``key=value`` lines (Java properties: ``=``, ``:`` or a space between key and value);
        returns an error message, or None when all were applied (all or nothing)."""
        updates: dict[str, float] = {}
        order: bool | None = None
        updatable = ", ".join(sorted([*_RUNTIME_KEYS, *_ROCKETMQ_KEYS, "orderMessageEnable"]))
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            match = _PROPERTY.match(line)
            key, value = (match.group(1), match.group(2).strip()) if match else (line, "")
            if key in PATH_KEYS:
                return PATH_REFUSAL
            if key == "orderMessageEnable":
                order = value.lower() == "true"  # Boolean.parseBoolean
                continue
            target, factor = _ROCKETMQ_KEYS.get(key, (key, 1.0))
            if target not in _RUNTIME_KEYS or not match:
                return f"cannot update {key!r} at run time; updatable: {updatable}"
            try:
                updates[target] = _RUNTIME_KEYS[target](value) * factor
            except ValueError:
                return f"{key} = {value!r} is not a number"
        expire = updates.get("broker_expire_s")
        if expire is not None and expire < MIN_WIRE_EXPIRE_S:
            # 0.001 expired every live broker between two registrations: routes stayed empty.
            return (
                f"broker_expire_s = {expire:g} is below {MIN_WIRE_EXPIRE_S:g} s (RocketMQ's shortest "
                "registration period) over the wire: live brokers would expire between registrations"
            )
        try:
            # The ranges of the [namesrv] table (finite, > 0...): "nan" parses as a float and a
            # nan or inf interval would end the expiry of silent brokers.
            checked = attrs.evolve(self.settings, **updates)  # type: ignore[arg-type]  # keys from _RUNTIME_KEYS
        except ValueError as exc:
            return str(exc)
        for key in updates:
            setattr(self.settings, key, getattr(checked, key))
        if order is not None:
            self.order_message_enable = order
        return None
