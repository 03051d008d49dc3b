"""``tidemq standalone`` serves the gRPC endpoint RocketMQ 5 clients use (127.0.0.1:8081 by
default), announces it in its start-up lines, and ``examples/v5_client.py`` (the official
``rocketmq-python-client==5.1.2``) sends through it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from test_grpc_official import v5_python  # noqa: F401

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(300)]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "v5_client.py"


def test_standalone_serves_grpc_and_the_v5_example_sends_and_receives(
    v5_python: Path,  # noqa: F811
    spawn: Any,
    tmp_path: Path,
) -> None:
    grpc_address = f"127.0.0.1:{free_port()}"
    server = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
        "--grpc-listen",
        grpc_address,
    )
    announced = []  # the start-up lines after the broker's: its metrics URL, then the gRPC address
    while not any("grpc" in line for line in announced) and len(announced) < 3:
        announced.append(server.proc.stdout.readline().decode().strip())
    assert f"tidemq grpc listening on {grpc_address}" in announced, announced
    out = subprocess.run(
        [str(v5_python), str(EXAMPLE), "--endpoints", grpc_address, "--topic", "orders", "--timeout", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    lines = out.stdout.splitlines()
    assert lines[0].startswith("sync send: message id "), out.stdout + out.stderr[-2000:]
    assert lines[1].startswith("async send: message id "), out.stdout
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    received = [line for line in lines if line.startswith("received and acked: ")]
    assert len(received) == 2, out.stdout
