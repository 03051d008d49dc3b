"""Codec throughput: remoting frames, and the per-message record codec, Python vs compiled.

Prints one JSON object to stdout, e.g.
``{"send_request_json": {"encode_per_s": ..., "decode_per_s": ...}, ..., "record_codec": {...}}``.

``record_codec`` times each per-message operation of :mod:`tidemq.record` (the pure-Python
reference) and of the ``tidemq._native`` modules (the compiled codec, whatever ``TIDEMQ_NO_EXTENSIONS``
says) in ns per message, best of ``--repeat`` runs, and their ratio: ``decode_batch`` of a
SEND_BATCH_MESSAGE body, ``encode`` (``RecordEncoder.prepare`` + ``write_into``), ``iter_messages``
over a pull response body with and without the CRC check, the store's per-record checks on the
pull path (``record_mismatch`` + ``record_crc_ok``), ``message_ids``, ``pack_cq_entries`` and
``create_message_id``;
batches of 32 messages of 128 B and 1 KiB with the properties a RocketMQ producer sets.  Plus the
CRC32 call itself (zlib-ng through Python vs called directly).

Run: ``python bench/codec_bench.py [--n 50000] [--sections frames,record] [--out results.json]``.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemq.remoting import FrameDecoder, RemotingCommand, RequestCode, SerializeType, encode
from tidemq.remoting.codec import encode_bytes


def send_request(stype: SerializeType) -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.SEND_MESSAGE_V2,
        {
            "a": "PID-bench",
            "b": "TopicTest",
            "c": "TBW102",
            "d": "4",
            "e": "1",
            "f": "0",
            "g": str(int(time.time() * 1000)),
            "h": "0",
            "i": "KEYS\x01k1\x02TAGS\x01tagA\x02WAIT\x01true\x02",
            "j": "0",
            "k": "false",
            "m": "false",
        },
        b"x" * 256,
        serialize_type=stype,
    )


def pull_response() -> RemotingCommand:
    req = RemotingCommand.request(RequestCode.PULL_MESSAGE)
    records = [memoryview(bytes(300)) for _ in range(32)]  # 32 stored messages handed over zero-copy
    return req.reply(
        ext_fields={"suggestWhichBrokerId": 0, "nextBeginOffset": 132, "minOffset": 0, "maxOffset": 500},
        body_parts=tuple(records),
    )


def rate(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def bench_case(cmd: RemotingCommand, n: int) -> dict[str, float]:
    frame = encode_bytes(cmd)
    stream = frame * 100
    decoder = FrameDecoder()

    def decode_batch() -> None:
        decoder.feed(stream)

    enc = rate(lambda: encode(cmd), n)
    dec = rate(decode_batch, max(1, n // 100)) * 100
    return {"frame_bytes": len(frame), "encode_per_s": round(enc), "decode_per_s": round(dec)}


# ---------------------------------------------------------------------------- record codec

BATCH = 32


def best_ns(fn: Callable[[], object], per_call: int, budget_s: float, repeat: int) -> float:
    """Best (lowest) ns per message over ``repeat`` runs of about ``budget_s`` each."""
    fn()
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < budget_s / 10:
        fn()
        calls += 1
    loops = max(1, calls * 10 // max(repeat, 1))
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter_ns() - t) / loops / per_call)
    return best


def record_cases(body_size: int) -> dict[str, Any]:
    """Inputs of one size: a batch body, its messages as the broker builds them, their records."""
    from tidemq.message import BatchItem, MessageInner
    from tidemq.record import RecordEncoder, encode_batch

    items = [
        BatchItem(
            os.urandom(body_size),
            0,
            {"KEYS": f"order-{i}", "TAGS": "TagA", "UNIQ_KEY": uuid.uuid4().hex.upper(), "WAIT": "true"},
        )
        for i in range(BATCH)
    ]
    peer = ("10.1.2.3", 40000)
    msgs = [
        MessageInner(
            topic="BenchTopic",
            body=it.body,
            queue_id=1,
            flag=it.flag,
            properties=it.properties,
            born_timestamp=1_700_000_000_000,
            born_host=peer,
        )
        for it in items
    ]
    enc = RecordEncoder(("10.0.0.1", 10911))
    batch = enc.prepare(msgs)
    records = bytearray(batch.total)
    offsets = enc.write_into(records, 0, batch, 0, 0, 1_700_000_000_001)
    return {
        "body": encode_batch(items),
        "msgs": msgs,
        "records": bytes(records),
        "sizes": batch.sizes,
        "offsets": offsets,
    }


def record_ops(impl: Any, case: dict[str, Any]) -> dict[str, tuple[Callable[[], object], int]]:
    """Operation name -> (one call, messages per call) for an implementation module."""
    body, msgs, records, sizes, offsets = (
        case["body"],
        case["msgs"],
        case["records"],
        case["sizes"],
        case["offsets"],
    )
    enc = impl.RecordEncoder(("10.0.0.1", 10911))
    target = bytearray(len(records))
    views = []  # (record, its size, its queue offset): what the consume queue names
    pos = 0
    for qoff, size in enumerate(sizes):
        views.append((memoryview(records)[pos : pos + size], size, qoff))
        pos += size
    tags = [2598919] * len(sizes)
    create_id = impl.create_message_id
    host = ("10.0.0.1", 10911)

    def encode() -> None:
        enc.write_into(target, 0, enc.prepare(msgs), 0, 0, 1_700_000_000_001)

    mismatch, crc_ok = impl.record_mismatch, impl.record_crc_ok

    def checks() -> None:  # the store's pull path: each served record against its queue entry
        for view, size, qoff in views:
            if mismatch(view, size, b"BenchTopic", 1, qoff) is not None or not crc_ok(view):
                raise AssertionError("the bench records do not match their entries")

    return {
        "decode_batch": (lambda: impl.decode_batch(body, 1024), BATCH),
        "encode": (encode, BATCH),
        "iter_messages": (lambda: list(impl.iter_messages(records)), BATCH),
        "iter_messages_crc": (lambda: list(impl.iter_messages(records, check_crc=True)), BATCH),
        "record_checks": (checks, BATCH),
        "message_ids": (lambda: enc.message_ids(offsets), BATCH),
        "pack_cq_entries": (lambda: impl.pack_cq_entries(offsets, sizes, tags), BATCH),
        "create_message_id": (lambda: [create_id(host, o) for o in offsets], BATCH),
    }


def bench_record_codec(budget_s: float, repeat: int) -> dict[str, Any]:
    import tidemq.message as message
    import tidemq.record as record

    class Reference:  # the Python side: tidemq.record, and the Python message id
        def __getattr__(self, name: str) -> Any:
            return message.py_create_message_id if name == "create_message_id" else getattr(record, name)

    from tidemq import _native

    compiled: Any = _native.load_all()
    if compiled is None:
        print("the compiled codec is not built: Python only", file=sys.stderr)
    out: dict[str, Any] = {
        "unit": "ns per message, best of runs",
        "batch_messages": BATCH,
        "compiled": None if compiled is None else [m.__name__ for m in compiled.modules],
        "crc32": None if compiled is None else compiled.CRC32_SOURCE,
        "loadavg_at_start": list(os.getloadavg()),
    }
    for size in (128, 1024):
        case = record_cases(size)
        ref_ops = record_ops(Reference(), case)
        c_ops = record_ops(compiled, case) if compiled is not None else {}
        section: dict[str, Any] = {}
        for name, (fn, per) in ref_ops.items():
            print(f"record codec {size} B: {name}...", file=sys.stderr, flush=True)
            py = best_ns(fn, per, budget_s, repeat)
            row: dict[str, Any] = {"python_ns": round(py)}
            if name in c_ops:
                c = best_ns(c_ops[name][0], per, budget_s, repeat)
                row |= {"compiled_ns": round(c), "speedup": round(py / c, 1)}
            section[name] = row
        out[f"body_{size}B"] = section
    if compiled is not None:
        crc: dict[str, Any] = {}
        for size in (128, 1024, 65536):
            data = os.urandom(size)
            n = 200_000 if size < 4096 else 5_000
            via_python = compiled._crc32_ns(data, n, False)
            direct = compiled._crc32_ns(data, n, True)
            crc[f"{size}B"] = {
                "zlib_ng_via_python_ns": round(via_python),
                "direct_ns": direct and round(direct),
            }
        out["crc32_call"] = crc
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000, help="operations per frame measurement")
    ap.add_argument("--sections", default="frames,record", help="frames (remoting), record (record codec)")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per record-codec measurement")
    ap.add_argument("--repeat", type=int, default=5, help="runs per record-codec measurement (best kept)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    results: dict[str, Any] = {}
    if "frames" in sections:
        for name, cmd in [
            ("send_request_json", send_request(SerializeType.JSON)),
            ("send_request_rocketmq", send_request(SerializeType.ROCKETMQ)),
            ("pull_response_32x300B_json", pull_response()),
        ]:
            print(f"benchmarking {name}...", file=sys.stderr)
            results[name] = bench_case(cmd, args.n)
        results["json_over_rocketmq_decode_ratio"] = round(
            results["send_request_json"]["decode_per_s"] / results["send_request_rocketmq"]["decode_per_s"], 3
        )
    if "record" in sections:
        results["record_codec"] = bench_record_codec(args.budget, args.repeat)
    text = json.dumps(results)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
