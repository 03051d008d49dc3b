"""Fuzz the compiled HPACK decoder (tidemq_transport_grpc._hpack) against the ``hpack`` package.

    python tests/fuzz/fuzz_hpack.py [--inputs 1000000] [--seed 7] [--module PATH.so] [--compare 4]

Each input is a fresh pair of decoders fed 1-3 header blocks: blocks an ``hpack.Encoder`` made of
random header lists (Huffman or not, the names gRPC clients send and random ones; 2 000 such
sequences made first), then mutated
(bytes flipped, cut, repeated, spliced, table size updates put in front), or random bytes.  The
compiled decoder must answer a list of header fields or raise one of hpack's exceptions, never
anything else (and, under AddressSanitizer, ``tests/fuzz/asan_fuzz_hpack.sh``, never read or
write outside its buffers); every ``--compare``-th input (10th) is also decoded by ``hpack.Decoder``,
and where both decode a block the fields must be the same.  Exit status 1 on a difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from typing import Any

import hpack

NAMES = [
    ":method",
    ":path",
    ":scheme",
    ":authority",
    "content-type",
    "te",
    "grpc-timeout",
    "grpc-encoding",
    "user-agent",
    "x-mq-date-time",
    "x-mq-request-id",
    "x-mq-client-id",
    "authorization",
    "trace-bin",
]


def load(path: str | None) -> Any:
    if path is None:
        from tidemq_transport_grpc import _hpack

        return _hpack
    spec = importlib.util.spec_from_file_location("tidemq_transport_grpc._hpack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    out = []
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.7:
            name = rng.choice(NAMES).encode()
        else:
            name = bytes(rng.randrange(33, 127) for _ in range(rng.randint(1, 20))).lower()
        value = rng.randbytes(rng.choice((0, 1, 5, 16, 36, 100, 300)))
        out.append((name, value))
    return out


def mutate(rng: random.Random, block: bytes) -> bytes:
    data = bytearray(block)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        if choice < 0.35 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif choice < 0.5 and data:
            del data[rng.randrange(len(data)) :]
        elif choice < 0.6:
            data[0:0] = hpack.hpack.encode_integer(rng.choice((0, 100, 4096, 5000, 2**31)), 5)
            data[0] |= 0x20
        elif choice < 0.7 and data:
            start = rng.randrange(len(data))
            data[start:start] = data[start : start + rng.randint(1, 16)]
        elif choice < 0.8:
            data += rng.randbytes(rng.randint(1, 16))
        elif choice < 0.9 and data:  # a huge length or index
            data[rng.randrange(len(data)) :] = b"\x7f\xff\xff\xff\xff\x0f"
        else:
            data[rng.randrange(len(data) + 1) :] = b"\xff\xff\xff\xff\x7f"
    return bytes(data)


def seeds(rng: random.Random, count: int) -> list[list[bytes]]:
    """Sequences of blocks an encoder made (the inputs' starting points)."""
    out = []
    for _ in range(count):
        encoder = hpack.Encoder()
        out.append(
            [encoder.encode(headers(rng), huffman=rng.random() < 0.7) for _ in range(rng.randint(1, 3))]
        )
    return out


def blocks(rng: random.Random, pool: list[list[bytes]]) -> list[bytes]:
    if rng.random() < 0.1:
        return [rng.randbytes(rng.randint(0, 64))]
    made = list(rng.choice(pool))
    if rng.random() < 0.8:
        index = rng.randrange(len(made))
        made[index] = mutate(rng, made[index])
    return made


def decode(decoder: Any, block: bytes, raw: bool) -> Any:
    try:
        result = decoder.decode(block, raw=True) if raw else decoder.decode(block)
    except hpack.HPACKError as exc:
        return type(exc)
    return [(bytes(n), bytes(v)) for n, v in result]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--module", default=None, help="the compiled module's .so (default: the installed one)")
    ap.add_argument("--compare", type=int, default=10, help="decode every N-th input with hpack too")
    args = ap.parse_args()
    module = load(args.module)
    rng = random.Random(args.seed)
    start = time.monotonic()
    pool = seeds(rng, 2000)
    decoded = refused = compared = disagreed = 0
    for i in range(args.inputs):
        sequence = blocks(rng, pool)
        ours = module.Decoder(16384, 4096)
        theirs = None
        if i % args.compare == 0:
            theirs = hpack.Decoder(max_header_list_size=16384)
            theirs.max_allowed_table_size = 4096
        for block in sequence:
            try:
                mine = decode(ours, block, raw=False)
            except Exception as exc:  # only hpack's errors are allowed
                print(f"input {i}: {type(exc).__name__}: {exc} on {block.hex()}", file=sys.stderr)
                return 1
            if isinstance(mine, list):
                decoded += 1
            else:
                refused += 1
            if theirs is not None:
                reference = decode(theirs, block, raw=True)
                compared += 1
                if isinstance(mine, list) and isinstance(reference, list) and mine != reference:
                    print(f"input {i}: {mine!r} != hpack's {reference!r} on {block.hex()}", file=sys.stderr)
                    return 1
                if isinstance(mine, list) != isinstance(reference, list):
                    disagreed += 1
                    if disagreed <= 5:
                        print(
                            f"input {i}: accept/refuse differs: ours {mine if not isinstance(mine, list) else 'ok'}, "
                            f"hpack's {reference if not isinstance(reference, list) else 'ok'}: {block.hex()}",
                            file=sys.stderr,
                        )
            if not isinstance(mine, list):
                break  # a connection ends at its first bad block
    print(
        f"fuzz_hpack: {args.inputs} inputs, {decoded} blocks decoded, {refused} refused, {compared} compared "
        f"with hpack ({disagreed} accepted by one only), no difference, {time.monotonic() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
