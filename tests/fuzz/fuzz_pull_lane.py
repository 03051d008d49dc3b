"""Fuzz the pull lane's compiled walk (``tidemq._native._pull_lane.walk``) against its reference,
:func:`tidemq.record.scan_queue` with ``runs``.

Each input is a mapped commit-log file as the walk sees it: 1-8 records of one queue (topic ``T``,
queue 1, queue offsets 0, 1, ... as the store writes them, bodies of many sizes, tags that collide
by hash code), sometimes with filler or another queue's record between them, and the ConsumeQueue
entries that name them.  Then 0-4 mutations of the file (bit flips, interesting values over length
fields, truncation, zeroed runs: the damage a store may hold) and of the entries (offsets, sizes
and tag codes off by a little or by anything, the filler size, duplicates, cuts), and random walk
arguments (the readable end, max count and bytes, CRC check, a TAG selection).  The walk must give
what the reference gives: index, count (``len(buffers)``), total, last offset seen, stop and the
runs' bytes, or raise the same exception; a crash is caught by running under AddressSanitizer
(``tests/fuzz/asan_fuzz_pull_lane.sh``).

Run::

    python tests/fuzz/fuzz_pull_lane.py --inputs 1000000 [--seed 1] [--json out.json]
    python tests/fuzz/fuzz_pull_lane.py --codec build/asan-pull/lib/tidemq/_native   # a given build

Exit status 1 at the first difference (the input is printed).  ``tests/test_pull_lane.py`` runs a
few thousand inputs of it.
"""

from __future__ import annotations

import argparse
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

CQ = struct.Struct(">qiq")
#: Tag codes (Java's String.hashCode): "Aa" and "BB" share 2112, "t" is 116.
CODES = {"Aa": 2112, "BB": 2112, "t": 116, "TagA": 2598919, "": 0}
TAGS: list[Any] = [
    None,
    ((2112,), (b"Aa",)),
    ((116, 2112), (b"BB", b"t")),
    ((0,), (b"",)),
    ((2598919,), (b"TagA",)),
]
INTERESTING_32 = [0, 1, 19, 20, 21, 47, 48, 49, 84, 88, 127, 128, 255, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF]
INTERESTING_32 += [0x80000000, 0xFFFFFFFF, 0xFFFFFFFE]
PROPS = [
    {},
    {"TAGS": "Aa"},
    {"TAGS": "BB", "KEYS": "k"},
    {"TAGS": "t"},
    {"TAGS": "TagA", "UNIQ_KEY": "7F000001000018B4AAC2"},
    {"TAGS": "\U0001f600"},
    {"a\x01b": "c", "TAGS": "t"},
]


class Mismatch(AssertionError):
    """The compiled walk and the reference disagreed on an input."""


def load_lane(path: str | None) -> ModuleType:
    """The compiled ``_pull_lane``: the installed one, or the build in the directory ``path``."""
    if path:
        (file,) = sorted(Path(path).glob("_pull_lane*.so"))
        name = "tidemq._native._pull_lane"
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None, file
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    import tidemq._native._pull_lane as module

    return module


def queue_file(rng: random.Random) -> tuple[bytearray, bytes]:
    """A commit-log file holding a queue's records (and others'), and the queue's entries."""
    from tidemq.message import MessageInner
    from tidemq.record import RecordEncoder

    encoder = RecordEncoder(("10.0.0.2", 10911))
    buf = bytearray()
    entries = []
    qoff = 0
    for _ in range(rng.randint(1, 8)):
        if rng.random() < 0.1:  # another queue's record between two of this one's
            topic, queue_id = rng.choice([("T", 2), ("U", 1), ("TT", 1)])
        else:
            topic, queue_id = "T", 1
        props = rng.choice(PROPS)
        msg = MessageInner(
            topic=topic,
            body=rng.randbytes(rng.choice([0, 1, 30, 200, 1024])),
            queue_id=queue_id,
            flag=0,
            properties=props,
            born_host=("10.0.0.1", 5555),
        )
        batch = encoder.prepare([msg])
        pos = len(buf)
        buf.extend(bytes(batch.total))
        encoder.write_into(buf, pos, batch, qoff if topic == "T" and queue_id == 1 else 0, pos, 1700000000000)
        if topic == "T" and queue_id == 1:
            entries.append(CQ.pack(pos, batch.total, CODES.get(props.get("TAGS", ""), 7)))
            qoff += 1
        if rng.random() < 0.05:  # a filler entry
            entries.append(CQ.pack(len(buf), 0x7FFFFFFF, 0))
    return buf, b"".join(entries)


def mutate_file(rng: random.Random, buf: bytearray) -> None:
    for _ in range(rng.randint(0, 4)):
        n = len(buf)
        op = rng.randrange(5)
        if op == 0 and n:
            buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif op == 1 and n >= 4:  # an interesting 32-bit value (a length field), maybe +-1
            at = rng.randrange(0, n - 3)
            value = (rng.choice(INTERESTING_32) + rng.choice([-1, 0, 0, 1])) & 0xFFFFFFFF
            buf[at : at + 4] = struct.pack(">I", value)
        elif op == 2 and n:  # truncated: the file's tail not written yet
            del buf[rng.randrange(n) :]
        elif op == 3 and n:  # zeroed bytes
            at = rng.randrange(n)
            end = min(n, at + rng.randint(1, 64))
            buf[at:end] = bytes(end - at)
        elif op == 4 and n:
            buf[rng.randrange(n)] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xC3, 0xED, 0xFF])


def mutate_entries(rng: random.Random, entries: bytes, n_file: int) -> bytes:
    out = [list(CQ.unpack_from(entries, i)) for i in range(0, len(entries), CQ.size)]
    for _ in range(rng.randint(0, 3)):
        if not out:
            break
        e = rng.choice(out)
        field = rng.randrange(3)
        if field == 0:
            e[0] = rng.choice(
                [e[0] + rng.randint(-4, 4), rng.randint(-8, n_file + 8), -(1 << 63), (1 << 63) - 1]
            )
        elif field == 1:
            e[1] = rng.choice(
                [e[1] + rng.randint(-4, 4), rng.randint(-4, n_file + 4), 0x7FFFFFFF, -(1 << 31), 0]
            )
        else:
            e[2] = rng.choice([0, 116, 2112, 7, -1, (1 << 63) - 1])
    if out and rng.random() < 0.1:
        out.insert(rng.randrange(len(out)), list(rng.choice(out)))
    data = b"".join(CQ.pack(_wrap(e[0], 64), _wrap(e[1], 32), _wrap(e[2], 64)) for e in out)
    if rng.random() < 0.05 and data:
        data = data[: rng.randrange(len(data))]  # a cut entry at the end
    return data


def _wrap(value: int, bits: int) -> int:
    """``value`` as a signed ``bits``-bit field holds it (two's complement)."""
    half = 1 << (bits - 1)
    return (value + half) % (half << 1) - half


def outcome(fn: Any, *args: Any) -> tuple:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - every exception is an outcome to compare
        return ("error", type(exc).__name__, str(exc))


def check(lane: ModuleType, rng: random.Random) -> int:
    """One input through the compiled walk and the reference; returns the records taken."""
    from tidemq.record import scan_queue

    buf, entries = queue_file(rng)
    mutate_file(rng, buf)
    entries = mutate_entries(rng, entries, len(buf))
    data = bytes(buf)
    view = memoryview(data)
    start = rng.choice([0, 0, 0, 20, 40])
    whole = len(entries) - len(entries) % CQ.size  # callers never pass a limit past the last whole entry
    limit = rng.choice([whole, whole, rng.randint(0, whole)])
    readable = rng.choice(
        [len(data), len(data), rng.randint(0, len(data))]
    )  # never past the mapping, as callers
    max_count, max_bytes = rng.choice([1, 2, 3, 8, 32]), rng.choice([1, 100, 1200, 4096, 1 << 18])
    check_crc, tags = rng.random() < 0.6, rng.choice(TAGS)
    args = (entries, start, limit, view, 0, readable, b"T", 1, 0, max_count, max_bytes, check_crc)
    got = outcome(lane.walk, *args, tags)
    if got[0] == "ok":
        i, count, total, last_phy, stop, runs = got[1]
        got = ("ok", (i, count, total, last_phy, stop, b"".join(runs)))
    bufs: list[Any] = []
    runs_ref: list[Any] = []
    want = outcome(scan_queue, *args, bufs, [], 0, runs_ref, tags)
    if want[0] == "ok":
        i, total, last_phy, stop = want[1]
        if b"".join(runs_ref) != b"".join(bufs):
            raise Mismatch("the reference's runs differ from its records")
        want = ("ok", (i, len(bufs), total, last_phy, stop, b"".join(runs_ref)))
    if got != want:
        raise Mismatch(
            f"walk on file {data.hex()}\n entries {entries.hex()}\n args {args[1:3]} {args[5]} {args[9:]} {tags}\n"
            f" compiled  {got!r}\n reference {want!r}"
        )
    return len(bufs)


def run(lane: ModuleType, inputs: int, seed: int, progress: bool = False) -> dict[str, Any]:
    rng = random.Random(seed)
    started = time.perf_counter()
    taken = walks_taking = 0
    for n in range(inputs):
        got = check(lane, rng)
        taken += got
        walks_taking += got > 0
        if progress and (n + 1) % 100_000 == 0:
            rate = (n + 1) / (time.perf_counter() - started)
            print(f"{n + 1} inputs, {rate:.0f}/s, all equal so far", file=sys.stderr, flush=True)
    return {
        "inputs": inputs,
        "seed": seed,
        "walks_taking_records": walks_taking,
        "records_taken": taken,
        "seconds": round(time.perf_counter() - started, 1),
        "outcome": "no difference, no crash",
        "module": lane.__file__,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    ap.add_argument(
        "--codec", help="directory of a build's tidemq._native modules (default: the installed one)"
    )
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    lane = load_lane(args.codec)
    print(f"fuzzing {lane.__file__} with seed {args.seed}", file=sys.stderr)
    try:
        summary = run(lane, args.inputs, args.seed, progress=True)
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
