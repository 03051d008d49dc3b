"""Fuzz the compiled codec (the ``tidemq._native`` modules) against the pure-Python reference (``tidemq.record``).

Every input (random bytes, or valid SEND_BATCH_MESSAGE bodies and commit-log record buffers with
1-4 mutations: bit flips, interesting values written over length fields, truncation, splices,
duplicated or inserted bytes) goes to every compiled decoder and to its reference twin:
``decode_batch`` (random ``max_count``), ``decode_message`` (random position, CRC check, body or
not), ``iter_messages`` (all records, then the error), ``record_crc_ok`` and ``record_mismatch``.
Both must return equal results, or raise the same exception type with the same message.  When a
batch decodes, its messages also go through both record encoders (same bytes, same offsets).

Run::

    python tests/fuzz/fuzz_native_codec.py --inputs 1000000 [--seed 1] [--json out.json]
    python tests/fuzz/fuzz_native_codec.py --codec build/asan/lib/tidemq/_native  # a given build (ASan)

Progress goes to stderr, a JSON summary to stdout (and ``--json``).  Exit status 1 at the first
difference, with the input saved under ``--crash-dir``.  ``tests/test_native_codec.py`` runs a
few thousand inputs of it; ``tests/fuzz/asan_fuzz.sh`` (``tox -e fuzz-asan``) runs it under
AddressSanitizer.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import json
import os
import random
import struct
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

INTERESTING_32 = [0, 1, 2, 4, 19, 20, 21, 22, 23, 47, 48, 49, 84, 88, 127, 128, 255, 256, 0x7FFF, 0x8000]
INTERESTING_32 += [0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFF00]
HOSTS = [("127.0.0.1", 10911), ("10.1.2.3", 0), ("255.255.255.255", 65535), ("::1", 9876), ("fe80::2", 1)]
HOSTS += [("::ffff:10.0.0.8", 10911), ("2001:db8::ff00:42:8329", 1), ("0.0.0.0", -1)]
PROPS = [
    {},
    {"TAGS": "TagA"},
    {"KEYS": "k1 k2", "TAGS": "t", "UNIQ_KEY": "7F000001000018B4AAC2"},
    {"WAIT": "true", "é": "ü\u4e2d", "": "empty key", "x": ""},
    {"a\x01b": "c", "d": "e\x02f"},  # separators inside: encodes to what decodes differently
    {"TAGS": "\U0001f600 astral", "DELAY": "3"},
]


class Mismatch(AssertionError):
    """The compiled and reference decoders disagreed on an input."""


def load_codec(path: str | None) -> Any:
    """The compiled codec's modules in one namespace (:func:`tidemq._native.load_all`): the
    installed ones, or the builds in the directory ``path`` (loaded before tidemq imports any)."""
    if path:
        files = sorted(Path(path).glob("_*.so"))
        assert files, f"no compiled module in {path}"
        for file in files:
            name = f"tidemq._native.{file.name.split('.')[0]}"
            spec = importlib.util.spec_from_file_location(name, file)
            assert spec is not None and spec.loader is not None, file
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    from tidemq import _native

    codec = _native.load_all()
    if codec is None:
        raise ImportError("the compiled codec is not built")
    return codec


# ---------------------------------------------------------------------------- seeds and mutations


def batch_seed(rng: random.Random) -> bytes:
    from tidemq.message import BatchItem
    from tidemq.record import encode_batch

    items = [
        BatchItem(
            rng.randbytes(rng.choice([0, 1, 7, 40, 200])), rng.randrange(-3, 1 << 31), rng.choice(PROPS)
        )
        for _ in range(rng.randint(1, 6))
    ]
    return encode_batch(items)


def record_seed(rng: random.Random) -> bytes:
    from tidemq.message import MessageInner
    from tidemq.record import RecordEncoder

    encoder = RecordEncoder(rng.choice(HOSTS[:7]))
    msgs = [
        MessageInner(
            topic=rng.choice(["T", "TopicTest", "%RETRY%g", "t\u00e9"]),
            body=rng.randbytes(rng.choice([0, 3, 60, 300])),
            queue_id=rng.randrange(8),
            flag=rng.randrange(-5, 5),
            properties=rng.choice(PROPS),
            sys_flag=rng.choice([0, 1, 2, 4, 8, 12, 48, 0x100]),
            born_timestamp=rng.randrange(-(1 << 40), 1 << 62),
            born_host=rng.choice(HOSTS[:7]),
            reconsume_times=rng.randrange(17),
            prepared_transaction_offset=rng.randrange(1 << 40),
        )
        for _ in range(rng.randint(1, 4))
    ]
    batch = encoder.prepare(msgs)
    buf = bytearray(batch.total)
    encoder.write_into(buf, 0, batch, rng.randrange(1 << 20), rng.randrange(1 << 40), rng.randrange(1 << 42))
    return bytes(buf)


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        n = len(buf)
        if op == 0 and n:  # bit flip
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # interesting byte
            buf[rng.randrange(n)] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xC3, 0xED, 0xFF])
        elif op == 2 and n >= 4:  # interesting 32-bit value (length fields), maybe +-1
            at = rng.randrange(n - 3) if rng.random() < 0.5 else rng.randrange(0, n - 3, 4)
            v = (
                rng.choice(INTERESTING_32 + [n, n - at, n - at - 20]) + rng.choice([0, 0, 1, -1])
            ) & 0xFFFFFFFF
            buf[at : at + 4] = v.to_bytes(4, "big")
        elif op == 3 and n >= 2:  # interesting 16-bit value (PROPERTIESLENGTH)
            at = rng.randrange(n - 1)
            v = rng.choice([0, 1, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE, n - at - 2]) & 0xFFFF
            buf[at : at + 2] = v.to_bytes(2, "big")
        elif op == 4:  # truncate
            del buf[rng.randint(0, n) :]
        elif op == 5:  # append random or a copy of another seed
            buf += rng.randbytes(rng.randint(1, 30)) if rng.random() < 0.5 else rng.choice(pool)
        elif op == 6 and n:  # delete a range
            at = rng.randrange(n)
            del buf[at : at + rng.randint(1, 8)]
        elif op == 7:  # insert random bytes
            at = rng.randint(0, n)
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 8 and n:  # splice: our head, another seed's tail
            other = rng.choice(pool)
            buf = buf[: rng.randint(0, n)] + other[rng.randint(0, len(other)) :]
    return bytes(buf)


# ---------------------------------------------------------------------------- comparison


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple:
    try:
        return ("ok", fn(*args, **kwargs))
    except Exception as exc:  # noqa: BLE001 - every exception is an outcome to compare
        return ("error", type(exc).__name__, str(exc))


def iterate(it_fn: Any, data: Any, check_crc: bool) -> tuple:
    got: list = []
    try:
        for m in it_fn(data, check_crc=check_crc):
            got.append(m)
            if len(got) > 10_000:
                break
    except Exception as exc:  # noqa: BLE001
        return ("error", got, type(exc).__name__, str(exc))
    return ("ok", got)


def same(what: str, data: bytes, compiled: tuple, reference: tuple) -> None:
    if compiled != reference:
        raise Mismatch(f"{what} on {data.hex()}:\n compiled  {compiled!r}\n reference {reference!r}")


def check(codec: ModuleType, rng: random.Random, data: bytes) -> dict[str, int]:
    """Run every decoder pair on ``data``; raises :class:`Mismatch`. Returns counts of what ran."""
    import tidemq.record as ref
    from tidemq.message import MessageInner

    shown: Any = data if rng.random() < 0.7 else rng.choice([memoryview(data), bytearray(data)])
    counts = {
        "decode_batch": 1,
        "decode_batch_messages": 1,
        "scan_queue": 1,
        "decode_message": 1,
        "iter_messages": 1,
        "record_checks": 1,
        "encode": 0,
    }

    max_count = rng.choice([None, None, 0, 1, 3, 64])
    batch = outcome(ref.decode_batch, shown, max_count)
    same("decode_batch", data, outcome(codec.decode_batch, shown, max_count), batch)
    # The pull path's walk over damaged store files: ``data`` as the mapped file, entries that
    # point into it (random, or at offsets 0, 20, ...) with random sizes.
    n_entries = rng.randint(0, 6)
    # Tag codes: none, or those of a TAG subscription ("Aa" and "BB" collide) read in the same walk.
    codes = [0, 2112, 116, 0x7FFFFFFF]
    entries = b"".join(
        struct.pack(
            ">qiq",
            rng.choice([0, rng.randint(-8, len(data) + 8)]),
            rng.randint(-4, len(data) + 4),
            rng.choice(codes),
        )
        for _ in range(n_entries)
    )
    tags = rng.choice([None, None, ((2112,), (b"Aa",)), ((116, 2112), (b"BB", b"t")), ((0,), (b"",))])
    scans = []
    # Drawn once: both walks get the same arguments.
    readable, max_count, max_bytes = rng.randint(0, len(data)), rng.randint(1, 8), rng.randint(1, 1 << 16)
    check_crc = rng.random() < 0.5
    for impl in (codec, ref):
        bufs: list[Any] = []
        qoffs: list[int] = []
        runs: list[Any] = []
        got = outcome(
            impl.scan_queue,
            entries,
            0,
            len(entries),
            memoryview(data),
            0,
            readable,
            b"T",
            1,
            0,
            max_count,
            max_bytes,
            check_crc,
            bufs,
            qoffs,
            0,
            runs,
            tags,
        )
        if b"".join(runs) != b"".join(bufs):
            got = ("runs differ from the records taken", got)
        scans.append((got, [bytes(b) for b in bufs], qoffs, [bytes(r) for r in runs]))
    same("scan_queue", data, scans[0], scans[1])
    header = ("T", 1, 0, 1700000000000, ("10.0.0.1", 5555), ("10.0.0.2", 10911), 0)
    same(
        "decode_batch_messages",
        data,
        outcome(codec.decode_batch_messages, shown, max_count, *header),
        outcome(ref.decode_batch_messages, shown, max_count, *header),
    )

    pos = 0 if rng.random() < 0.7 else rng.randint(0, len(data))
    crc, body = rng.random() < 0.5, rng.random() < 0.8
    same(
        "decode_message",
        data,
        outcome(codec.decode_message, shown, pos, check_crc=crc, with_body=body),
        outcome(ref.decode_message, shown, pos, check_crc=crc, with_body=body),
    )
    same(
        "iter_messages",
        data,
        iterate(codec.iter_messages, shown, crc),
        iterate(ref.iter_messages, shown, crc),
    )
    same("record_crc_ok", data, outcome(codec.record_crc_ok, shown), outcome(ref.record_crc_ok, shown))
    size = len(data) if rng.random() < 0.6 else rng.randrange(200)
    topic = rng.choice([b"T", b"TopicTest", b"%RETRY%g", "t\u00e9".encode(), b""])
    qid, qoff = rng.randrange(8), rng.randrange(1 << 20) if rng.random() < 0.3 else 0
    same(
        "record_mismatch",
        data,
        outcome(codec.record_mismatch, shown, size, topic, qid, qoff),
        outcome(ref.record_mismatch, shown, size, topic, qid, qoff),
    )

    if batch[0] == "ok" and batch[1] and rng.random() < 0.25:  # what decoded, through both encoders
        counts["encode"] = 1
        host = rng.choice(HOSTS)
        msgs = [
            MessageInner(
                topic="FuzzTopic", body=it.body, flag=it.flag, properties=it.properties, born_host=host
            )
            for it in batch[1]
        ]
        same("encode", data, encode(codec.RecordEncoder, host, msgs), encode(ref.RecordEncoder, host, msgs))
    return counts


def encode(cls: Any, host: tuple, msgs: list) -> tuple:
    try:
        enc = cls(host, 4096)
        batch = enc.prepare(msgs)
        buf = bytearray(batch.total + 3)
        offsets = enc.write_into(buf, 3, batch, 7, 1 << 33, 1_700_000_000_000)
        return (
            "ok",
            bytes(buf),
            offsets,
            batch.sizes,
            batch.tags_codes,
            [enc.message_id(o) for o in offsets],
        )
    except Exception as exc:  # noqa: BLE001
        return ("error", type(exc).__name__, str(exc))


def run(
    codec: ModuleType, inputs: int, seed: int, progress: bool = False, crash_dir: Path | None = None
) -> dict:
    """Fuzz ``inputs`` inputs; returns a summary (raises :class:`Mismatch` at the first difference)."""
    rng = random.Random(seed)
    pool = [batch_seed(rng) for _ in range(64)] + [record_seed(rng) for _ in range(64)]
    totals: collections.Counter[str] = collections.Counter()
    kinds = {"random": 0, "mutated": 0, "valid": 0}
    started = time.perf_counter()
    before = codec.disagreements()
    for i in range(inputs):
        r = rng.random()
        if r < 0.08:
            data, kind = rng.randbytes(rng.randint(0, 200)), "random"
        elif r < 0.12:
            data, kind = rng.choice(pool), "valid"
        else:
            data, kind = mutate(rng, rng.choice(pool), pool), "mutated"
        kinds[kind] += 1
        try:
            for k, v in check(codec, rng, data).items():
                totals[k] += v
        except Mismatch:
            if crash_dir is not None:
                crash_dir.mkdir(parents=True, exist_ok=True)
                (crash_dir / f"mismatch-{seed}-{i}.bin").write_bytes(data)
            raise
        if i % 8 == 7 and rng.random() < 0.02:  # refresh the pool with a fresh valid input now and then
            pool[rng.randrange(len(pool))] = batch_seed(rng) if rng.random() < 0.5 else record_seed(rng)
        if progress and (i + 1) % 50_000 == 0:
            rate = (i + 1) / (time.perf_counter() - started)
            print(f"{i + 1} inputs, {rate:.0f}/s, all equal so far", file=sys.stderr, flush=True)
    disagreements = codec.disagreements() - before
    if disagreements:
        raise Mismatch(f"{disagreements} calls where the reference accepted what the compiled code refused")
    return {
        "inputs": inputs,
        "seed": seed,
        "kinds": kinds,
        "decoder_calls": dict(totals),
        "seconds": round(time.perf_counter() - started, 1),
        "outcome": "no difference, no crash",
        "codec": [getattr(m, "__file__", "?") for m in codec.modules],
        "crc32": codec.CRC32_SOURCE,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    ap.add_argument(
        "--codec", help="directory of a build's tidemq._native modules (default: the installed ones)"
    )
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--crash-dir", default="fuzz-crashes", help="where a differing input is saved")
    args = ap.parse_args()
    codec = load_codec(args.codec)
    print(f"fuzzing {[m.__file__ for m in codec.modules]} with seed {args.seed}", file=sys.stderr)
    try:
        summary = run(codec, args.inputs, args.seed, progress=True, crash_dir=Path(args.crash_dir))
    except Mismatch as exc:
        print(f"MISMATCH (seed {args.seed}): {exc}", file=sys.stderr)
        return 1
    summary["asan"] = "libasan" in os.environ.get("LD_PRELOAD", "")
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
