"""An in-process NameServer + broker for the examples (``python examples/<example>.py`` finds it beside them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def start_cluster(
    data_dir: Path, broker: dict[str, Any] | None = None, store: dict[str, Any] | None = None
) -> tuple[Any, str]:
    """Start a NameServer and ``broker-a`` on free loopback ports; returns (loop thread, NameServer address).

    ``broker`` and ``store`` add ``[broker]`` and ``[store.mmap]`` settings.
    """
    from tidemq.broker import Broker
    from tidemq.client import LoopThread
    from tidemq.config import NamesrvSettings, compose, parse_config
    from tidemq.namesrv import NameServer
    from tidemq.plugins import get_plugin_manager

    loop = LoopThread("example-cluster")

    async def start() -> str:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(data_dir / "namesrv")),
            get_plugin_manager().create("transport", "tcp"),
        )
        await ns.start()
        raw: dict[str, Any] = {
            "broker": {
                "name": "broker-a",
                "listen": "127.0.0.1:0",
                "namesrv": [ns.address],
                "data_dir": str(data_dir / "broker-a"),
                **(broker or {}),
            }
        }
        if store:
            raw["store"] = {"mmap": store}
        b = Broker(compose(parse_config(raw)))
        await b.start()
        loop.cluster = (ns, b)  # type: ignore[attr-defined]
        return str(ns.address)

    return loop, loop.run(start())


def stop_cluster(loop: Any) -> None:
    """A clean stop: no abort file left in the data directory."""
    ns, broker = loop.cluster
    loop.run(broker.stop())
    loop.run(ns.stop())
    loop.stop()
