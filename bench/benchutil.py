"""Helpers shared by the benchmarks: free ports and ``tidemq`` server subprocesses."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop (the broker's loop) when it is installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(
    args: list[str], cwd: Path, what: str | None = None, timeout: float = 30.0
) -> subprocess.Popen[bytes]:
    """Run ``python -m tidemq ARGS`` and return once it prints ``listening on`` (logs in CWD/WHAT.log)."""
    what = what or args[0]
    logf = open(cwd / f"{what}.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=logf,
        cwd=cwd,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        if " listening on " in line:
            return proc
    proc.kill()
    raise SystemExit(f"{what} did not start; see {cwd / (what + '.log')}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_namesrv_and_broker(
    work: Path, broker_toml: str
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], str, str]:
    """A NameServer and one broker on free loopback ports, the broker configured by ``broker_toml``
    (written to WORK/broker.toml; data in WORK/data).  Returns (namesrv, broker, their addresses)."""
    ns_addr, broker_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    (work / "broker.toml").write_text(broker_toml)
    ns = start(["namesrv", "--listen", ns_addr], work, "namesrv")
    try:
        broker = start(
            ["broker", "-c", str(work / "broker.toml"), "--listen", broker_addr, "--namesrv", ns_addr]
            + ["--data-dir", str(work / "data")],
            work,
            "broker",
        )
    except BaseException:
        stop(ns)
        raise
    return ns, broker, ns_addr, broker_addr
