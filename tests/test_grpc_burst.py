"""A burst of streams faster than the endpoint's event loop takes them: every one is served.

grpc keeps the calls it has received but the ``grpc.aio`` server has not yet taken (it takes
them one at a time, from the event loop) in a backlog it bounds itself: 1 000 calls soft, 3 000
hard by default, past which it cancels calls at random; a client whose first write meets that
reports its own INTERNAL ("Internal error from Core").  The endpoint lets the backlog hold as
many calls as it serves (``max_concurrent_calls``), so a burst within the cap is served whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, run_admin

pytest.importorskip("grpc")

WORKER = Path(__file__).with_name("grpc_streams_worker.py")


@pytest.mark.timeout(600)
def test_four_processes_bursting_a_thousand_streams_each_are_all_served(spawn: Any, tmp_path: Path) -> None:
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    grpc_address = f"127.0.0.1:{free_port()}"
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-burst"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = ["{namesrv}"]\n'
        f'data_dir = "{tmp_path / "data"}"\n[transport.grpc]\nlisten = "{grpc_address}"\n'
    )
    spawn("broker", "-c", str(tmp_path / "broker.toml"))
    run_admin(namesrv, "updateTopic", "-t", "Many", "-r", "1", "-w", "1", cwd=tmp_path)
    # All four at once, each opening its 1 000 streams (10 connections) without waiting for any:
    # 4 000 calls arrive faster than the loop takes them (before the fix, 10 to 60 % of them
    # ended INTERNAL on the client).
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), grpc_address, "1000", f"b{n}-", "burst"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    try:
        reports = [json.loads(w.stdout.readline() or "{}") for w in workers]  # type: ignore[union-attr]
    finally:
        for w in workers:
            w.communicate("", timeout=120)
    assert [r.get("failed") for r in reports] == [{}] * 4, reports
    assert [r.get("ok") for r in reports] == [1000] * 4, reports
