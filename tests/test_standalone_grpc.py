"""``tidemq standalone``'s gRPC endpoint: on 127.0.0.1:8081 unless told otherwise; a default
address that is taken, or a missing grpcio, is a start-up line, not a failed start."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from tidemq import cli
from tidemq.config import load_config


def test_the_default_address_is_8081_and_flags_change_or_drop_it(tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    cfg = load_config(None)
    port = free_port()
    moved, why = cli._standalone_grpc(cfg, f"127.0.0.1:{port}", False)
    assert (moved.options["transport"]["grpc"]["listen"], why) == (f"127.0.0.1:{port}", "")
    off, why = cli._standalone_grpc(cfg, None, True)
    assert "grpc" not in off.options.get("transport", {}) and why == ""
    (tmp_path / "mine.toml").write_text('[transport.grpc]\nlisten = "127.0.0.1:0"\n')
    chosen, why = cli._standalone_grpc(load_config(str(tmp_path / "mine.toml")), None, False)
    assert chosen.options["transport"]["grpc"]["listen"] == "127.0.0.1:0"  # the file's table wins
    assert cli.STANDALONE_GRPC == "127.0.0.1:8081"  # RocketMQ's proxy default


def test_a_taken_default_port_is_named_and_the_broker_starts_without_grpc(
    monkeypatch: pytest.MonkeyPatch, spawn: Any, tmp_path: Path
) -> None:
    pytest.importorskip("grpc")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = f"127.0.0.1:{busy.getsockname()[1]}"
    try:
        monkeypatch.setattr(cli, "STANDALONE_GRPC", taken)  # the default, moved off 8081 for the test
        cfg, why = cli._standalone_grpc(load_config(None), None, False)
        assert "grpc" not in cfg.options.get("transport", {})
        assert why.startswith(f"{taken} is taken") and "--grpc-listen" in why and "--no-grpc" in why
        # Asked for explicitly, the same address is a refusal naming it.
        server = None
        with pytest.raises(RuntimeError, match=f"listen = '{taken}': cannot listen there"):
            server = spawn(
                "standalone",
                "--data-dir",
                str(tmp_path / "data"),
                "--namesrv-listen",
                "127.0.0.1:0",
                "--broker-listen",
                "127.0.0.1:0",
                "--grpc-listen",
                taken,
            )
        assert server is None
    finally:
        busy.close()


def test_an_endpoint_that_is_not_required_is_skipped_when_its_port_is_taken(
    tidemq_make_broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import asyncio

    pytest.importorskip("grpc")
    from tidemq_transport_grpc import plugin as grpc_plugin

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = f"127.0.0.1:{busy.getsockname()[1]}"

    async def main() -> None:
        options = {"transport": {"grpc": {"listen": taken, "required": False}}}
        async with tidemq_make_broker(options=options) as broker:
            assert grpc_plugin.server_of(broker) is None and "grpc" not in broker.endpoints
            assert broker.is_master  # serving without it

    try:
        asyncio.run(main())
    finally:
        busy.close()
    assert any("not served" in r.getMessage() and taken in r.getMessage() for r in caplog.records)
