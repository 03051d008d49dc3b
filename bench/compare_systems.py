"""The systems ``bench/compare.py`` measures: start, stop and watch each server on loopback.

Every server runs as a child process with its data in a temporary directory; the script reads its
RSS and CPU time from ``/proc`` so the report can set server CPU beside load-generator CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 once it has gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class CpuSample:
    """A process's CPU so far, read two ways.

    ``ticks_s`` (``/proc/<pid>/stat``) counts every thread, exited ones too, but in 10 ms ticks;
    ``sched_ns`` sums ``/proc/<pid>/task/*/schedstat`` (nanoseconds) over the live threads only.
    """

    ticks_s: float
    sched_ns: int
    tids: frozenset[int]


def cpu_sample(pid: int) -> CpuSample:
    total, tids = 0, []
    try:
        names = os.listdir(f"/proc/{pid}/task")
    except OSError:
        names = []
    for name in names:
        try:
            with open(f"/proc/{pid}/task/{name}/schedstat") as f:
                total += int(f.read().split()[0])
            tids.append(int(name))
        except (OSError, IndexError, ValueError):
            continue  # the thread ended between listdir and open
    return CpuSample(cpu_seconds(pid), total, frozenset(tids))


#: Below this many CPU-seconds counted in ticks, a per-CPU figure is off by more than 1 %.
MIN_TICK_CPU_S = 1.0


def cpu_between(a: CpuSample, b: CpuSample) -> dict[str, Any]:
    """Server CPU between two samples: nanosecond schedstat when no thread was lost in between,
    else ticks; ``reliable`` is False when ticks had to serve for less than MIN_TICK_CPU_S."""
    ticks = b.ticks_s - a.ticks_s
    sched = (b.sched_ns - a.sched_ns) / 1e9
    # A thread that ran and ended between the samples is missing from the schedstat sum; the tick
    # count (which keeps it) then exceeds the sum by more than its own rounding (2 ticks/thread).
    lost = not a.tids <= b.tids or ticks > sched + 0.02 * max(1, len(b.tids))
    if not lost:
        return {"cpu_s": sched, "method": "schedstat", "reliable": sched > 0}
    return {"cpu_s": ticks, "method": "ticks", "reliable": ticks >= MIN_TICK_CPU_S}


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it listened on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def missing_tools() -> list[str]:
    """Install hints for the peer servers and clients compare.py needs but cannot find."""
    hints = []
    for exe, pkg in (
        ("nats-server", "nats-server"),
        ("redis-server", "redis-server"),
        ("redis-benchmark", "redis-tools"),
    ):
        if shutil.which(exe) is None:
            hints.append(f"{exe} not found: apt-get install -y {pkg}")
    for mod, pip in (("nats", "nats-py"), ("redis", "redis"), ("hiredis", "hiredis")):
        try:
            __import__(mod)
        except ImportError:
            hints.append(f"python module {mod!r} not found: pip install -e '.[bench]' (or pip install {pip})")
    return hints


@dataclass
class Server:
    """One running system under test."""

    name: str  # the column name in the report, e.g. "tidemq_async"
    kind: str  # tidemq | redis | nats
    durability: str  # "async" or "sync": the pairing this configuration belongs to
    describe: str  # what exactly runs (configuration, durability caveats)
    work: Path
    proc: subprocess.Popen[bytes] | None = None
    addr: str = ""  # where the load generators connect (broker / redis / nats)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> int:
        return rss_bytes(self.proc.pid) if self.proc is not None else 0

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid) if self.proc is not None else 0.0

    def cpu_sample(self) -> CpuSample:
        return cpu_sample(self.proc.pid) if self.proc is not None else CpuSample(0.0, 0, frozenset())

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# --------------------------------------------------------------------------- tidemq


def start_tidemq(
    work: Path,
    flush: str,
    extra_toml: str = "",
    *,
    command: Callable[[list[str]], list[str]] | None = None,
    pythonpath: str = "",
    describe: str = "",
) -> Server:
    """``python -m tidemq standalone`` with the default plugins and the given flush policy
    (``extra_toml`` is appended to its config: plugin option tables for A/B runs).

    ``command`` turns the CLI arguments into the process to start (default ``python -m tidemq
    ARGS``; the tracers start it inside an instrumented interpreter), ``pythonpath`` puts an older
    tree first (B of an A/B), ``describe`` replaces the default description.
    """
    work.mkdir(parents=True, exist_ok=True)
    ns_port, broker_port = free_port(), free_port()
    cfg = work / "tidemq.toml"
    cfg.write_text(f'[plugins]\nflush = "{flush}"\n{extra_toml}\n')
    argv = [
        "--log-level",
        "WARNING",
        "standalone",
        "-c",
        str(cfg),
        "--data-dir",
        str(work / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{ns_port}",
        "--broker-listen",
        f"127.0.0.1:{broker_port}",
    ]
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    log = open(work / "tidemq.log", "ab")
    proc = subprocess.Popen(
        command(argv) if command is not None else [sys.executable, "-m", "tidemq", *argv],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=work,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    broker = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            break
        if line.startswith("tidemq broker listening on "):
            broker = line.rsplit(" ", 1)[1].strip()
            break
    if not broker:
        proc.kill()
        raise RuntimeError(f"tidemq standalone did not start; see {work / 'tidemq.log'}")
    # Drain stdout so a chatty broker never blocks on a full pipe.
    subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
    what = (
        "async flush (page cache, flushed every 500 ms)"
        if flush == "async"
        else "sync flush (group commit: each send answered after its fdatasync)"
    )
    return Server(
        name=f"tidemq_{flush}",
        kind="tidemq",
        durability=flush,
        describe=describe or f"tidemq standalone, mmap store, {what}",
        work=work,
        proc=proc,
        addr=broker,
        extra={"namesrv": f"127.0.0.1:{ns_port}"},
    )


def create_tidemq_topic(server: Server, topic: str, queues: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-n", server.extra["namesrv"]]
        + ["-t", topic, "-r", str(queues), "-w", str(queues)],
        check=True,
        capture_output=True,
        timeout=60,
    )


# --------------------------------------------------------------------------- redis


def start_redis(work: Path, fsync: str) -> Server:
    """redis-server with AOF on: ``appendfsync everysec`` (async pairing) or ``always`` (sync)."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work)]
        + ["--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no"]
        + ["--logfile", str(work / "redis.log"), "--protected-mode", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=work,
    )
    wait_port(port, 30, proc)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    ver = next((v.split("=")[1] for v in version if v.startswith("v=")), "?")
    return Server(
        name=f"redis_{fsync}",
        kind="redis",
        durability="async" if fsync == "everysec" else "sync",
        describe=f"redis-server {ver} Streams (XADD), appendonly yes, appendfsync {fsync}",
        work=work,
        proc=proc,
        addr=f"127.0.0.1:{port}",
    )


# --------------------------------------------------------------------------- nats


def nats_version() -> str:
    out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True).stdout
    return out.strip().rsplit(" ", 1)[-1]


def nats_supports_sync(work: Path) -> bool:
    """Whether this nats-server accepts ``jetstream { sync_interval: always }`` (2.10+ does)."""
    work.mkdir(parents=True, exist_ok=True)
    conf = work / "probe.conf"
    conf.write_text(f'jetstream {{ store_dir: "{work / "probe"}", sync_interval: always }}\n')
    out = subprocess.run(["nats-server", "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0


def start_nats(work: Path, sync: bool) -> Server:
    """nats-server with JetStream file storage; ``sync`` asks for an fsync per write when supported."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    version = nats_version()
    sync_ok = sync and nats_supports_sync(work / "probe")
    sync_line = "sync_interval: always" if sync_ok else ""
    conf = work / "nats.conf"
    conf.write_text(
        f"listen: 127.0.0.1:{port}\nmax_payload: 8MB\n"
        f'jetstream {{ store_dir: "{work / "js"}", max_file_store: 20GB, max_memory_store: 1GB {sync_line} }}\n'
    )
    proc = subprocess.Popen(
        ["nats-server", "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "nats.log", "ab"),
        cwd=work,
    )
    wait_port(port, 30, proc)
    if sync_ok:
        how = "sync_interval: always (fsync per write)"
    elif sync:
        how = (
            f"NO per-write fsync: nats-server {version} rejects sync_interval (added in 2.10); "
            "its file store syncs on a timer, so this row is NOT equal durability"
        )
    else:
        how = "default file-store syncing (timer-based fsync)"
    return Server(
        name="nats_sync" if sync else "nats_default",
        kind="nats",
        durability="sync" if sync else "async",
        describe=f"nats-server {version} JetStream, file storage, 1 replica, {how}",
        work=work,
        proc=proc,
        addr=f"127.0.0.1:{port}",
        extra={"fsync_per_write": sync_ok},
    )


def create_nats_stream(server: Server, stream: str, subject: str) -> None:
    """A file-storage stream (via nats-py, the only JetStream admin client here)."""
    import asyncio

    import nats
    from nats.js.api import StorageType, StreamConfig

    async def run() -> None:
        nc = await nats.connect(f"nats://{server.addr}")
        try:
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name=stream, subjects=[subject], storage=StorageType.FILE))
        finally:
            await nc.close()

    asyncio.run(run())


def start(kind: str, durability: str, work: Path) -> Server:
    if kind == "tidemq":
        return start_tidemq(work, durability)
    if kind == "redis":
        return start_redis(work, "everysec" if durability == "async" else "always")
    if kind == "nats":
        return start_nats(work, durability == "sync")
    raise ValueError(f"unknown system {kind!r}")


def dump(server: Server) -> str:
    return json.dumps({"name": server.name, "describe": server.describe, "addr": server.addr})


def create_nats_consumer(server: Server, stream: str, durable: str) -> None:
    """A durable pull consumer without acks (like a tidemq pull or an XREAD: nothing to ack)."""
    import asyncio

    import nats
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def run() -> None:
        nc = await nats.connect(f"nats://{server.addr}")
        try:
            await nc.jetstream().add_consumer(
                stream,
                ConsumerConfig(
                    durable_name=durable, ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL
                ),
            )
        finally:
            await nc.close()

    asyncio.run(run())


def tidemq_max_offsets(server: Server, topic: str, queues: int) -> list[int]:
    """GET_MAX_OFFSET of each queue of ``topic``."""
    import asyncio

    from tidemq.admin import AdminClient
    from tidemq.remoting.codes import RequestCode

    async def run() -> list[int]:
        credentials = None
        if os.environ.get("TIDEMQ_ACCESS_KEY"):  # compare_ab.py --acl: the broker checks signatures
            from tidemq.client.credentials import SessionCredentials

            credentials = SessionCredentials(os.environ["TIDEMQ_ACCESS_KEY"], os.environ["TIDEMQ_SECRET_KEY"])
        client = AdminClient(server.extra["namesrv"], credentials=credentials)
        try:
            out = []
            for q in range(queues):
                resp = await client.call(
                    server.addr, RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": q}
                )
                out.append(int(resp.ext_fields["offset"]))
            return out
        finally:
            await client.close()

    return asyncio.run(run())


def redis_lengths(server: Server, keys: list[str]) -> list[int]:
    import redis

    host, port = server.addr.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port))
    try:
        return [int(r.xlen(k)) for k in keys]
    finally:
        r.close()


_NATS_GEN: dict[str, Any] = {}


def nats_generator(build_dir: Path) -> tuple[str | None, str]:
    """Build ``bench/nats_gen`` (Go, nats.go from Debian's packages, GOPATH mode) once per run.

    Returns (path, "") or (None, why not): without it NATS's produce is driven by compare_load.py
    and flagged when generator-bound.
    """
    if "result" in _NATS_GEN:
        return _NATS_GEN["result"]
    src = Path(__file__).resolve().parent / "nats_gen" / "main.go"
    gopath = "/usr/share/gocode"
    result: tuple[str | None, str]
    if shutil.which("go") is None:
        result = (None, "go not found: apt-get install -y golang-go golang-github-nats-io-go-nats-dev")
    elif not Path(gopath, "src/github.com/nats-io/nats.go").is_dir():
        result = (None, "nats.go not found: apt-get install -y golang-github-nats-io-go-nats-dev")
    else:
        build_dir.mkdir(parents=True, exist_ok=True)
        out = build_dir / "nats_gen"
        env = {**os.environ, "GOPATH": gopath, "GO111MODULE": "off", "GOCACHE": str(build_dir / "gocache")}
        done = subprocess.run(
            ["go", "build", "-o", str(out), str(src)], capture_output=True, text=True, env=env, timeout=600
        )
        if done.returncode != 0:
            result = (None, f"go build failed: {done.stderr.strip()[-300:]}")
        else:
            result = (str(out), "")
    _NATS_GEN["result"] = result
    return result
