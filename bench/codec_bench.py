"""Codec throughput: encode and decode rates of typical RocketMQ frames.

Prints one JSON object to stdout, e.g.
``{"send_request_json": {"encode_per_s": ..., "decode_per_s": ...}, ...}``.
Run: ``python bench/codec_bench.py [--n 50000]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=50_000, help="operations per measurement")
    args = ap.parse_args()
    results = {}
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
    print(json.dumps(results))


if __name__ == "__main__":
    main()
