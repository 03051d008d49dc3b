"""Fuzz the send lane's compiled wire ends (``tidemq._native._frame_lane``) against the codec.

Each input is a read: 1-4 frames (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_MESSAGE and now and
then another code or a oneway flag; JSON or ROCKETMQ headers as the clients write them, with
random header fields, remarks and bodies), then 0-4 mutations of the bytes (a byte flipped, bytes
inserted or cut, a length field or the serialize type rewritten, the JSON header replaced by a
variant the decoder reads slowly or refuses, the read cut short), or now and then random bytes.

``take_frames`` must not raise, and what it takes must be what :class:`FrameDecoder` reads from the
same bytes (``command_of`` of each frame equals the decoder's command, no error in between), all
plain send requests.  For a share of the inputs the taken frames get random sends (statuses,
remarks, regions and trace flags of any text, epochs) and ``answer_frames`` must write exactly
``encode(send_response(...))``, or None only where the lane leaves the answer to it.

The compiled JSON header reader (``fast_header``) must read each JSON header of the read, and a
mutated official-client V2 header per input, as orjson's path (``orjson_header``, the reference)
does, types and dict order included, or leave it to that path (None).

Run::

    python tests/fuzz/fuzz_frame_lane.py --inputs 1000000 [--seed 1] [--json out.json]
    python tests/fuzz/fuzz_frame_lane.py --codec build/asan-frame/lib/tidemq/_native   # an ASan build

Exit status 1 at the first difference (the input is printed).  ``tests/test_frame_lane.py`` runs a
few thousand inputs of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

SEND_CODES = (310, 320, 10)
TEXTS = [
    "",
    "a",
    "LaneTopic",
    "é",
    "区域",
    '"',
    "\\",
    "\n",
    "\x00",
    "\x01\x02",
    "\x7f",
    "\ud7ff",
    "😀",
    "x" * 40,
    "DefaultRegion",
    "true",
    "false",
]
JSON_VARIANTS = [
    b'{"code":"310","opaque":1,"flag":0,"extFields":{}}',
    b'{"code":310,"opaque":"1","flag":0,"extFields":{}}',
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"a":1}}',
    b'{"code":310,"opaque":1,"flag":0,"extFields":null}',
    b'{"code":310,"opaque":1,"flag":0}',
    b'{"code":310,"opaque":1,"language":3,"extFields":{}}',
    b'{"code":310,"opaque":1,"remark":[1],"extFields":{}}',
    b'{"code":310,"opaque":99999999999,"extFields":{}}',
    b'{"code":310,"opaque":-1,"flag":0,"extFields":{"b":"T"},"extFields":{"b":"U"}}',
    b'{"code":320,"extFields":{"b":"\\u00e9"}}',
    b'{"code":310,"opaque":1,"flag":0.0,"extFields":{}}',
    b'{"code":310,"opaque":1,"flag":0,"extFields":{"b":"\\ud800"}}',
    # what rocketmq-client-cpp writes when it signs: numbers among the ext fields, a newline
    b'{"code":10,"extFields":{"AccessKey":"ak","queueId":0,"sysFlag":0,"topic":"T"},"flag":0,'
    b'"language":"CPP","opaque":3,"remark":"","version":63}\n',
    b'{"code":310,"extFields":{"k":true,"m":false,"n":null,"f":-1.5e-7,"o":{"x":[1,"y"]},"l":[]}}',
    b'{"code":310,"extFields":{"d":-0,"e":12345678901234567890123,"g":1E2}}',
    b"[]",
    b"",
    b"{",
    b"null",
]


class Mismatch(AssertionError):
    pass


def load(path: str | None) -> Any:
    """The compiled module: the installed one, or the build in directory ``path`` (an ASan build)."""
    name = "tidemq._native._frame_lane"
    if path:
        (file,) = sorted(Path(path).glob("_frame_lane*.so"))
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def text(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(TEXTS)
    return "".join(
        chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0, 0x800), 0x2028]))
        for _ in range(rng.randrange(6))
    )


def command(rng: random.Random) -> Any:
    from tidemq.remoting import RemotingCommand
    from tidemq.remoting.codes import SerializeType

    code = rng.choice(SEND_CODES) if rng.random() < 0.9 else rng.choice([11, 34, 0, -1, 32767])
    fields = {"a": "PG", "b": "LaneTopic", "e": str(rng.randrange(-1, 5)), "i": "UNIQ_KEY\x01AB\x02TAGS\x01t"}
    for _ in range(rng.randrange(3)):
        fields[text(rng)] = text(rng)
    if rng.random() < 0.2:
        fields = {text(rng): text(rng) for _ in range(rng.randrange(4))}
    return RemotingCommand(
        code,
        rng.choice(["JAVA", "CPP", "PYTHON", "GO", "OTHER"]),
        rng.choice([0, 63, 399, -1]),
        rng.choice([0, 1, rng.randrange(-(2**31), 2**31)]),
        0 if rng.random() < 0.9 else rng.choice([1, 2, 3]),
        rng.choice([None, None, "", text(rng)]),
        fields,
        rng.choice([None, b"", rng.randbytes(rng.randrange(64))]),
        (),
        rng.choice([SerializeType.JSON, SerializeType.ROCKETMQ]),
    )


def frame_bytes(rng: random.Random) -> bytes:
    from tidemq.remoting.codec import encode_bytes

    try:
        raw = encode_bytes(command(rng))
    except Exception:  # a text the codec cannot encode (a lone surrogate): some other frame
        raw = b""
    if rng.random() < 0.05:
        header = rng.choice(JSON_VARIANTS)
        body = rng.randbytes(rng.randrange(8))
        raw = (
            (4 + len(header) + len(body)).to_bytes(4, "big") + len(header).to_bytes(4, "big") + header + body
        )
    return raw


def mutate(rng: random.Random, data: bytearray) -> None:
    if not data:
        return
    kind = rng.randrange(7)
    at = rng.randrange(len(data))
    if kind == 0:
        data[at] ^= rng.randrange(1, 256)
    elif kind == 1:
        data[at:at] = rng.randbytes(rng.randrange(1, 6))
    elif kind == 2:
        del data[at : at + rng.randrange(1, 8)]
    elif kind == 3:  # a length field: the frame's or the header's
        pos = rng.choice([0, 4])
        data[pos : pos + 4] = rng.choice([0, 3, 4, 5, 2**24, 2**31, rng.randrange(2**32)]).to_bytes(4, "big")
    elif kind == 4 and len(data) > 4:  # the serialize type byte
        data[4] = rng.choice([0, 1, 2, 0x80, 0xFF])
    elif kind == 5:
        del data[rng.randrange(len(data)) :]
    else:
        data[at] = rng.choice([0, 0x7F, 0x80, 0xFF, 0x22, 0x5C])


def make_read(rng: random.Random) -> bytes:
    if rng.random() < 0.02:
        return rng.randbytes(rng.randrange(64))
    data = bytearray(b"".join(frame_bytes(rng) for _ in range(rng.randrange(1, 5))))
    for _ in range(rng.choice([0, 0, 1, 1, 2, 4])):
        mutate(rng, data)
    return bytes(data)


def _sends(rng: random.Random, n: int) -> list[Any]:
    from tidemq.broker.services.put import Send
    from tidemq.broker.services.status import Status
    from tidemq.message import MessageInner

    statuses = list(Status)
    out = []
    for _ in range(n):
        props = {"UNIQ_KEY": "K"}
        if rng.random() < 0.5:
            props["MSG_REGION"] = text(rng)
        if rng.random() < 0.5:
            props["TRACE_ON"] = text(rng)
        msg = MessageInner("T", b"x", 1, 0, props, 0, 0, ("127.0.0.1", 1), ("127.0.0.1", 2), 0)
        send = Send("PG", [msg], False, None, rng.randrange(-1, 1 << 40), 1)
        send.status = rng.choice(statuses) if rng.random() < 0.3 else Status.SUCCESS
        send.remark = rng.choice([None, None, "", text(rng)])
        send.epoch = rng.choice([None, None, 0, rng.randrange(1 << 40)])
        send.msg_id = rng.choice(["7F00000100002A9F0000000000001234", text(rng)])
        send.queue_offset = rng.randrange(-1, 1 << 62)
        send.recall_handle = None if rng.random() < 0.95 else "h"
        out.append(send)
    return out


def check(lane: Any, data: bytes, rng: random.Random, stats: dict[str, int]) -> None:
    from tidemq.broker.processors.send import send_response
    from tidemq.broker.services.put import STORED
    from tidemq.remoting import FrameDecoder, ProtocolError
    from tidemq.remoting.codec import encode_bytes

    try:
        frames, end = lane.take_frames(data, 1 << 20)
    except Exception as exc:
        raise Mismatch(f"take_frames raised {exc!r}") from exc
    if not (0 <= end <= len(data)) or (end == 0) != (not frames):
        raise Mismatch(f"take_frames gave {len(frames)} frames ending at {end} of {len(data)}")
    if not frames:
        stats["none_taken"] += 1
        return
    stats["taken"] += 1
    stats["frames"] += len(frames)
    decoder = FrameDecoder(1 << 20)
    try:
        decoded = decoder.feed(data[:end])
    except ProtocolError as exc:
        raise Mismatch(f"the decoder refuses what the lane took: {exc}") from exc
    if decoder.error_pending or decoder.buffered:
        raise Mismatch("the decoder has an error or bytes left in what the lane took")
    commands = [lane.command_of(f) for f in frames]
    if commands != decoded:
        raise Mismatch(f"read differently:\n lane {commands}\n codec {decoded}")
    for cmd in commands:
        if cmd.code not in SEND_CODES or cmd.flag != 0 or not -(2**31) <= cmd.opaque < 2**31:
            raise Mismatch(f"took a frame it must leave: {cmd}")
    if rng.random() < 0.3:
        sends = _sends(rng, len(frames))
        expected = []
        for cmd, send in zip(commands, sends, strict=True):
            try:
                expected.append(encode_bytes(send_response(cmd, send)))
            except Exception:
                expected.append(None)
        try:
            got = lane.answer_frames(frames, sends)
        except Exception as exc:
            raise Mismatch(f"answer_frames raised {exc!r}") from exc
        if got is None:
            stats["answers_left"] += 1
            if not any(
                e is None or s.status not in STORED or s.recall_handle is not None
                for e, s in zip(expected, sends, strict=True)
            ):
                raise Mismatch("answer_frames left answers it can write")
        else:
            stats["answers_written"] += 1
            if None in expected or got != b"".join(expected):  # type: ignore[arg-type]
                raise Mismatch(f"answers differ:\n lane {got!r}\n codec {expected!r}")


def json_headers(data: bytes) -> list[bytes]:
    """The JSON headers of the frames at the start of ``data`` (as far as their lengths hold)."""
    out = []
    pos = 0
    while len(data) - pos >= 8:
        total = int.from_bytes(data[pos : pos + 4], "big")
        info = int.from_bytes(data[pos + 4 : pos + 8], "big")
        hlen = info & 0xFFFFFF
        if info >> 24 == 0 and hlen <= len(data) - pos - 8:
            out.append(data[pos + 8 : pos + 8 + hlen])
        if total < 4:
            break
        pos += 4 + total
    return out


def same(a: Any, b: Any) -> bool:
    """Equal, with equal types, dicts with their items in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check_header(lane: Any, header: bytes, stats: dict[str, int]) -> None:
    """The compiled header reader gives orjson's reading (the reference) or leaves the header to it."""
    try:
        fast = lane.fast_header(header)
    except Exception as exc:
        raise Mismatch(f"fast_header raised {exc!r} on {header!r}") from exc
    if fast is None:
        stats["headers_left_to_orjson"] += 1
        return
    stats["headers_read"] += 1
    ref = lane.orjson_header(header)
    if ref is None or not same(fast, ref):
        raise Mismatch(f"header read differently:\n fast {fast!r}\n orjson {ref!r}")


def header_variant(rng: random.Random) -> bytes:
    """An official client's V2 header (escaped properties), mutated as text or as bytes."""
    import orjson

    fields = {k: text(rng) if rng.random() < 0.2 else v for k, v in V2_FIELDS.items()}
    head = {
        "code": rng.choice([310, 320, 10, 11]),
        "language": "JAVA",
        "version": 399,
        "opaque": 5,
        "flag": 0,
    }
    if rng.random() < 0.3:
        head["remark"] = text(rng)
    head["extFields"] = fields
    items = list(head.items())
    if rng.random() < 0.3:
        rng.shuffle(items)
    raw = bytearray(orjson.dumps(dict(items)))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        if not raw:
            break
        at = rng.randrange(len(raw))
        kind = rng.randrange(6)
        if kind == 0:
            raw[at] ^= rng.randrange(1, 256)
        elif kind == 1:
            raw[at:at] = rng.choice(
                [b"\\", b"\\u", b"\\u00", b'"', b",", b":", b" ", b"-", b"0", b"e", b"\xc3", b"\xed\xa0\x80"]
            )
        elif kind == 2:
            del raw[at : at + rng.randrange(1, 4)]
        elif kind == 3:
            raw[at:at] = rng.choice([b"\\u0041", b"\\u00e9", b"\\ud83d\\ude00", b"\\n", b"\\/", b"\\x"])
        elif kind == 4:
            del raw[at:]
        else:
            raw[at] = rng.choice([0x30, 0x2D, 0x22, 0x5C, 0x7B, 0x7D, 0x80, 0x7F, 0x00])
    return bytes(raw)


#: The official client's SEND_MESSAGE_V2 fields, properties escaped by the JSON encoder.
V2_FIELDS = {
    "a": "PG",
    "b": "LaneTopic",
    "c": "TBW102",
    "d": "4",
    "e": "1",
    "f": "0",
    "g": "1795902904146",
    "h": "0",
    "j": "0",
    "k": "false",
    "m": "false",
    "i": "WAIT\x01true\x02UNIQ_KEY\x0121930000000000\x02",
}


def run(lane: Any, inputs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    stats = {
        "taken": 0,
        "none_taken": 0,
        "frames": 0,
        "answers_written": 0,
        "answers_left": 0,
        "headers_read": 0,
        "headers_left_to_orjson": 0,
    }
    started = time.perf_counter()
    for i in range(inputs):
        data = make_read(rng)
        try:
            check(lane, data, rng, stats)
            for header in json_headers(data):
                check_header(lane, header, stats)
            check_header(lane, header_variant(rng), stats)
        except Mismatch:
            print(f"input {i} (seed {seed}): {data!r}", file=sys.stderr)
            raise
        if i and i % 100_000 == 0:
            print(f"{i} inputs, {stats}", file=sys.stderr, flush=True)
    return {
        "inputs": inputs,
        "seed": seed,
        "reads": stats,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    ap.add_argument("--codec", help="directory of a build of tidemq._native (an ASan build)")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    lane = load(args.codec)
    try:
        summary = run(lane, args.inputs, args.seed)
        summary["outcome"] = "no difference, no exception"
        status = 0
    except Mismatch as exc:
        summary = {"outcome": f"difference: {exc}"}
        status = 1
    summary["module"] = lane.__file__
    summary["asan"] = "libasan" in os.environ.get("LD_PRELOAD", "")
    text_out = json.dumps(summary, indent=2)
    print(text_out)
    if args.json:
        Path(args.json).write_text(text_out + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
