"""Load-generator worker of ``bench/compare.py``: one process, one connection, many requests in flight.

Run by compare.py, never by hand: it reads a JSON spec on stdin, connects, prints ``ready``,
waits for ``go`` on stdin, runs, writes its JSON result to the spec's ``out`` file and prints
``done``.  The same lean asyncio driver
(uvloop when installed) speaks each system's wire protocol directly, so every system gets a
generator of the same weight:

* tidemq: RocketMQ remoting frames from ``tidemq.remoting`` (SEND_MESSAGE_V2,
  SEND_BATCH_MESSAGE, PULL_MESSAGE);
* Redis: RESP written by hand, replies parsed by ``hiredis`` (XADD, XREAD);
* NATS JetStream: the NATS text protocol written by hand (PUB with a reply inbox; the ack is the
  JetStream publish ack; pulls through ``$JS.API.CONSUMER.MSG.NEXT``).

A "request" carries ``batch`` messages: one SEND_BATCH_MESSAGE for tidemq, ``batch`` pipelined
XADDs (Redis) or PUBs (NATS) answered when the last one is.  Latencies go into log-spaced
buckets (2 % wide) per time window so processes' histograms merge exactly.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

_LOG_STEP = math.log(1.02)


def bucket(seconds: float) -> int:
    """Log bucket of a latency (microsecond resolution at the bottom)."""
    us = seconds * 1e6
    return int(math.log(us) / _LOG_STEP) if us > 1.0 else 0


def bucket_value_us(b: int) -> float:
    return math.exp((b + 0.5) * _LOG_STEP)


class Recorder:
    """Counts completions and their latencies per window of ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.start = time.perf_counter()
        self.ok = 0
        self.errors = 0
        self.bytes = 0
        self.hist: dict[int, dict[int, int]] = {}
        self.last_error = ""

    def done(self, ok: bool, latency: float, messages: int) -> None:
        if ok:
            self.ok += messages
        else:
            self.errors += messages
        w = int((time.perf_counter() - self.start) / self.window_s)
        h = self.hist.get(w)
        if h is None:
            h = self.hist[w] = {}
        b = bucket(latency)
        h[b] = h.get(b, 0) + 1


# --------------------------------------------------------------------------- connections


class Conn(asyncio.Protocol):
    """Base: ``send()`` writes one request; ``on_done(ok, latency)`` fires on its answer."""

    batch = 1
    last_error = ""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.transport: Any = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.on_done: Callable[[bool, float], None] = lambda ok, lat: None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"connection lost: {exc}"))

    def send(self) -> None:
        raise NotImplementedError


class TidemqConn(Conn):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        from tidemq.message import BatchItem, Prop, encode_batch, properties_to_string
        from tidemq.remoting import FrameDecoder
        from tidemq.remoting.codes import RequestCode

        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.batch = spec.get("batch", 1)
        self.queues = spec["queues"]
        self.qi = 0
        self.seq = 0
        self.prefix = f"{os.getpid():08X}{int(time.time()):08X}"
        self.sent_at: dict[int, float] = {}
        body = b"x" * spec["size"]
        self.props = properties_to_string
        self.Prop = Prop
        if self.batch > 1:
            self.code = RequestCode.SEND_BATCH_MESSAGE
            # One template; every send writes fresh unique keys into it (send()), as a real
            # producer does: the broker's key index must see new keys, not the same 32 again.
            marks = [f"{i:02X}{'@' * 22}" for i in range(self.batch)]
            template = encode_batch(
                [BatchItem(body, 0, {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: m}) for m in marks]
            )
            self.key_at = [template.index(m.encode()) for m in marks]
            self.template = bytearray(template)
            self.body = template
        else:
            self.code = RequestCode.SEND_MESSAGE_V2
            self.body = body
        self.fields = {
            "a": "BENCH_P",
            "b": spec["topic"],
            "c": "TBW102",
            "d": "4",
            "f": "0",
            "h": "0",
            "j": "0",
            "k": "false",
            "m": "true" if self.batch > 1 else "false",
        }
        self.opaque = 0
        #: ``access_key:secret_key`` in $TIDEMQ_BENCH_ACL (compare_ab.py --acl): every request signed.
        acl = os.environ.get("TIDEMQ_BENCH_ACL", "")
        self.account = tuple(acl.split(":", 1)) if acl else None
        #: Consumers await responses by opaque here instead of timing them.
        self.waiting: dict[int, asyncio.Future[Any]] | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.ready.set_result(None)

    def send(self) -> None:
        from tidemq.remoting import RemotingCommand, encode

        fields = dict(self.fields)
        q = self.queues[self.qi]
        self.qi = (self.qi + 1) % len(self.queues)
        fields["e"] = str(q)
        fields["g"] = str(int(time.time() * 1000))
        self.seq += 1
        if self.batch > 1:
            fields["i"] = "WAIT\x01true\x02"
            body = self.template
            base = f"{self.prefix}{self.seq & 0xFFFFFF:06X}".encode()  # 22 characters + 2 per message
            for i, at in enumerate(self.key_at):
                body[at : at + 24] = base + b"%02X" % i
            self.body = bytes(body)
        else:
            fields["i"] = f"WAIT\x01true\x02UNIQ_KEY\x01{self.prefix}{self.seq:08X}\x02"
        self.opaque += 1
        cmd = RemotingCommand(self.code, opaque=self.opaque, ext_fields=fields, body=self.body)
        if self.account is not None:
            from tidemq.acl import sign_request

            sign_request(cmd, *self.account)
        self.sent_at[self.opaque] = time.perf_counter()
        self.transport.writelines(encode(cmd))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        waiting = self.waiting
        for cmd in self.decoder.feed(data):
            if waiting is not None:
                fut = waiting.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
                continue
            t0 = self.sent_at.pop(cmd.opaque, None)
            if t0 is not None:
                if cmd.code != 0:
                    self.last_error = f"{cmd.code} {cmd.remark}"
                self.on_done(cmd.code == 0, now - t0)


class RedisConn(Conn):
    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        import hiredis

        self.reader = hiredis.Reader()
        self.batch = spec.get("batch", 1)
        self.keys = [k.encode() for k in spec["keys"]]
        self.ki = 0
        payload = b"x" * spec["size"]
        self.tail = b"$1\r\n*\r\n$1\r\nd\r\n$%d\r\n%s\r\n" % (len(payload), payload)
        self.fifo: deque[float] = deque()
        self.pending_replies = 0
        self.failed = False

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.ready.set_result(None)

    def send(self) -> None:
        parts = []
        for _ in range(self.batch):
            key = self.keys[self.ki]
            self.ki = (self.ki + 1) % len(self.keys)
            parts.append(b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n" % (len(key), key))
            parts.append(self.tail)
        self.fifo.append(time.perf_counter())
        self.transport.writelines(parts)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        now = time.perf_counter()
        while True:
            reply = self.reader.gets()
            if reply is False:
                return
            if isinstance(reply, Exception):
                self.failed = True
                self.last_error = str(reply)
            self.pending_replies += 1
            if self.pending_replies == self.batch:
                self.pending_replies = 0
                self.on_done(not self.failed, now - self.fifo.popleft())
                self.failed = False


class NatsConn(Conn):
    """The NATS client protocol by hand: PUB with a reply inbox; JetStream answers each publish."""

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.batch = spec.get("batch", 1)
        self.subject = spec.get("subject", "bench.x").encode()
        self.inbox = f"_R.{os.getpid()}".encode()
        self.payload = b"x" * spec.get("size", 1)
        self.buf = bytearray()
        self.seq = 0
        self.sent_at: dict[int, float] = {}
        self.left: dict[int, int] = {}
        self.failed: set[int] = set()
        self.on_msg: Callable[[bytes, bytes | None, int], None] | None = None
        self.got_info = False

    def send(self) -> None:
        self.seq += 1
        req = self.seq
        head = b"PUB %s %s.%d %d\r\n" % (self.subject, self.inbox, req, len(self.payload))
        one = head + self.payload + b"\r\n"
        self.left[req] = self.batch
        self.sent_at[req] = time.perf_counter()
        self.transport.write(one * self.batch)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    def _on_ack(self, subject: bytes, payload: bytes) -> None:
        req = int(subject.rsplit(b".", 1)[1])
        if b'"error"' in payload:
            self.failed.add(req)
            self.last_error = payload.decode(errors="replace")[:200]
        left = self.left.get(req)
        if left is None:
            return
        if left > 1:
            self.left[req] = left - 1
            return
        del self.left[req]
        ok = req not in self.failed
        self.failed.discard(req)
        self.on_done(ok, time.perf_counter() - self.sent_at.pop(req))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            line = bytes(buf[pos:eol])
            if line.startswith(b"MSG ") or line.startswith(b"HMSG "):
                parts = line.split()
                hmsg = parts[0] == b"HMSG"
                total = int(parts[-1])
                end = eol + 2 + total
                if end + 2 > n:
                    break
                hlen = int(parts[-2]) if hmsg else 0
                subject = parts[1]
                body = bytes(buf[eol + 2 + hlen : end])
                headers = bytes(buf[eol + 2 : eol + 2 + hlen]) if hmsg else None
                pos = end + 2
                if self.on_msg is not None:
                    self.on_msg(subject, headers, len(body))
                else:
                    self._on_ack(subject, body)
                continue
            pos = eol + 2
            if line == b"PING":
                self.transport.write(b"PONG\r\n")
            elif line == b"PONG":
                if not self.ready.done():
                    self.ready.set_result(None)
            elif line.startswith(b"INFO ") and not self.got_info:
                self.got_info = True
                self.transport.write(
                    b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true,"protocol":1}\r\n'
                    b"SUB %s.* 1\r\nPING\r\n" % self.inbox
                )
            elif line.startswith(b"-ERR"):
                self.last_error = line.decode(errors="replace")
                print(f"[compare_load] nats: {self.last_error}", file=sys.stderr)
        del buf[:pos]


# --------------------------------------------------------------------------- drivers


async def connect(spec: dict[str, Any]) -> Conn:
    cls = {"tidemq": TidemqConn, "redis": RedisConn, "nats": NatsConn}[spec["system"]]
    host, port = spec["addr"].rsplit(":", 1)
    loop = asyncio.get_running_loop()
    _t, conn = await loop.create_connection(lambda: cls(spec), host, int(port))
    await asyncio.wait_for(conn.ready, 10)
    return conn


async def run_window(conn: Conn, rec: Recorder, requests: int, inflight: int) -> None:
    """Closed loop: keep ``inflight`` requests outstanding until ``requests`` have been answered."""
    done = asyncio.get_running_loop().create_future()
    state = {"left": requests, "answered": 0}
    batch = conn.batch

    def on_done(ok: bool, latency: float) -> None:
        rec.done(ok, latency, batch)
        state["answered"] += 1
        if state["left"] > 0:
            state["left"] -= 1
            conn.send()
        elif state["answered"] >= requests and not done.done():
            done.set_result(None)

    conn.on_done = on_done
    first = min(inflight, requests)
    state["left"] -= first
    for _ in range(first):
        conn.send()
    await asyncio.wait([done, conn.lost], return_when=asyncio.FIRST_COMPLETED)


async def run_rate(conn: Conn, rec: Recorder, rate: float, seconds: float, max_outstanding: int) -> int:
    """Open loop: send ``rate`` requests per second for ``seconds``; returns sends skipped because
    ``max_outstanding`` were unanswered (the server fell behind)."""
    batch = conn.batch
    outstanding = [0]

    def on_done(ok: bool, latency: float) -> None:
        outstanding[0] -= 1
        rec.done(ok, latency, batch)

    conn.on_done = on_done
    t0 = time.perf_counter()
    issued = skipped = 0
    while True:
        now = time.perf_counter()
        if now - t0 >= seconds:
            break
        if conn.lost.done():
            rec.last_error = rec.last_error or "the server closed the connection"
            return skipped
        due = int((now - t0) * rate) - issued - skipped
        for _ in range(due):
            if outstanding[0] >= max_outstanding:
                skipped += 1
                continue
            outstanding[0] += 1
            issued += 1
            conn.send()
        await asyncio.sleep(0.001)
    deadline = time.perf_counter() + 10
    while outstanding[0] > 0 and time.perf_counter() < deadline:
        await asyncio.sleep(0.005)
    return skipped


# --------------------------------------------------------------------------- consumers


async def consume_tidemq(spec: dict[str, Any], rec: Recorder) -> None:
    """PULL_MESSAGE each queue from offset 0 to its end, one pull in flight per queue."""
    from tidemq.remoting import RemotingCommand, encode
    from tidemq.remoting.codes import RequestCode

    conn = await connect({**spec, "queues": [0]})
    assert isinstance(conn, TidemqConn)
    waiting: dict[int, asyncio.Future[Any]] = {}
    conn.waiting = waiting
    loop = asyncio.get_running_loop()
    rec_size = struct.Struct(">i")
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    rec.start = time.perf_counter()
    spec["t0"], spec["cpu0"] = time.time(), time.process_time()

    async def one_queue(queue_id: int, end: int) -> None:
        offset = 0
        while offset < end:
            fields = {
                "consumerGroup": "BENCH_C",
                "topic": spec["topic"],
                "queueId": str(queue_id),
                "queueOffset": str(offset),
                "maxMsgNums": str(spec.get("pull_batch", 1024)),
                "sysFlag": "4",  # FLAG_SUBSCRIPTION: the subscription travels with the pull
                "commitOffset": "0",
                "suspendTimeoutMillis": "0",
                "subscription": "*",
                "subVersion": "0",
                "expressionType": "TAG",
            }
            conn.opaque += 1
            cmd = RemotingCommand(RequestCode.PULL_MESSAGE, opaque=conn.opaque, ext_fields=fields)
            if conn.account is not None:
                from tidemq.acl import sign_request

                sign_request(cmd, *conn.account)
            fut = loop.create_future()
            waiting[conn.opaque] = fut
            t0 = time.perf_counter()
            conn.transport.writelines(encode(cmd))
            resp = await asyncio.wait_for(fut, 30)
            if resp.code != 0:
                rec.last_error = f"pull {queue_id}@{offset}: {resp.code} {resp.remark}"
                break
            body = resp.body or b""
            # Walk the records' size fields: counts messages and proves the framing is intact.
            n = pos = 0
            while pos < len(body):
                pos += rec_size.unpack_from(body, pos)[0]
                n += 1
            nxt = int(resp.ext_fields["nextBeginOffset"])
            if n != nxt - offset:
                rec.last_error = f"pull {queue_id}@{offset}: {n} records for {nxt - offset} offsets"
            rec.bytes += len(body)
            rec.done(True, time.perf_counter() - t0, n)
            offset = nxt

    await asyncio.gather(*(one_queue(q, end) for q, end in spec["ends"]))


async def consume_redis(spec: dict[str, Any], rec: Recorder) -> None:
    """XREAD COUNT n each stream from its start to its end, one read in flight per stream."""
    import hiredis

    host, port = spec["addr"].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    parser = hiredis.Reader()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    rec.start = time.perf_counter()
    spec["t0"], spec["cpu0"] = time.time(), time.process_time()
    count = str(spec.get("pull_batch", 1000)).encode()
    # One connection per process: reads of the owned streams go round robin, each pipelined.
    last = {k.encode(): b"0-0" for k, _ in spec["ends"]}
    left = {k.encode(): n for k, n in spec["ends"]}
    while left:
        keys = list(left)
        out = []
        for key in keys:
            lid = last[key]
            out.append(
                b"*6\r\n$5\r\nXREAD\r\n$5\r\nCOUNT\r\n$%d\r\n%s\r\n$7\r\nSTREAMS\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                % (len(count), count, len(key), key, len(lid), lid)
            )
        t0 = time.perf_counter()
        writer.writelines(out)
        got = 0
        replies: list[Any] = []
        while got < len(keys):
            r = parser.gets()
            if r is False:
                data = await reader.read(1 << 20)
                if not data:
                    raise ConnectionError("redis closed the connection")
                parser.feed(data)
                continue
            replies.append(r)
            got += 1
        lat = time.perf_counter() - t0
        for key, r in zip(keys, replies, strict=True):
            if not r:
                del left[key]
                continue
            entries = r[0][1]
            n = len(entries)
            rec.bytes += sum(len(e[1][1]) for e in entries)
            last[key] = entries[-1][0]
            rec.done(True, lat, n)
            left[key] -= n
            if left[key] <= 0:
                del left[key]
    writer.close()


async def consume_nats(spec: dict[str, Any], rec: Recorder) -> None:
    """Fetch batches from a shared no-ack pull consumer until the stream is drained."""
    conn = await connect(spec)
    assert isinstance(conn, NatsConn)
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"fut": None, "n": 0, "bytes": 0, "empty": False}

    def on_msg(subject: bytes, headers: bytes | None, size: int) -> None:
        if headers is not None and (b" 404" in headers or b" 408" in headers or b" 409" in headers):
            state["empty"] = state["n"] == 0
            fut = state["fut"]
            if fut is not None and not fut.done():
                fut.set_result(None)
            return
        state["n"] += 1
        rec.bytes += size
        if state["n"] >= state["want"]:
            fut = state["fut"]
            if fut is not None and not fut.done():
                fut.set_result(None)

    conn.on_msg = on_msg
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    rec.start = time.perf_counter()
    spec["t0"], spec["cpu0"] = time.time(), time.process_time()
    want = spec.get("pull_batch", 1000)
    api = b"$JS.API.CONSUMER.MSG.NEXT.%s.%s" % (spec["stream"].encode(), spec["consumer"].encode())
    req = json.dumps({"batch": want, "no_wait": True}).encode()
    empties = 0
    while True:
        state.update(fut=loop.create_future(), n=0, want=want, empty=False)
        t0 = time.perf_counter()
        conn.write(b"PUB %s %s.0 %d\r\n%s\r\n" % (api, conn.inbox, len(req), req))
        try:
            await asyncio.wait_for(state["fut"], 10)
        except TimeoutError:
            rec.last_error = "nats fetch timed out"
            break
        if state["n"]:
            rec.done(True, time.perf_counter() - t0, state["n"])
            spec["t1"] = time.time()
            empties = 0
        elif state["empty"]:
            empties += 1
            if empties >= 2:
                break


# --------------------------------------------------------------------------- entry point


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    rec = Recorder(spec.get("window_s", 1e9))
    op = spec["op"]
    skipped = 0
    if op == "consume":
        fn = {"tidemq": consume_tidemq, "redis": consume_redis, "nats": consume_nats}[spec["system"]]
        await fn(spec, rec)
        t1 = spec.get("t1", time.time()) if spec["system"] == "nats" else time.time()
    else:
        conn = await connect(spec)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        rec.start = time.perf_counter()
        spec["t0"], spec["cpu0"] = time.time(), time.process_time()
        if op == "produce":
            await run_window(conn, rec, spec["requests"], spec["inflight"])
        else:
            skipped = await run_rate(
                conn, rec, spec["rate"], spec["seconds"], spec.get("max_outstanding", 10_000)
            )
        t1 = time.time()
        rec.last_error = getattr(conn, "last_error", "") or rec.last_error
        conn.transport.close()
    return {
        "ok": rec.ok,
        "errors": rec.errors,
        "bytes": rec.bytes,
        "t0": spec["t0"],
        "t1": t1,
        # From "go" on: start-up and connecting are not part of the workload.
        "cpu": time.process_time() - spec["cpu0"],
        "skipped": skipped,
        "last_error": rec.last_error,
        "hist": {str(w): {str(b): c for b, c in h.items()} for w, h in rec.hist.items()},
    }


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        result = runner.run(main_async(spec))
    # A file, not stdout: results of long soaks run past the 64 KiB a pipe holds, and a truncated
    # line was seen on stdout after uvloop ran.
    with open(spec["out"], "w") as f:
        json.dump(result, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
