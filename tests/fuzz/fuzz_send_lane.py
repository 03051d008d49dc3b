"""Fuzz the compiled send lane (``tidemq._native._send_lane.prepare_sends``) against the Python handler's reading.

Each input is a run of 1-4 requests: a valid SEND_MESSAGE_V2 header (as the official client writes
it) with 1-4 mutations (a field dropped, replaced by an interesting or random value of any type, a
long name added, the properties text cut, spliced or filled with separators, the code changed), and
a body.  The lane either refuses the run (None: the Python handler serves it) or gives sends; then
every send must be what the Python handler's own reading makes of its request (the header read by
``send_fields``/``field_*``, the properties by ``string_to_properties``, plus ``CLUSTER``), and the
handler must have accepted the request as a plain send.  Any exception out of the lane is a bug too
(it must refuse, not raise); a crash is caught by running under AddressSanitizer.

Run::

    python tests/fuzz/fuzz_send_lane.py --inputs 1000000 [--seed 1] [--json out.json]
    python tests/fuzz/fuzz_send_lane.py --codec build/asan/lib/tidemq/_native   # a given build (ASan)
    python tests/fuzz/fuzz_send_lane.py --atheris --inputs 1000000                # atheris drives it

Exit status 1 at the first difference (the input is printed).  ``tests/test_send_lane.py`` runs a
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

TOPICS = {"LaneTopic": 4, "Other": 8, "Zero": 0}
STRANGE = [
    "",
    "batch",
    "0",
    "-0",
    "1",
    "-1",
    "3",
    "4",
    "8",
    "12",
    " 1",
    "1 ",
    "+1",
    "1_0",
    "0x10",
    "٣",
    "1e3",
    "999999999999999999",
    "9999999999999999999",
    "-999999999999999999",
    "99999999999999999999",
    "true",
    "false",
    "TRUE",
    "\x00",
    "é",
    "\ud800",
    "LaneTopic",
    "%RETRY%G",
]
OBJECTS: list[Any] = [None, 1, -1, 2**70, 1.5, True, b"1", ["1"], {"a": 1}]
NAMES = list("abcdefghijklm") + ["topic", "queueId", "n", "z", "", "aa", "A", 1]
PROPERTY_PARTS = [
    "TAGS",
    "KEYS",
    "UNIQ_KEY",
    "CLUSTER",
    "DELAY",
    "TRAN_MSG",
    "TIMER_DELAY_SEC",
    "TIMER_OUT_MS",
]
PROPERTY_PARTS += ["\x01", "\x02", "\x01\x02", "", "v", "é", "\U0001f600", "\x00", "a\x01", "\x02\x02"]


#: V2's names to the long ones (processors/send.py V2_NAMES).
LONG = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
}


class Mismatch(AssertionError):
    pass


def load_lane(path: str | None) -> Any:
    """The compiled lane: the installed one, or the build in directory ``path`` (an ASan build)."""
    name = "tidemq._native._send_lane"
    if path:
        (file,) = sorted(Path(path).glob("_send_lane*.so"))
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def valid_header(rng: random.Random) -> dict[Any, Any]:
    from tidemq.message import properties_to_string

    props = {
        "UNIQ_KEY": f"{rng.getrandbits(64):032X}",
        "TAGS": rng.choice(["t", "TagA", ""]),
        "KEYS": "k1 k2",
    }
    return {
        "a": "PG",
        "b": rng.choice(list(TOPICS)),
        "c": "TBW102",
        "d": "4",
        "e": str(rng.randrange(0, 5)),
        "f": "0",
        "g": str(1_700_000_000_000 + rng.randrange(10**6)),
        "h": "0",
        "i": properties_to_string(props),
        "j": "0",
        "k": "false",
        "m": "false",
    }


def mutate(rng: random.Random, fields: dict[Any, Any]) -> None:
    for _ in range(rng.randrange(1, 5)):
        op = rng.randrange(8)
        key = rng.choice(list(fields) or ["a"])
        if op == 0:
            fields.pop(key, None)
        elif op == 1:
            fields[key] = rng.choice(STRANGE)
        elif op == 2:
            fields[key] = rng.choice(OBJECTS)
        elif op == 3:
            fields[rng.choice(NAMES)] = rng.choice(STRANGE)
        elif op == 4:
            text = str(fields.get("i", ""))
            cut = rng.randrange(len(text) + 1)
            fields["i"] = (
                text[:cut] + "".join(rng.choice(PROPERTY_PARTS) for _ in range(rng.randrange(4))) + text[cut:]
            )
        elif op == 5:
            fields["i"] = "".join(rng.choice(PROPERTY_PARTS) for _ in range(rng.randrange(12)))
        elif op == 6:
            fields[key] = "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(6)))
        else:
            fields["e"] = str(rng.randrange(-2, 10))


def batch_body(rng: random.Random) -> bytes:
    """A SEND_BATCH_MESSAGE body (as a client encodes it), sometimes cut or with a byte changed."""
    from tidemq.message import BatchItem
    from tidemq.record import encode_batch

    items = [
        BatchItem(
            rng.randbytes(rng.randrange(0, 40)),
            rng.choice([0, 1, -1]),
            {
                "UNIQ_KEY": f"{rng.getrandbits(64):X}",
                **({"TIMER_DELAY_SEC": "5"} if rng.random() < 0.05 else {}),
            },
        )
        for _ in range(rng.randrange(0, 4))
    ]
    body = bytearray(encode_batch(items))
    if body and rng.random() < 0.3:
        if rng.random() < 0.5:
            del body[rng.randrange(len(body)) :]
        else:
            body[rng.randrange(len(body))] = rng.randrange(256)
    return bytes(body)


def make_run(rng: random.Random) -> list[Any]:
    from tidemq.remoting import RemotingCommand
    from tidemq.remoting.codes import RequestCode

    run = []
    for _ in range(rng.randrange(1, 5)):
        fields = valid_header(rng)
        if rng.random() < 0.8:
            mutate(rng, fields)
        roll = rng.random()
        if roll < 0.3:
            code, body = RequestCode.SEND_BATCH_MESSAGE, batch_body(rng)
        else:
            code = RequestCode.SEND_MESSAGE_V2 if roll < 0.95 else rng.choice([10, 0, 310])
            body = rng.randbytes(rng.randrange(0, 64))
        if rng.random() < 0.2:  # a signed request's names (the ACL's), or one that only looks like them
            for name in rng.sample(ACL_NAMES + ("AccessKeyX", "signature"), rng.randrange(1, 4)):
                fields[name] = rng.choice(["", "ak-1234567", "c2lnbmF0dXJl/+=", "é"])
        if rng.random() < 0.25:  # the long names, as the official C++ client writes them
            fields = {LONG.get(k, k): v for k, v in fields.items()}
            if rng.random() < 0.5:
                fields["AccessKey"] = ""
            code = rng.choice([10, 10, 320, 310])
        cmd = RemotingCommand(int(code), opaque=1, ext_fields=fields, body=body)
        if rng.random() < 0.05:
            cmd.body_parts = (b"part",)
        run.append(cmd)
    return run


#: A signed request's names (tidemq.acl), which the send handler passes through and never reads.
ACL_NAMES = ("AccessKey", "Signature", "SecurityToken", "OnsChannel")
_V2_SHORT = frozenset("abcdefghijklm")


def writable_queues(topic: str) -> int:
    return TOPICS.get(topic, -1)


def reference(request: Any, cluster: str, born: Any, store: Any) -> Any:
    """The Python handler's reading of one request, as the lane would have to make it: the message
    and send fields, or a string saying why the handler serves it another way."""
    from tidemq.broker.headers import field_bool, field_int, field_str
    from tidemq.broker.processors.send import send_fields
    from tidemq.message import MessageInner, string_to_properties

    if request.code not in (10, 310, 320):
        return "another code"
    try:
        fields, keys = send_fields(request)
        if fields is not request.ext_fields and not set(request.ext_fields) - _V2_SHORT <= set(ACL_NAMES):
            return "renamed header"  # V2 names mixed with others: the handler renames a copy
        # (mixed only with a signed request's names, the copy reads as the V2 names: the lane takes it)
        get = fields.get
        if request.code == 320 or field_bool(get(keys[0])):
            return reference_batch(request, get, keys, born, store)
        group = field_str(get(keys[1]), "producerGroup", "S", "")
        topic = field_str(get(keys[2]), "topic", "S")
        queue_id = field_int(get(keys[3]), "queueId", "S", -1)
        sys_flag = field_int(get(keys[4]), "sysFlag", "S", 0)
        field_str(get(keys[5]), "defaultTopic", "S", "TBW102")
        field_int(get(keys[6]), "defaultTopicQueueNums", "S", 4)
        properties = field_str(get(keys[7]), "properties", "S", "")
        reconsume = field_int(get(keys[8]), "reconsumeTimes", "S", 0)
        flag = field_int(get(keys[10]), "flag", "S", 0)
        born_ts = field_int(get(keys[11]), "bornTimestamp", "S", 0)
    except Exception as exc:
        return f"refused: {exc}"
    count = writable_queues(topic)
    if count < 0 or not 0 <= queue_id < count:
        return "topic or queue checks"
    if sys_flag & (3 << 2):
        return "transaction"
    props = string_to_properties(properties)
    if any(
        name in props
        for name in (
            "TRAN_MSG",
            "DELAY",
            "TIMER_DELIVER_MS",
            "TIMER_DELAY_SEC",
            "TIMER_DELAY_MS",
            "TIMER_OUT_MS",
        )
    ):
        return "rewritten"
    props["CLUSTER"] = cluster
    body = request.payload()
    msg = MessageInner(topic, body, queue_id, flag, props, sys_flag, born_ts, born, store, reconsume)
    return (group, [msg], queue_id, len(body), False)


def reference_batch(request: Any, get: Any, keys: Any, born: Any, store: Any) -> Any:
    """``SendHandler._prepare_batch`` and ``SendService.prepare_batch``'s reading of a batch."""
    from tidemq.broker.headers import field_int, field_str
    from tidemq.errors import CorruptDataError
    from tidemq.message import decode_batch_messages

    try:
        group = field_str(get(keys[1]), "producerGroup", "S", "")
        topic = field_str(get(keys[2]), "topic", "S")
        queue_id = field_int(get(keys[3]), "queueId", "S", -1)
        sys_flag = field_int(get(keys[4]), "sysFlag", "S", 0)
        field_str(get(keys[5]), "defaultTopic", "S", "TBW102")
        field_int(get(keys[6]), "defaultTopicQueueNums", "S", 4)
        reconsume = field_int(get(keys[8]), "reconsumeTimes", "S", 0)
        born_ts = field_int(get(keys[11]), "bornTimestamp", "S", 0)
    except Exception as exc:
        return f"refused: {exc}"
    count = writable_queues(topic)
    if count < 0 or not 0 <= queue_id < count:
        return "topic or queue checks"
    if sys_flag & (3 << 2):
        return "transaction"
    body = request.payload()
    try:
        msgs = decode_batch_messages(body, 64, topic, queue_id, sys_flag, born_ts, born, store, reconsume)
    except CorruptDataError as exc:
        return f"bad batch: {exc}"
    if not msgs:
        return "empty batch"
    if any(
        name in m.properties
        for m in msgs
        for name in ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
    ):
        return "timer"
    return (group, msgs, msgs[0].queue_id, len(body), True)


def check(lane: Any, run: list[Any], stats: dict[str, int]) -> None:
    from tidemq.broker.services.put import Send

    cluster, born, store = "DefaultCluster", ("10.0.0.1", 4000), ("127.0.0.1", 10911)
    try:
        sends = lane.prepare_sends(run, writable_queues, cluster, 64, born, store)
    except BaseException as exc:
        raise Mismatch(f"the lane raised {exc!r}") from exc
    refs = [reference(r, cluster, born, store) for r in run]
    if sends is None:
        stats["refused"] += 1
        if all(type(r) is tuple for r in refs):
            stats["refused_though_plain"] += 1  # allowed (conservative), counted
        return
    stats["served"] += 1
    if len(sends) != len(run):
        raise Mismatch(f"{len(sends)} sends for {len(run)} requests")
    for send, ref in zip(sends, refs, strict=True):
        if type(ref) is not tuple:
            raise Mismatch(f"the lane served what the handler would not take as a plain send: {ref}")
        group, msgs, queue_id, nbytes, batch = ref
        got = (send.producer_group, send.msgs, send.queue_id, send.nbytes, send.batch, send.ctx)
        want = (group, msgs, queue_id, nbytes, batch, None)
        if got != want:
            raise Mismatch(f"lane {got!r} != handler {want!r}")
        same_objects(send, Send(group, msgs, batch, None, queue_id, nbytes))


_UNSET = object()


def _typed(value: Any) -> Any:
    """A value with its type and, for a dict, its order (the stored properties follow it)."""
    if type(value) is dict:
        return ("dict", [(_typed(k), _typed(v)) for k, v in value.items()])
    if type(value) is list:
        return ("list", [_typed(v) for v in value])
    if type(value) is tuple:
        return ("tuple", [_typed(v) for v in value])
    return (type(value).__name__, value)


def same_objects(send: Any, want: Any) -> None:
    """The lane's send is what the class makes of the handler's reading: every slot (set or not)
    of the same type and value, each message's fields likewise, properties in the same order (the
    lane builds them without the classes' ``__init__``)."""
    import attrs

    from tidemq.message import MessageInner

    if type(send) is not type(want):
        raise Mismatch(f"a {type(send).__name__}, not a {type(want).__name__}")
    for name in type(want).__slots__:
        if name == "msgs":
            continue
        got, ref = getattr(send, name, _UNSET), getattr(want, name, _UNSET)
        if (got is _UNSET) != (ref is _UNSET) or _typed(got) != _typed(ref):
            raise Mismatch(f"Send.{name}: lane {got!r} != class {ref!r}")
    if type(send.msgs) is not list or len(send.msgs) != len(want.msgs):
        raise Mismatch(f"messages: lane {send.msgs!r} != handler {want.msgs!r}")
    for msg, ref in zip(send.msgs, want.msgs, strict=True):
        if type(msg) is not MessageInner:
            raise Mismatch(f"a {type(msg).__name__}, not a MessageInner")
        for field in attrs.fields(MessageInner):
            got, exp = getattr(msg, field.name), getattr(ref, field.name)
            if _typed(got) != _typed(exp):
                raise Mismatch(f"MessageInner.{field.name}: lane {got!r} != handler {exp!r}")


def run(lane: Any, inputs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    stats = {"served": 0, "refused": 0, "refused_though_plain": 0}
    started = time.perf_counter()
    for i in range(inputs):
        batch = make_run(rng)
        try:
            check(lane, batch, stats)
        except Mismatch:
            print(
                f"input {i} (seed {seed}): {[(r.code, r.ext_fields, r.body) for r in batch]!r}",
                file=sys.stderr,
            )
            raise
        if i and i % 100_000 == 0:
            print(f"{i} inputs, {stats}", file=sys.stderr, flush=True)
    return {"inputs": inputs, "seed": seed, "runs": stats, "seconds": round(time.perf_counter() - started, 1)}


def run_atheris(lane: Any, inputs: int) -> dict[str, Any]:
    import atheris

    stats = {"served": 0, "refused": 0, "refused_though_plain": 0}

    def one(data: bytes) -> None:
        rng = random.Random(data)  # the fuzzer's bytes choose the run
        check(lane, make_run(rng), stats)

    started = time.perf_counter()
    atheris.Setup([sys.argv[0], f"-runs={inputs}", "-print_final_stats=0"], one)
    try:
        atheris.Fuzz()
    except SystemExit:
        pass
    return {
        "inputs": inputs,
        "driver": "atheris",
        "runs": stats,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    ap.add_argument("--codec", help="directory of a build of tidemq._native (an ASan build)")
    ap.add_argument("--atheris", action="store_true", help="let atheris drive the inputs")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    lane = load_lane(args.codec)
    try:
        summary = run_atheris(lane, args.inputs) if args.atheris else run(lane, args.inputs, args.seed)
        summary["outcome"] = "no difference, no exception"
        status = 0
    except Mismatch as exc:
        summary = {"outcome": f"difference: {exc}"}
        status = 1
    summary["lane"] = lane.__file__
    summary["asan"] = "libasan" in os.environ.get("LD_PRELOAD", "")
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
