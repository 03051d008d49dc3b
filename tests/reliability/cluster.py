"""Real NameServer and broker subprocesses for the reliability suite, and what they hold.

A broker here is ``python -m tidemq broker -c <toml>`` on a fixed loopback port, so it can be
SIGKILLed and restarted on the same port and data directory while the NameServer stays up.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOADGEN = HERE / "loadgen.py"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digest(body: bytes) -> str:
    """The body digest acknowledgements carry (16 hex chars of blake2b)."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def rss_kib(pid: int) -> int:
    """Resident set size of a process from /proc/<pid>/status (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Proc:
    """A ``python -m tidemq ...`` subprocess that announced ``listening on HOST:PORT``."""

    def __init__(self, args: list[str], log_dir: Path, timeout: float = 30.0) -> None:
        self.args = args
        self.log_path = log_dir / f"{args[0]}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "--log-level", "INFO", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=log_dir,
        )
        self.address = ""
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if not line:
                break
            if " listening on " in line:
                self.address = line.rsplit(" ", 1)[1].strip()
                return
        self.stop()
        raise RuntimeError(f"{args} did not start: {self.log_text()[-3000:]}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._log.close()

    def stop(self) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def write_broker_config(
    path: Path,
    *,
    data_dir: Path,
    port: int,
    namesrv: str,
    flush: str = "sync",
    transient: bool = False,
    commitlog_file_size: int = 256 * 1024,
    consumequeue_entries: int = 400,
    index_entries: int = 3000,
    broker: dict[str, Any] | None = None,
    transport: dict[str, Any] | None = None,
    flush_options: dict[str, Any] | None = None,
) -> Path:
    """A broker TOML with small files, so a short run rolls commit-log, queue and index files."""

    def table(values: dict[str, Any]) -> str:
        out = []
        for k, v in values.items():
            if isinstance(v, bool):
                out.append(f"{k} = {'true' if v else 'false'}")
            elif isinstance(v, str):
                out.append(f'{k} = "{v}"')
            elif isinstance(v, list):
                out.append(f"{k} = [{', '.join(repr(x) for x in v)}]".replace("'", '"'))
            else:
                out.append(f"{k} = {v}")
        return "\n".join(out)

    broker_table = {
        "name": "broker-r",
        "listen": f"127.0.0.1:{port}",
        "namesrv": [namesrv],
        "data_dir": str(data_dir),
        "register_interval_s": 5.0,
        **(broker or {}),
    }
    text = f"""
[broker]
{table(broker_table)}

[plugins]
store = "mmap"
flush = "{flush}"
index = "hash"

[store.mmap]
{
        table(
            {
                "commitlog_file_size": commitlog_file_size,
                "consumequeue_entries": consumequeue_entries,
                "transient_store_pool": transient,
                "cq_flush_interval_ms": 200,
            }
        )
    }

[index.hash]
max_hash_slot_num = 997
max_index_num = {index_entries}
"""
    if flush_options:
        text += f"\n[flush.{flush}]\n{table(flush_options)}\n"
    if transport:
        text += f"\n[transport.tcp]\n{table(transport)}\n"
    path.write_text(text)
    return path


class Cluster:
    """One NameServer that outlives any number of broker processes on one port and data dir."""

    def __init__(self, root: Path, **config: Any) -> None:
        self.root = root
        self.data_dir = root / "broker-data"
        self.port = free_port()
        self.namesrv = Proc(["namesrv", "--listen", "127.0.0.1:0"], root)
        self.config_path = write_broker_config(
            root / "broker.toml",
            data_dir=self.data_dir,
            port=self.port,
            namesrv=self.namesrv.address,
            **config,
        )
        self.broker: Proc | None = None
        self.brokers_started = 0

    @property
    def broker_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_broker(self) -> Proc:
        assert self.broker is None or not self.broker.alive()
        self.broker = Proc(["broker", "-c", str(self.config_path)], self.root)
        self.brokers_started += 1
        return self.broker

    def kill_broker(self) -> None:
        if self.broker is not None:
            self.broker.kill()

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    def close(self) -> None:
        if self.broker is not None:
            self.broker.stop()
        self.namesrv.stop()


def report(name: str, **figures: object) -> None:
    """One ``RELIABILITY <name> {...}`` line on stderr: the figures of the README's report."""
    print(f"\nRELIABILITY {name} {figures}", file=sys.stderr)


def assert_broker_serves(cluster: Cluster) -> None:
    """The broker process is up and answers a well-formed request on a fresh connection."""
    from tidemq.remoting.codes import ResponseCode

    from .rawclient import runtime_info

    assert cluster.broker is not None and cluster.broker.alive(), cluster.broker.log_text()[-3000:]
    resp = runtime_info(cluster.broker_address)
    assert resp is not None and resp.code == ResponseCode.SUCCESS


def faults_cluster(root: Path, **config: Any) -> Cluster:
    """A started async-flush broker with room for load (16 MiB files): the fault suites' target."""
    config = {
        "flush": "async",
        "commitlog_file_size": 16 * 1024 * 1024,
        "consumequeue_entries": 10000,
        "index_entries": 100000,
        **config,
    }
    cluster = Cluster(root, **config)
    cluster.start_broker()
    return cluster


#: What a broker log shows when bad input reached a crash path instead of a one-line refusal.
CRASH_MARKERS = (
    "Traceback",
    "Fatal error",
    "Exception in callback",
    "never retrieved",
    "handler failed",
    "failed on request",
    "Unhandled",
    "RecursionError",
)


def assert_log_clean(cluster: Cluster, *extra: str) -> str:
    """The broker's log holds no crash marker (nor any of ``extra``); returns the log text."""
    assert cluster.broker is not None
    text = cluster.broker.log_text()
    for marker in (*CRASH_MARKERS, *extra):
        assert marker not in text, marker
    return text
