"""Start, stop and list a six-process tidemq cluster on this machine, from the TOML files beside it.

    python examples/cluster/cluster.py start     # namesrv-1, namesrv-2, broker-a-master, broker-b, broker-a-slave, proxy
    python examples/cluster/cluster.py status
    python examples/cluster/cluster.py stop                   # all, brokers first
    python examples/cluster/cluster.py stop broker-a-master   # one member (e.g. to see the slave serve reads)

Each member runs ``python -m tidemq <namesrv|broker> -c <member>.toml`` in the background, logs to
``<data-root>/logs/<member>.log`` and keeps its pid in ``<data-root>/run/<member>.pid``; brokers keep
their data in ``<data-root>/<member>`` (``--data-root``, default ``~/.tidemq/cluster``: the
``data_dir`` the files name).  ``--base-port N`` moves every port (NameServers N and N+1, broker-a
N+2 with its HA port N+3, the slave N+4, broker-b N+5, the gRPC proxy N+6), for a second cluster
beside the first.  The proxy (``tidemq proxy``, RocketMQ 5's cluster mode) is the one endpoint of
RocketMQ 5 clients (gRPC, 127.0.0.1:8081 by default) in front of both broker groups.

``start --secure`` runs the same cluster with every listener authenticated, as it must be once it
listens beyond loopback (tidemq refuses to start an open listener there: protected mode).  It
makes ``<data-root>/secrets/`` once (mode 0700, files 0600, random secrets):

* ``plain_acl.yml``: ``cluster-admin`` (admin: tools, and the brokers' own account) and
  ``cluster-app`` (send and consume); the brokers' ACL and the NameServers' ``credentials_file``;
* ``admin.secret``: cluster-admin's secret key, the brokers' ``[broker] secret_key_file``;
* ``ha.secret``: the HA shared secret of broker-a's master and slave.

and runs each member from ``<data-root>/conf/<member>.toml``: its TOML file plus those settings.
``python examples/cluster/cluster.py secrets`` makes (or shows the paths of) the secrets alone.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

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
    ("proxy", "proxy", 6, 2),
)
START_TIMEOUT_S = 60.0


ADMIN, APP = "cluster-admin", "cluster-app"


def make_secrets(data_root: Path) -> Path:
    """``<data-root>/secrets``, made once: the ACL accounts, the admin's secret, the HA secret."""
    root = data_root / "secrets"
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = {
        "admin.secret": lambda: secrets.token_urlsafe(24),
        "app.secret": lambda: secrets.token_urlsafe(24),
        "ha.secret": lambda: secrets.token_urlsafe(32),
    }
    for name, make in files.items():
        path = root / name
        if not path.exists():
            _write_private(path, make() + "\n")
    admin_sk, app_sk = ((root / n).read_text().strip() for n in ("admin.secret", "app.secret"))
    acl = root / "plain_acl.yml"
    if not acl.exists():
        _write_private(
            acl,
            "accounts:\n"
            f"  - accessKey: {ADMIN}\n    secretKey: {admin_sk}\n    admin: true\n"
            f"  - accessKey: {APP}\n    secretKey: {app_sk}\n    admin: false\n"
            "    defaultTopicPerm: PUB|SUB\n    defaultGroupPerm: PUB|SUB\n",
        )
    return root


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "w") as f:
        f.write(text)


def secure_config(member: str, kind: str, data_root: Path) -> Path:
    """``<data-root>/conf/<member>.toml``: the member's file plus authentication on every listener."""
    cfg: dict[str, Any] = tomllib.loads((HERE / f"{member}.toml").read_text())
    root = make_secrets(data_root)
    if kind == "namesrv":
        cfg.setdefault("namesrv", {})["credentials_file"] = str(root / "plain_acl.yml")
    elif kind == "proxy":
        pass  # its account comes from the environment (proxy_env)
    else:
        cfg["broker"].update(access_key=ADMIN, secret_key_file=str(root / "admin.secret"))
        cfg.setdefault("plugins", {})["acl"] = "plain"
        cfg.setdefault("acl", {})["plain"] = {"file": str(root / "plain_acl.yml")}
        if cfg["plugins"].get("replication") == "master_slave":
            table = cfg.setdefault("replication", {}).setdefault("master_slave", {})
            table["secret_file"] = str(root / "ha.secret")
    out = data_root / "conf" / f"{member}.toml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_toml(cfg))
    return out


def _toml(doc: dict[str, Any], prefix: str = "") -> str:
    """A TOML document of tables of strings, numbers, booleans and lists (what these files hold)."""
    lines, tables = [], []
    for key, value in doc.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")  # JSON strings, numbers, lists are TOML
    out = (f"[{prefix}]\n" if prefix and lines else "") + "".join(f"{line}\n" for line in lines)
    for key, value in tables:
        out += _toml(value, f"{prefix}.{key}" if prefix else key)
    return out


def command(
    member: str, kind: str, offset: int, data_root: Path, base_port: int | None, secure: bool = False
) -> list[str]:
    config = secure_config(member, kind, data_root) if secure else HERE / f"{member}.toml"
    args = [sys.executable, "-m", "tidemq", "--log-level", "INFO", kind, "-c", str(config)]
    if kind == "broker":
        args += ["--data-dir", str(data_root / member)]
    if base_port is not None:
        args += ["--listen", f"127.0.0.1:{base_port + offset}"]
        if kind in ("broker", "proxy"):
            args += ["--namesrv", f"127.0.0.1:{base_port};127.0.0.1:{base_port + 1}"]
    return args


def proxy_env(data_root: Path, secure: bool) -> dict[str, str] | None:
    """With the brokers' ACL on, the proxy signs its requests to them as the application account."""
    if not secure:
        return None
    root = make_secrets(data_root)
    secret = (root / "app.secret").read_text().strip()
    return {**os.environ, "TIDEMQ_ACCESS_KEY": APP, "TIDEMQ_SECRET_KEY": secret}


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


def start(data_root: Path, base_port: int | None, names: list[str], secure: bool = False) -> int:
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
                    command(member, kind, offset, data_root, base_port, secure),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C in this shell does not reach the cluster
                    env=proxy_env(data_root, secure) if kind == "proxy" else None,
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
    """SIGTERM (a clean stop: stores flushed, abort files removed), the proxy, the brokers, then the
    NameServers: a broker unregisters from the NameServers as it stops."""
    failed = 0
    for kinds in (("proxy",), ("broker",), ("namesrv",)):
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
    ap.add_argument("action", choices=("start", "stop", "status", "secrets"))
    ap.add_argument("members", nargs="*", help="only these members (default: all)")
    ap.add_argument("--data-root", default="~/.tidemq/cluster", help="data, logs and pid files")
    ap.add_argument("--base-port", type=int, help="move every port (see the module docstring)")
    ap.add_argument(
        "--secure",
        action="store_true",
        help="start: ACL, NameServer and HA authentication (<data-root>/secrets)",
    )
    args = ap.parse_args(argv)
    known = [m for m, *_ in MEMBERS]
    unknown = set(args.members) - set(known)
    if unknown:
        ap.error(f"unknown member(s) {', '.join(sorted(unknown))}; members: {', '.join(known)}")
    data_root = Path(args.data_root).expanduser()
    if args.action == "start":
        return start(data_root, args.base_port, args.members, args.secure)
    if args.action == "secrets":
        root = make_secrets(data_root)
        print(
            f"secrets in {root}: plain_acl.yml ({ADMIN}: admin, {APP}: send/consume), admin.secret, ha.secret"
        )
        return 0
    if args.action == "stop":
        return stop(data_root, args.members)
    return status(data_root)


if __name__ == "__main__":
    sys.exit(main())
