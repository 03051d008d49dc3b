"""Start, stop and list a five-process tidemq cluster on this machine, from the TOML files beside it.

    python examples/cluster/cluster.py start     # namesrv-1, namesrv-2, broker-a-master, broker-b, broker-a-slave
    python examples/cluster/cluster.py status
    python examples/cluster/cluster.py stop                   # all, brokers first
    python examples/cluster/cluster.py stop broker-a-master   # one member (e.g. to see the slave serve reads)

Each member runs ``python -m tidemq <namesrv|broker> -c <member>.toml`` in the background, logs to
``<data-root>/logs/<member>.log`` and keeps its pid in ``<data-root>/run/<member>.pid``; brokers keep
their data in ``<data-root>/<member>`` (``--data-root``, default ``~/.tidemq/cluster``: the
``data_dir`` the files name).  ``--base-port N`` moves every port (NameServers N and N+1, broker-a
N+2 with its HA port N+3, the slave N+4, broker-b N+5), for a second cluster beside the first.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (member, command, offset from --base-port, wave), in start order; stopped in reverse.  A wave
#: starts together once the one before listens: the slave comes after its master, whose
#: registration tells the NameServers the HA address the slave connects to.
MEMBERS: tuple[tuple[str, str, int, int], ...] = (
    ("namesrv-1", "namesrv", 0, 0),
    ("namesrv-2", "namesrv", 1, 0),
    ("broker-a-master", "broker", 2, 1),  # its HA port is the next one (3)
    ("broker-b", "broker", 5, 1),
    ("broker-a-slave", "broker", 4, 2),
)
START_TIMEOUT_S = 60.0


def command(member: str, kind: str, offset: int, data_root: Path, base_port: int | None) -> list[str]:
    args = [sys.executable, "-m", "tidemq", "--log-level", "INFO", kind, "-c", str(HERE / f"{member}.toml")]
    if kind == "broker":
        args += ["--data-dir", str(data_root / member)]
    if base_port is not None:
        args += ["--listen", f"127.0.0.1:{base_port + offset}"]
        if kind == "broker":
            args += ["--namesrv", f"127.0.0.1:{base_port};127.0.0.1:{base_port + 1}"]
    return args


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid(data_root: Path, member: str) -> int | None:
    try:
        pid = int((data_root / "run" / f"{member}.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _listening(log: Path, kind: str) -> str | None:
    """The address a member announced in its log, once it did."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    marker = f"tidemq {kind} listening on "
    for line in text.splitlines():
        if line.startswith(marker):
            return line[len(marker) :].strip()
    return None


def start(data_root: Path, base_port: int | None, names: list[str]) -> int:
    (data_root / "logs").mkdir(parents=True, exist_ok=True)
    (data_root / "run").mkdir(parents=True, exist_ok=True)
    started: list[str] = []
    for wave in sorted({w for *_, w in MEMBERS}):
        launched: list[tuple[str, str, subprocess.Popen[bytes], Path]] = []
        for member, kind, offset, w in MEMBERS:
            if w != wave or (names and member not in names):
                continue
            running = _pid(data_root, member)
            if running is not None:
                print(f"{member}: already running (pid {running})")
                continue
            log = data_root / "logs" / f"{member}.log"
            with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
                proc = subprocess.Popen(
                    command(member, kind, offset, data_root, base_port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C in this shell does not reach the cluster
                )
            (data_root / "run" / f"{member}.pid").write_text(str(proc.pid))
            launched.append((member, kind, proc, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        for member, kind, proc, log in launched:
            address = _listening(log, kind)
            while address is None and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                address = _listening(log, kind)
            if address is None:
                tail = log.read_text(errors="replace").strip().splitlines()[-5:]
                print(f"{member}: did not start; the end of {log}:", *tail, sep="\n  ", file=sys.stderr)
                stop(data_root, started + [m for m, *_ in launched])
                return 1
            started.append(member)
            print(f"{member}: {kind} listening on {address} (pid {proc.pid}, log {log})")
    return 0


def stop(data_root: Path, names: list[str], timeout: float = 30.0) -> int:
    """SIGTERM (a clean stop: stores flushed, abort files removed), brokers first, then NameServers:
    a broker unregisters from the NameServers as it stops."""
    failed = 0
    for kinds in (("broker",), ("namesrv",)):
        waiting: dict[str, int] = {}
        for member, kind, _offset, _wave in reversed(MEMBERS):
            pid = _pid(data_root, member) if kind in kinds and (not names or member in names) else None
            if pid is not None:
                os.kill(pid, signal.SIGTERM)
                waiting[member] = pid
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            for member, pid in list(waiting.items()):
                try:  # our own child when this process started it: reap it
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if not _alive(pid):
                    del waiting[member]
                    (data_root / "run" / f"{member}.pid").unlink(missing_ok=True)
                    print(f"{member}: stopped")
            time.sleep(0.1)
        for member, pid in waiting.items():
            print(f"{member}: still running {timeout:g} s after SIGTERM (pid {pid})", file=sys.stderr)
            failed = 1
    return failed


def status(data_root: Path) -> int:
    for member, kind, _offset, _wave in MEMBERS:
        pid = _pid(data_root, member)
        where = _listening(data_root / "logs" / f"{member}.log", kind) if pid else None
        print(f"{member:<16} {'running, pid ' + str(pid) + ', ' + str(where) if pid else 'stopped'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("start", "stop", "status"))
    ap.add_argument("members", nargs="*", help="only these members (default: all)")
    ap.add_argument("--data-root", default="~/.tidemq/cluster", help="data, logs and pid files")
    ap.add_argument("--base-port", type=int, help="move every port (see the module docstring)")
    args = ap.parse_args(argv)
    known = [m for m, *_ in MEMBERS]
    unknown = set(args.members) - set(known)
    if unknown:
        ap.error(f"unknown member(s) {', '.join(sorted(unknown))}; members: {', '.join(known)}")
    data_root = Path(args.data_root).expanduser()
    if args.action == "start":
        return start(data_root, args.base_port, args.members)
    if args.action == "stop":
        return stop(data_root, args.members)
    return status(data_root)


if __name__ == "__main__":
    sys.exit(main())
