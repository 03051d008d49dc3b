"""Broker CPU per send: RocketMQ 5 clients over gRPC vs 4.x clients over remoting, in one run.

    .venv/bin/python bench/grpc_bench.py [--count 2000] [--repeats 3] [--body 1024] [--out FILE]

``tidemq namesrv`` and a ``tidemq broker`` with ``[transport.grpc]`` run as subprocesses (and a
second pair without it, below).  Each round sends ``--count`` messages of ``--body`` bytes, synchronously, one at a time, with

* ``grpc``: the official ``rocketmq-python-client==5.1.2`` (its own venv, made once under
  ``~/.cache/tidemq``, as tests/compat/test_grpc_official.py makes it), and
* ``remoting``: the official ``rocketmq==0.4.4`` (C++ client, from tidemq's venv), to the same
  broker,

and, for the event loop's sake, ``remoting_no_grpc_endpoint``: the same 4.x sends to a second
broker without the gRPC endpoint (does grpcio's poller thread slow a broker's remoting clients?),
the three alternating ``--repeats`` times (the machine is shared: compare the figures of one run).
The broker's CPU time (user + system, every thread: grpcio's included) is read from /proc between
the client's go and its end; the figure is messages per broker CPU-second, median of the rounds.
For scale, ``grpc_aio_echo_floor`` is a bare ``grpc.aio`` server echoing the same bodies (no
broker at all), measured the same way: what grpcio's asyncio server costs per call by itself.
Each round also reports ``broker_threads_cpu_s``, the broker's CPU by thread name (the event
loop's thread is the process's, ``python``, with grpcio's completion-queue poller; grpcio's
``event_engine`` threads), and ``--profile DIR`` has py-spy sample the broker in each path's
first round (collapsed stacks; the CPU figures of that round include py-spy's stops).
One JSON document on stdout (and in ``--out``), progress on stderr.

``--server grpcio|native|both`` (default both): the ``[transport.grpc] server`` of the broker
measured; with both, a broker each in the same run, the v5 path named ``grpc`` (grpcio) and
``grpc_native``, and 0.4.4's sends to each broker (``remoting``, ``remoting_native_broker``) the
ratios' denominators (``ratios`` in the JSON).

``--workload receive`` measures consumption instead, on one broker with the endpoint: ``--count``
messages of ``--body`` bytes are stored once, then each round reads them all with a consumer group
of its own, alternating

* ``grpc``: the official v5 ``SimpleConsumer`` (tests/compat/v5_consume_client.py
  ``bench-receive``): ``receive(32, 30)`` and one ``ack`` per message, as its README shows;
* ``remoting_pop``: tidemq's own POP client (``tidemq.client.SimpleConsumer``, remoting
  POP_MESSAGE/ACK_MESSAGE): receive 32, ack each (the acks of a batch sent together: the broker
  takes those of one read with one revive-log record);
* ``remoting_pop_ack1``: the same, each ACK_MESSAGE awaited before the next (one call per message,
  as the v5 SimpleConsumer acks, and as POP push consumers ack one message at a time): the
  like-for-like baseline of ``grpc``;
* ``remoting_pull``: tidemq's ``PullConsumer``, 32 per PULL_MESSAGE, no acks (the 4.x path);

as messages per broker CPU-second, and for scale ``grpc_aio_receive_floor``: the bare
``grpc.aio`` server answering the same calls (per 32 messages a stream of 34 writes and 32 unary
calls), what grpcio costs for this workload with no broker behind it.

``--paced`` adds ``remoting_pop_ack1_paced`` after each v5 round: ``remoting_pop_ack1`` held to
the v5 client's pace of that round (its seconds per message; the client sleeps before each ack),
so the broker idles between acks as it does with the v5 client: the same work at the same pace.
``paired_ratios`` divides each round's v5 figure by the same round's baselines (median, min,
max).  ``--paths a,b`` measures only those paths; ``--no-floor`` skips the grpc.aio floor;
``--profile-mode cpu|gil|idle`` picks py-spy's sampling for ``--profile``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "compat"))
V5_WORKER = ROOT / "tests" / "compat" / "v5_client.py"
V5_CONSUMER = ROOT / "tests" / "compat" / "v5_consume_client.py"
#: The paths' names by [transport.grpc] server: the v5 client's, and 4.x's to the same broker.
GRPC_PATH = {"grpcio": "grpc", "native": "grpc_native"}
REMOTING_PATH = {"grpcio": "remoting", "native": "remoting_native_broker"}
TOPIC = "GrpcBench"

V4_WORKER = """
import json, sys, time
from rocketmq.client import Message, Producer
namesrv, topic, count, body = sys.argv[1], sys.argv[2], int(sys.argv[3]), b"x" * int(sys.argv[4])
producer = Producer("grpc-bench", timeout=5000)
producer.set_namesrv_addr(namesrv)
producer.start()
msg = Message(topic); msg.set_body(body); producer.send_sync(msg)  # route known before go
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic(); failed = 0
for _ in range(count):
    msg = Message(topic); msg.set_body(body)
    try:
        if int(producer.send_sync(msg).status) != 0: failed += 1
    except Exception:
        failed += 1
print(json.dumps({"sent": count - failed, "failed": failed, "seconds": time.monotonic() - started}), flush=True)
sys.stdin.readline()
producer.shutdown()
"""


#: The remoting consumers of the receive workload (tidemq's own clients), with the same ready/go lines.
REMOTING_CONSUMER = """
import asyncio, json, sys, time
from tidemq.client import PullConsumer
from tidemq.client.simple_consumer import SimpleConsumer
kind, namesrv, topic, group, count = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
pace = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0  # pop1: seconds per message at least

def wait_go():
    print("ready", flush=True)
    sys.stdin.readline()

async def pop():
    async with SimpleConsumer(group, namesrv, subscriptions={topic: "*"}, consume_from="first",
                              await_duration=1) as c:
        await c.receive(1, 1, 0)  # the route, before go (the message comes back in 1 s)
        await asyncio.sleep(1.2)
        await asyncio.get_running_loop().run_in_executor(None, wait_go)
        started, got, idle, done = time.monotonic(), 0, 0, 0
        while got < count and idle < 5:
            msgs = await c.receive(32, 60, 1)
            if not msgs:
                idle += 1
                continue
            got += len(msgs)
            if kind == "pop1":  # one ACK_MESSAGE per message, each awaited (as the v5 client acks)
                for m in msgs:
                    if pace:  # no faster than the v5 client: the broker idles between acks as with it
                        due = started + (done + 1) * pace - time.monotonic()
                        if due > 0:
                            time.sleep(due)
                    await c.ack(m)
                    done += 1
            else:
                await asyncio.gather(*(c.ack(m) for m in msgs))
        return got, time.monotonic() - started

async def pull():
    async with PullConsumer(group, namesrv) as pc:
        queues = await pc.fetch_subscribe_queues(topic)
        offsets = {mq: 0 for mq in queues}
        await asyncio.get_running_loop().run_in_executor(None, wait_go)
        started, got = time.monotonic(), 0
        while got < count:
            progressed = False
            for mq in queues:
                r = await pc.pull(mq, "*", offsets[mq], 32)
                if r.messages:
                    got += len(r.messages)
                    offsets[mq] = r.next_begin_offset
                    progressed = True
            if not progressed:
                break
        return got, time.monotonic() - started

got, seconds = asyncio.run(pull() if kind == "pull" else pop())
print(json.dumps({"sent": got, "failed": count - got, "seconds": seconds}), flush=True)
sys.stdin.readline()
"""

PREFILL = """
import asyncio, sys
from tidemq.client import Message, Producer
namesrv, topic, count, body = sys.argv[1], sys.argv[2], int(sys.argv[3]), b"x" * int(sys.argv[4])
async def main():
    async with Producer("grpc-bench-fill", namesrv=namesrv) as p:
        sem = asyncio.Semaphore(64)
        async def one():
            async with sem:
                await p.send(Message(topic, body))
        await asyncio.gather(*(one() for _ in range(count)))
asyncio.run(main())
"""


#: grpcio's own floor: a grpc.aio server that echoes 1 KiB, nothing else (no broker), for scale.
ECHO_SERVER = """
import asyncio, grpc
async def echo(request, context):
    return request
async def batch(request, context):  # a ReceiveMessage's answer: a status, the messages, a time
    for _ in range(int(request) + 2):
        yield b"x" * 1024
async def main():
    server = grpc.aio.server()
    table = {
        "Echo": grpc.unary_unary_rpc_method_handler(echo),
        "Batch": grpc.unary_stream_rpc_method_handler(batch),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Echo", table),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""


def echo_floor(count: int, body: int) -> dict[str, Any]:
    """Calls per server CPU-second of a bare grpc.aio echo server, sync unary calls one at a time."""
    import grpc

    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/bench.Echo/Echo")
            payload = b"x" * body
            for _ in range(100):
                echo(payload)
            before, started = cpu_seconds(server.pid), time.monotonic()
            for _ in range(count):
                echo(payload)
            cpu, seconds = cpu_seconds(server.pid) - before, time.monotonic() - started
    finally:
        server.kill()
        server.wait()
    return {
        "calls": count,
        "server_cpu_s": round(cpu, 3),
        "calls_per_server_cpu_s": round(count / max(cpu, 1e-3), 1),
        "calls_per_s": round(count / seconds, 1),
    }


def receive_floor(count: int, batch: int = 32) -> dict[str, Any]:
    """The receive workload's grpcio floor: per ``batch`` messages, one server stream of
    ``batch + 2`` 1 KiB writes (as ReceiveMessage answers) and ``batch`` unary calls of ~200
    bytes (as AckMessage), against the bare echo server; messages per server CPU-second."""
    import grpc

    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/bench.Echo/Echo")
            stream = channel.unary_stream("/bench.Echo/Batch")
            ack, size = b"a" * 200, str(batch).encode()
            for _ in range(3):
                list(stream(size))
                echo(ack)
            rounds = max(count // batch, 1)
            before = cpu_seconds(server.pid)
            for _ in range(rounds):
                list(stream(size))
                for _ in range(batch):
                    echo(ack)
            cpu = cpu_seconds(server.pid) - before
    finally:
        server.kill()
        server.wait()
    return {
        "messages": rounds * batch,
        "server_cpu_s": round(cpu, 3),
        "msgs_per_server_cpu_s": round(rounds * batch / max(cpu, 1e-3), 1),
    }


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each of a process's threads, by thread name (threads of one name summed)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tidemq", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if " listening on " in line:
            return proc, line.rsplit(" ", 1)[1].strip()
    proc.kill()
    raise RuntimeError(f"{args} did not start")


def wait_listening(address: str) -> None:
    host, port = address.rsplit(":", 1)
    for _ in range(200):
        try:
            socket.create_connection((host, int(port)), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {address}")


def py_spy() -> str | None:
    """py-spy, when this machine has it (``--profile``)."""
    import shutil

    return os.environ.get("PY_SPY") or shutil.which("py-spy")


def one_round(
    cmd: list[str], broker_pid: int, profile: Path | None = None, profile_mode: str = "idle"
) -> dict[str, Any]:
    """One client run against a broker: its JSON line plus the broker's CPU seconds meanwhile;
    with ``profile``, py-spy samples the broker (collapsed stacks, subprocesses' native frames
    included) into that file for the run."""
    client = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert client.stdin is not None and client.stdout is not None
    try:
        line = client.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"client did not start: {line!r}")
        spy = None
        if profile is not None and (tool := py_spy()):
            spy = subprocess.Popen(
                [
                    tool,
                    "record",
                    "--pid",
                    str(broker_pid),
                    "--format",
                    "raw",
                    "--threads",
                    *{"idle": ["--idle"], "cpu": [], "gil": ["--gil"]}[profile_mode],
                    "--rate",
                    "250",
                    "--output",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # attached
        before, threads = cpu_seconds(broker_pid), thread_cpu(broker_pid)
        client.stdin.write("go\n")
        client.stdin.flush()
        result: dict[str, Any] = json.loads(client.stdout.readline())
        result["broker_cpu_s"] = round(cpu_seconds(broker_pid) - before, 3)
        # Where it went, by thread: the event loop (the process's own name), grpcio's poller
        # and event_engine threads, the store's.
        spent = {n: c - threads.get(n, 0.0) for n, c in thread_cpu(broker_pid).items()}
        result["broker_threads_cpu_s"] = {n: round(c, 3) for n, c in sorted(spent.items()) if c > 0}
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        client.stdin.write("done\n")
        client.stdin.flush()
        client.wait(60)
    finally:
        if client.poll() is None:
            client.kill()
    result["msgs_per_broker_cpu_s"] = round(result["sent"] / max(result["broker_cpu_s"], 1e-3), 1)
    result["msgs_per_s"] = round(result["sent"] / max(result["seconds"], 1e-6), 1)
    result["load_1m"] = round(os.getloadavg()[0], 2)
    return result


def profiled(args: argparse.Namespace, path: str, r: int) -> Path | None:
    if args.profile is None or r:
        return None
    args.profile.mkdir(parents=True, exist_ok=True)
    return args.profile / f"{args.workload}_{path}.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--body", type=int, default=1024)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--workload", choices=["send", "receive"], default="send")
    ap.add_argument(
        "--server",
        choices=["grpcio", "native", "both"],
        default="both",
        help="[transport.grpc] server of the brokers measured (both: a broker each, in one run)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a directory: py-spy samples the broker during each path's first round "
        "(its CPU figures then include py-spy's stops: profile, or measure)",
    )
    ap.add_argument(
        "--paths",
        default="",
        help="comma-separated: measure only these paths (e.g. grpc_native,remoting_pop_native_broker_ack1)",
    )
    ap.add_argument(
        "--profile-mode",
        choices=["idle", "cpu", "gil"],
        default="idle",
        help="py-spy's samples: every thread's wall time (idle), on-CPU only (cpu), or the GIL holder (gil)",
    )
    ap.add_argument(
        "--paced",
        action="store_true",
        help="receive: after each v5 round, remoting POP acking one at a time at the v5 client's pace (_ack1_paced)",
    )
    ap.add_argument("--no-floor", action="store_true", help="skip the bare grpc.aio floor")
    args = ap.parse_args()

    import v5_venv  # tests/compat: the same venv the compat test makes

    try:
        v5_python = v5_venv.v5_python()
    except v5_venv.Unavailable as exc:
        sys.exit(f"grpc_bench.py: {exc}")
    procs: list[subprocess.Popen[bytes]] = []

    def cluster(work: Path, name: str, with_grpc: bool, server: str = "grpcio") -> tuple[int, str, str]:
        """A NameServer and a broker of its own: (broker pid, NameServer address, gRPC address)."""
        namesrv, namesrv_addr = start(["namesrv", "--listen", "127.0.0.1:0"], work)
        procs.append(namesrv)
        grpc_addr = f"127.0.0.1:{free_port()}"
        toml = (
            f'[broker]\nname = "{name}"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = ["{namesrv_addr}"]\n'
            f'data_dir = "{work / name}"\n'
        )
        if with_grpc:
            toml += f'[transport.grpc]\nlisten = "{grpc_addr}"\nserver = "{server}"\n'
        (work / f"{name}.toml").write_text(toml)
        broker, _ = start(["broker", "-c", str(work / f"{name}.toml")], work)
        procs.append(broker)
        if with_grpc:
            wait_listening(grpc_addr)
        subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-t", TOPIC, "-n", namesrv_addr],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return broker.pid, namesrv_addr, grpc_addr

    def v4(namesrv_addr: str) -> list[str]:
        return [sys.executable, "-c", V4_WORKER, namesrv_addr, TOPIC, str(args.count), str(args.body)]

    servers = ["grpcio", "native"] if args.server == "both" else [args.server]
    if args.workload == "receive":
        receive_workload(args, v5_python, cluster, procs, servers)
        return

    with tempfile.TemporaryDirectory(prefix="grpc-bench-") as tmp:
        work = Path(tmp)
        try:
            commands: dict[str, tuple[list[str], int]] = {}
            for server in servers:
                pid, namesrv_addr, grpc_addr = cluster(work, f"with-{server}", True, server)
                v5 = [str(v5_python), str(V5_WORKER), "bench", "--endpoints", grpc_addr, "--topic", TOPIC]
                commands[GRPC_PATH[server]] = (
                    [*v5, "--count", str(args.count), "--body", str(args.body)],
                    pid,
                )
                # 4.x sends to the same broker: the ratio's denominator
                commands[REMOTING_PATH[server]] = (v4(namesrv_addr), pid)
            plain_pid, plain_namesrv, _ = cluster(work, "without-grpc", False)
            # The same 4.x sends to a broker without the gRPC endpoint: does grpcio's poller
            # thread slow the event loop of a broker that serves remoting clients?
            commands["remoting_no_grpc_endpoint"] = (v4(plain_namesrv), plain_pid)
            rounds: dict[str, list[dict[str, Any]]] = {path: [] for path in commands}
            for r in range(args.repeats):
                for path, (cmd, broker_pid) in commands.items():
                    progress(f"round {r + 1}/{args.repeats}: {path}, {args.count} sync sends")
                    rounds[path].append(one_round(cmd, broker_pid, profiled(args, path, r)))
                    progress(f"  {rounds[path][-1]}")
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)
    median = {p: statistics.median(x["msgs_per_broker_cpu_s"] for x in rs) for p, rs in rounds.items()}
    ratios = {
        f"{GRPC_PATH[s]}_vs_{REMOTING_PATH[s]}": round(median[GRPC_PATH[s]] / median[REMOTING_PATH[s]], 3)
        for s in servers
    }
    progress("grpcio's floor: a bare grpc.aio echo server")
    floor = echo_floor(args.count, args.body)
    progress(f"  {floor}")
    doc = {
        "what": "messages per broker CPU-second, sync sends one at a time: v5 client over gRPC vs 0.4.4 over remoting",
        "count": args.count,
        "body": args.body,
        "repeats": args.repeats,
        "servers": servers,
        "median_msgs_per_broker_cpu_s": median,
        "ratios": ratios,
        "remoting_with_vs_without_grpc_endpoint": {
            REMOTING_PATH[s]: round(median[REMOTING_PATH[s]] / median["remoting_no_grpc_endpoint"], 3)
            for s in servers
        },
        "grpc_aio_echo_floor": floor,
        "echo_floor_vs_remoting": round(
            floor["calls_per_server_cpu_s"] / median[REMOTING_PATH[servers[0]]], 3
        ),
        "rounds": rounds,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


def receive_workload(
    args: argparse.Namespace, v5_python: Path, cluster: Any, procs: list[Any], servers: list[str]
) -> None:
    """``--workload receive``: the same stored messages read by each consumer, a group per round."""
    with tempfile.TemporaryDirectory(prefix="grpc-bench-recv-") as tmp:
        work = Path(tmp)
        try:
            brokers = {server: cluster(work, f"receive-{server}", True, server) for server in servers}
            for _pid, namesrv_addr, _grpc in brokers.values():
                progress(f"storing {args.count} messages of {args.body} bytes")
                subprocess.run(
                    [sys.executable, "-c", PREFILL, namesrv_addr, TOPIC, str(args.count), str(args.body)],
                    check=True,
                    timeout=600,
                )

            def remoting(kind: str, namesrv_addr: str, group: str, pace: float = 0.0) -> list[str]:
                return [
                    sys.executable,
                    "-c",
                    REMOTING_CONSUMER,
                    kind,
                    namesrv_addr,
                    TOPIC,
                    group,
                    str(args.count),
                    str(pace),
                ]

            rounds: dict[str, list[dict[str, Any]]] = {}
            for r in range(args.repeats):
                commands: dict[str, tuple[list[str], int]] = {}
                for server, (pid, namesrv_addr, grpc_addr) in brokers.items():
                    v5 = [str(v5_python), str(V5_CONSUMER), "bench-receive", "--endpoints", grpc_addr]
                    commands[GRPC_PATH[server]] = (
                        [*v5, "--topic", TOPIC, "--group", f"GB_GRPC_{r}", "--count", str(args.count)],
                        pid,
                    )
                    pop = "remoting_pop" + REMOTING_PATH[server].removeprefix("remoting")
                    commands[pop] = (remoting("pop", namesrv_addr, f"GB_POP_{r}"), pid)
                    commands[pop + "_ack1"] = (remoting("pop1", namesrv_addr, f"GB_POP1_{r}"), pid)
                pid, namesrv_addr, _ = brokers[servers[0]]
                commands["remoting_pull"] = (remoting("pull", namesrv_addr, f"GB_PULL_{r}"), pid)
                if args.paths:
                    wanted = set(args.paths.split(","))
                    commands = {p: c for p, c in commands.items() if p in wanted}
                for path, (cmd, broker_pid) in commands.items():
                    progress(f"round {r + 1}/{args.repeats}: {path}, {args.count} messages")
                    rounds.setdefault(path, []).append(
                        one_round(cmd, broker_pid, profiled(args, path, r), args.profile_mode)
                    )
                    progress(f"  {rounds[path][-1]}")
                    server = next((s for s in servers if GRPC_PATH[s] == path), None)
                    if server is not None and args.paced:
                        # The like-for-like baseline at the v5 client's pace (this round's): the
                        # same POP work, one awaited ACK_MESSAGE per message, no faster than it.
                        done = rounds[path][-1]
                        pace = done["seconds"] / max(done["sent"], 1)
                        pid, namesrv_addr, _ = brokers[server]
                        paced = (
                            "remoting_pop" + REMOTING_PATH[server].removeprefix("remoting") + "_ack1_paced"
                        )
                        progress(f"round {r + 1}/{args.repeats}: {paced}, {pace * 1e6:.0f} us a message")
                        rounds.setdefault(paced, []).append(
                            one_round(remoting("pop1", namesrv_addr, f"GB_PACED_{r}", pace), pid)
                        )
                        progress(f"  {rounds[paced][-1]}")
        finally:
            for proc in reversed(procs):
                proc.terminate()
                proc.wait(30)
    median = {p: statistics.median(x["msgs_per_broker_cpu_s"] for x in rs) for p, rs in rounds.items()}
    floor: dict[str, Any] | None = None
    if not args.no_floor:
        progress(
            "grpcio's floor for this workload: a bare grpc.aio server, one 34-write stream + 32 unary calls"
        )
        floor = receive_floor(args.count)
        progress(f"  {floor}")
    # Each round's v5 figure over the same round's baseline (the rounds alternate: the pairs
    # share the machine's load), their median, min and max.
    paired: dict[str, dict[str, Any]] = {}
    for s in servers:
        for suffix in ("_ack1", "_ack1_paced"):
            base = "remoting_pop" + REMOTING_PATH[s].removeprefix("remoting") + suffix
            grpc_rounds, base_rounds = rounds.get(GRPC_PATH[s], []), rounds.get(base, [])
            per_round = [
                round(g["msgs_per_broker_cpu_s"] / b["msgs_per_broker_cpu_s"], 3)
                for g, b in zip(grpc_rounds, base_rounds, strict=False)
            ]
            if per_round:
                paired[f"{GRPC_PATH[s]}_vs_{base}"] = {
                    "rounds": per_round,
                    "median": statistics.median(per_round),
                    "min": min(per_round),
                    "max": max(per_round),
                }
    doc = {
        "what": "messages received and settled per broker CPU-second: v5 SimpleConsumer over gRPC "
        "(receive 32 + one ack each) vs remoting POP (receive 32 + acks: sent together, or _ack1: "
        "one at a time, each awaited, as the v5 client) and remoting pull (32 per pull)",
        "workload": "receive",
        "count": args.count,
        "body": args.body,
        "repeats": args.repeats,
        "servers": servers,
        "median_msgs_per_broker_cpu_s": median,
        "ratios": {
            f"{GRPC_PATH[s]}_vs_{pop}": round(median[GRPC_PATH[s]] / median[pop], 3)
            for s in servers
            for base in ["remoting_pop" + REMOTING_PATH[s].removeprefix("remoting")]
            for pop in [base, base + "_ack1"]
            if GRPC_PATH[s] in median and pop in median
        }
        | {
            f"{GRPC_PATH[s]}_vs_remoting_pull": round(median[GRPC_PATH[s]] / median["remoting_pull"], 3)
            for s in servers
            if GRPC_PATH[s] in median and "remoting_pull" in median
        },
        "paired_ratios": paired,
        "grpc_aio_receive_floor": floor,
        "rounds": rounds,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load": os.getloadavg()},
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
