"""The cost of access control and TLS: send throughput with acl none vs plain vs plain+TLS.

Starts three NameServer+broker pairs (subprocesses on free loopback ports): no ACL; the plain
ACL (every request signed by the client and verified by the broker); the plain ACL over mutual
TLS (certificates made with the ``openssl`` command).  tidemq's asyncio producer sends
``--messages`` messages of ``--size`` bytes with ``--concurrency`` sends in flight to each, in
``--rounds`` interleaved rounds (the median counts: the machine is shared and noisy).  A
micro-benchmark also times signing (client) and validation (broker) of one SEND_MESSAGE_V2
in-process.  Prints one JSON object on stdout (progress on stderr); compare the ratios.

    python bench/acl_bench.py [--messages N] [--size BYTES] [--concurrency N] [--rounds N] [--full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchutil import free_port, start, stop

ACL = """\
accounts:
  - accessKey: bench-ak-1
    secretKey: bench-secret-1
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - AclBench=PUB|SUB
  - accessKey: bench-admin
    secretKey: bench-admin-secret
    admin: true
"""
CREDS = {"access_key": "bench-ak-1", "secret_key": "bench-secret-1"}


def log(msg: str) -> None:
    print(f"[acl_bench] {msg}", file=sys.stderr, flush=True)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(d: Path) -> dict[str, str]:
    """A CA and one certificate for 127.0.0.1 it signs (servers and client share it here)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"),
            "-out", str(d / "ca.crt"), "-days", "2", "-subj", "/CN=bench-ca")  # fmt: skip
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "node.key"), "-out",
            str(d / "node.csr"), "-subj", "/CN=bench-node")  # fmt: skip
    openssl("x509", "-req", "-in", str(d / "node.csr"), "-CA", str(d / "ca.crt"), "-CAkey",
            str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "node.crt"), "-days", "2",
            "-extfile", str(d / "ext"))  # fmt: skip
    return {
        "tls_cafile": str(d / "ca.crt"),
        "tls_certfile": str(d / "node.crt"),
        "tls_keyfile": str(d / "node.key"),
    }


class Setup:
    """One NameServer + broker configured for a variant."""

    def __init__(self, name: str, root: Path, *, acl: bool, tls: dict[str, str] | None) -> None:
        self.name = name
        d = root / name
        d.mkdir()
        transport = ""
        if tls:
            transport = "[transport.tcp]\ntls = true\n" + "".join(f'{k} = "{v}"\n' for k, v in tls.items())
        (d / "namesrv.toml").write_text(transport)
        self.namesrv = f"127.0.0.1:{free_port()}"
        self.namesrv_proc = start(["namesrv", "-c", str(d / "namesrv.toml"), "--listen", self.namesrv], d)
        broker_port = free_port()
        extra = ""
        if acl:
            (d / "plain_acl.yml").write_text(ACL)
            extra = f'[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{d / "plain_acl.yml"}"\n'
        (d / "broker.toml").write_text(
            f'[broker]\nname = "bench-{name}"\nlisten = "127.0.0.1:{broker_port}"\n'
            f'namesrv = ["{self.namesrv}"]\ndata_dir = "{d / "data"}"\n' + extra + transport
        )
        self.broker_proc = start(["broker", "-c", str(d / "broker.toml")], d)
        self.broker = f"127.0.0.1:{broker_port}"
        self.client_options: dict[str, Any] = {}
        if acl:
            self.client_options.update(CREDS)
        if tls:
            self.client_options["transport_options"] = {"tls": True, **tls}
        admin = ["--access-key", "bench-admin", "--secret-key", "bench-admin-secret"] if acl else []
        if tls:
            admin += ["--tls-cafile", tls["tls_cafile"], "--tls-certfile", tls["tls_certfile"]]
            admin += ["--tls-keyfile", tls["tls_keyfile"]]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidemq",
                "admin",
                "updateTopic",
                "-t",
                "AclBench",
                "-r",
                "4",
                "-w",
                "4",
                "-b",
                self.broker,
                "-n",
                self.namesrv,
                *admin,
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise SystemExit(f"updateTopic failed on {name}: {out.stderr}")

    def stop(self) -> None:
        stop(self.broker_proc)
        stop(self.namesrv_proc)


async def send_round(setup: Setup, n: int, size: int, concurrency: int) -> float:
    """Messages per second for ``n`` sends with ``concurrency`` in flight."""
    from tidemq.client import Message, Producer

    body = b"x" * size
    async with Producer(f"bench_pg_{setup.name}", namesrv=setup.namesrv, **setup.client_options) as producer:
        await producer.send(Message("AclBench", b"warmup"))  # route and connection stay out of the timing
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                result = await producer.send(Message("AclBench", body))
                if result.status.name != "SEND_OK":
                    raise SystemExit(f"send failed on {setup.name}: {result}")

        begin = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - begin)


def run(coro: Any) -> Any:
    """Run on uvloop when installed, as the servers do (asyncio's pure-Python TLS is much slower)."""
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def micro(iterations: int) -> dict[str, float]:
    """Microseconds per SEND_MESSAGE_V2 to sign (client) and to validate (broker), in-process."""
    from tidemq.client.credentials import SessionCredentials
    from tidemq.remoting.command import RemotingCommand
    from tidemq_acl.validator import PlainAccessValidator

    tmp = Path(tempfile.mkdtemp(prefix="acl_bench_micro_"))
    try:
        (tmp / "plain_acl.yml").write_text(ACL)
        validator = PlainAccessValidator(tmp / "plain_acl.yml")
        creds = SessionCredentials(CREDS["access_key"], CREDS["secret_key"])
        fields = {"a": "pg", "b": "AclBench", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1700000000000",
                  "h": "0", "i": "UNIQ_KEY\x01ABCDEF0123456789\x02WAIT\x01true\x02", "j": "0", "k": "false", "m": "false"}  # fmt: skip
        body = b"x" * 256
        reqs = [RemotingCommand.request(310, dict(fields), body) for _ in range(iterations)]
        begin = time.perf_counter()
        for r in reqs:
            creds.sign(r)
        sign_us = (time.perf_counter() - begin) / iterations * 1e6
        begin = time.perf_counter()
        for r in reqs:
            validator.validate(r, "127.0.0.1:40000")
        validate_us = (time.perf_counter() - begin) / iterations * 1e6
        return {"sign_us": round(sign_us, 2), "validate_us": round(validate_us, 2), "iterations": iterations}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=4000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=1.0, help="seconds of quiet before each run")
    p.add_argument("--full", action="store_true", help="20000 messages x 5 rounds")
    args = p.parse_args()
    if args.full:
        args.messages, args.rounds = 20000, 5
    if shutil.which("openssl") is None:
        raise SystemExit("acl_bench needs the openssl command for the TLS variant")
    root = Path(tempfile.mkdtemp(prefix="acl_bench_"))
    setups: list[Setup] = []
    try:
        tls = make_certs(root)
        for name, acl, t in (("none", False, None), ("plain", True, None), ("plain_tls", True, tls)):
            log(f"starting {name}")
            setups.append(Setup(name, root, acl=acl, tls=t))
        rates: dict[str, list[float]] = {s.name: [] for s in setups}
        for r in range(args.rounds):
            # Interleaved, so load from other users hits every variant alike; the order rotates
            # and each run waits for the previous broker's background flush and dispatch to settle.
            for s in setups[r % len(setups) :] + setups[: r % len(setups)]:
                time.sleep(args.settle)
                rate = run(send_round(s, args.messages, args.size, args.concurrency))
                rates[s.name].append(rate)
                log(f"round {r + 1}/{args.rounds} {s.name}: {rate:.0f} msg/s")
        med = {k: statistics.median(v) for k, v in rates.items()}
        result = {
            "benchmark": "acl_bench",
            "client_loop": "uvloop" if _has_uvloop() else "asyncio",
            "messages": args.messages,
            "size": args.size,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "send_msgs_per_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "median_msgs_per_s": {k: round(v, 1) for k, v in med.items()},
            "ratio_plain_vs_none": round(med["plain"] / med["none"], 3),
            "ratio_plain_tls_vs_none": round(med["plain_tls"] / med["none"], 3),
            "ratio_plain_tls_vs_plain": round(med["plain_tls"] / med["plain"], 3),
            "spread": {k: round((max(v) - min(v)) / statistics.median(v), 3) for k, v in rates.items()},
            "micro": micro(20000),
        }
        print(json.dumps(result, indent=2))
    finally:
        for s in setups:
            s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
