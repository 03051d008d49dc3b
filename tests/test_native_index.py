"""The compiled index code (``tidemq_index_hash._native``) against the pure-Python reference.

Differential, property-based: the hash of any bytes equals the ``blake3`` package's (the on-disk
files use it); ``key_hash`` and ``hash_batch`` give the reference's results, or raise its
exception; ``put_batch`` leaves an IndexFile byte for byte as ``IndexFile.py_put_batch`` does,
stopping at the same place; and a whole index fed the same batches through either path ends with
byte-identical files and the same answer to every query.  Skipped when the extension is not built,
unless ``TIDEMQ_REQUIRE_EXTENSIONS=1`` (CI): then missing it fails.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tidemq._native as core_native
import tidemq_index_hash.native as native
import tidemq_index_hash.service as service
from tidemq.message import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK, Prop
from tidemq_index_hash import indexfile
from tidemq_index_hash.indexfile import IndexFile, py_hash_batch, py_key_hash
from tidemq_index_hash.service import HashIndex, HashIndexOptions

REQUIRED = os.environ.get("TIDEMQ_REQUIRE_EXTENSIONS", "") not in ("", "0")
try:  # directly, whatever TIDEMQ_NO_EXTENSIONS selects for the index
    _compiled: ModuleType | None = importlib.import_module("tidemq_index_hash._native")
    _missing = ""
except ImportError as exc:
    _compiled, _missing = None, str(exc)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = 1_767_225_600_000


@pytest.fixture(scope="module")
def C() -> ModuleType:
    if _compiled is None:
        if REQUIRED:
            pytest.fail(f"TIDEMQ_REQUIRE_EXTENSIONS is set but the compiled index is missing: {_missing}")
        pytest.skip(f"the compiled index is not built ({_missing}): pip install -e . with a C compiler")
    return _compiled


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args))
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
        return ("error", type(exc))


def package_hash(data: bytes) -> int:
    return int.from_bytes(blake3.blake3(data).digest(4), "big") & 0x7FFFFFFF


# ---------------------------------------------------------------------------- the switch
@pytest.mark.parametrize("value", ["", "0", "1", "yes"])
def test_one_switch_for_the_codec_and_the_index(value: str) -> None:
    assert native.DISABLE_VARIABLE == core_native.DISABLE_VARIABLE
    code = (
        "import tidemq._native as c, tidemq_index_hash.native as i; print(c.DESCRIPTION, '|', i.DESCRIPTION)"
    )
    env = {k: v for k, v in os.environ.items() if k != native.DISABLE_VARIABLE}
    env[native.DISABLE_VARIABLE] = value
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    codec, index = (part.strip() for part in out.stdout.split("|"))
    off = f"pure Python ({native.DISABLE_VARIABLE}=1)"
    assert (codec == off) == (index == off) == (value in ("1", "yes"))
    if _compiled is not None and value in ("", "0"):
        assert index.startswith("compiled (tidemq_index_hash._native")


# ---------------------------------------------------------------------------- the hash
def test_layout_constants_agree(C: ModuleType) -> None:
    assert C.LAYOUT == {
        "HEADER_SIZE": indexfile.HEADER_SIZE,
        "SLOT_SIZE": indexfile.SLOT_SIZE,
        "ENTRY_SIZE": indexfile.ENTRY_SIZE,
        "SLOT_CHUNK": indexfile.SLOT_CHUNK,
        "ENTRY_WINDOW": indexfile.ENTRY_WINDOW,
        "TRANSACTION_TYPE_MASK": TRANSACTION_TYPE_MASK,
        "TRANSACTION_ROLLBACK_TYPE": TRANSACTION_ROLLBACK_TYPE,
    }


def test_hash_at_every_length_around_block_and_chunk_boundaries(C: ModuleType) -> None:
    data = bytes(range(256)) * 9
    for n in range(0, 1100):
        assert C.bytes_hash(data[:n]) == package_hash(data[:n]), n
    for n in (2047, 2048, 2049):  # beyond one chunk: the package
        assert C.bytes_hash(data[:n]) == package_hash(data[:n]), n


@SETTINGS
@given(st.binary(max_size=2100))
def test_hash_of_any_bytes_is_blake3(C: ModuleType, data: bytes) -> None:
    assert C.bytes_hash(data) == package_hash(data)


@SETTINGS
@given(st.text(max_size=600) | st.text(alphabet=st.characters(), min_size=1000, max_size=1100))
def test_key_hash_matches_the_reference(C: ModuleType, key: str) -> None:
    # Lone surrogates: both raise UnicodeEncodeError (no put carries them: records encode strictly).
    assert outcome(C.key_hash, key) == outcome(py_key_hash, key)
    if outcome(py_key_hash, key)[0] == "ok":
        assert C.package_key_hash(key) == py_key_hash(key)


def test_keys_of_one_block_hashed_side_by_side_are_blake3(C: ModuleType) -> None:
    # tqi_hash_lanes hashes keys of at most 64 bytes 8 at a time (vectors); each lane must be the
    # one-by-one hash and the package's, at every length, with lanes of different lengths.
    data = bytes(range(7, 256)) * 2
    keys = [data[i % 31 : i % 31 + n] for i, n in enumerate(list(range(65)) * 8)]
    keys += [bytes(64)] * 8 + [b""] * 8 + [os.urandom(n) for n in range(64, 0, -1)]
    keys += [b"\xff" * (i % 65) for i in range(-len(keys) % 8)]
    lanes, single = C.hash_lanes_check(keys)
    assert lanes == single == [package_hash(k) for k in keys]


def test_a_put_s_keys_of_every_length_hash_as_the_reference_s(C: ModuleType) -> None:
    # A batch mixing keys of one block (hashed 8 at a time), longer ones (one by one), beyond one
    # chunk (the package) and groups left incomplete at the end: the reference's hashes, in order.
    props: list[dict[str, str]] = []
    for n in [*range(0, 70), 1030, 3, 5, 200, 55, 58, 59, 60, 61, 62, 63, 64, 65]:
        keys = " ".join(f"k{i}" + "x" * n for i in range(n % 4))
        props.append({Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U" * n, Prop.KEYS: keys})
    flags = [0] * len(props)
    for topic in ("TopicTest", "T" * 127, ""):
        for end in (len(props), 9, 8, 7, 1):
            assert C.hash_batch(topic, props[:end], flags[:end], 0) == py_hash_batch(
                topic, props[:end], flags[:end], 0
            )


# ---------------------------------------------------------------------------- hash_batch
_KEY = st.text(alphabet=st.sampled_from("ab é中\U0001f600#"), max_size=12)
_PROPS = st.fixed_dictionaries(
    {},
    optional={
        Prop.KEYS: st.one_of(_KEY, st.lists(_KEY, max_size=4).map(" ".join), st.just("  a  b ")),
        Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: st.one_of(_KEY, st.just("")),
        Prop.TAGS: st.just("t"),
    },
)
_FLAGS = st.sampled_from([0, 1, 4, 8, 12, 0x8C, 0x10C])
_TOPIC = st.sampled_from(["TopicTest", "Tópico", "T" * 127, "%RETRY%g", ""])


@SETTINGS
@given(_TOPIC, st.lists(st.tuples(_PROPS, _FLAGS), max_size=12), st.integers(-1, 13))
def test_hash_batch_matches_the_reference(
    C: ModuleType, topic: str, messages: list[tuple[dict[str, str], int]], skip_before: int
) -> None:
    props = [p for p, _ in messages]
    flags = [f for _, f in messages]
    assert C.hash_batch(topic, props, flags, skip_before) == py_hash_batch(topic, props, flags, skip_before)
    # Tuples and other sequences take the same answer.
    assert C.hash_batch(topic, tuple(props), tuple(flags), skip_before) == py_hash_batch(
        topic, props, flags, skip_before
    )


@pytest.mark.parametrize(
    ("props", "flags"),
    [
        ([{Prop.KEYS: 5}], [0]),  # not a string: the reference's exception
        ([{Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: b"u"}], [0]),
        ([{Prop.KEYS: "a\udc80b"}], [0]),  # does not encode
        ([{Prop.KEYS: "a"}], [2**70]),  # a flag beyond a C long
        ([{Prop.KEYS: "a"}], []),  # columns of different lengths
        ([{Prop.KEYS: "a"}], ["0"]),
        ([{Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: 0}], [0]),  # falsy: skipped by both
    ],
)
def test_hash_batch_unusual_input_is_the_reference_s(
    C: ModuleType, props: list[Any], flags: list[Any]
) -> None:
    assert outcome(C.hash_batch, "T", props, flags, 0) == outcome(py_hash_batch, "T", props, flags, 0)


def test_hash_batch_of_mappings_that_are_not_dicts(C: ModuleType) -> None:
    class Props(dict):  # type: ignore[type-arg]
        pass

    props = [Props({Prop.KEYS: "a b"}), {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "u"}]
    assert C.hash_batch("T", props, [0, 0], 0) == py_hash_batch("T", props, [0, 0], 0)


@SETTINGS
@given(
    st.lists(
        st.tuples(_TOPIC, st.lists(st.tuples(_PROPS, _FLAGS), max_size=8), st.integers(-1, 9)), max_size=6
    )
)
def test_hash_chunk_is_the_puts_hash_batch_concatenated(
    C: ModuleType, puts: list[tuple[str, list[tuple[dict[str, str], int]], int]]
) -> None:
    # The index thread hashes a drained chunk of puts in one call (the GIL released once).
    batches = [(t, [p for p, _ in m], [f for _, f in m], skip) for t, m, skip in puts]
    hashes, counts = array.array("i"), array.array("i")
    for batch in batches:
        h, c = py_hash_batch(*batch)
        hashes.extend(h)
        counts.extend(c)
    assert C.hash_chunk(batches) == indexfile.py_hash_chunk(batches) == (hashes, counts)


def test_hash_chunk_takes_a_put_only_the_reference_takes_and_long_keys(C: ModuleType) -> None:
    class Props(dict):  # type: ignore[type-arg]
        pass

    long_key = "k" * 2000  # beyond one BLAKE3 chunk: hashed by the package as it is gathered
    batches = [
        ("T", [{Prop.KEYS: "a b"}], [0], 0),
        ("T", [Props({Prop.KEYS: "c"}), {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: long_key}], [0, 0], 0),
        ("U", [{Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: long_key, Prop.KEYS: "d"}] * 20, [0] * 20, 0),
    ]
    assert C.hash_chunk(batches) == indexfile.py_hash_chunk(batches)
    bad = [("T", [{Prop.KEYS: "a"}], [0], 0), ("T", [{Prop.KEYS: 5}], [0], 0)]  # the reference's exception
    assert outcome(C.hash_chunk, bad) == outcome(indexfile.py_hash_chunk, bad)


# ---------------------------------------------------------------------------- put_batch
def file_bytes(f: IndexFile) -> bytes:
    with open(f.path, "rb") as fh:
        data = fh.read()
    return f.header.pack() + data[indexfile.HEADER_SIZE :]  # the in-memory header: written on flush


_BATCHES = st.lists(
    st.tuples(
        st.lists(st.integers(-1, 4), min_size=1, max_size=6),  # keys per message (-1: skipped)
        st.integers(0, 5000),  # store-time step (ms)
        st.booleans(),  # the clock stepped back
    ),
    min_size=1,
    max_size=10,
)


@SETTINGS
@given(
    st.integers(1, 40),
    st.integers(2, 30),
    _BATCHES,
    st.randoms(use_true_random=False),
)
def test_put_batch_writes_the_reference_s_bytes(
    C: ModuleType, tmp_path_factory: pytest.TempPathFactory, slots: int, entries: int, batches: Any, rng: Any
) -> None:
    d = tmp_path_factory.mktemp("put")
    files = {}
    for path in ("reference", "compiled"):
        files[path] = IndexFile.create(d / path, slots, entries, 777, T0 - 5000)
    try:
        offset, ts = 1000, T0
        for counts_list, step, back in batches:
            counts = array.array("i", counts_list)
            hashes = array.array("i", [rng.randrange(2**31) for _ in range(sum(max(c, 0) for c in counts))])
            offsets = [offset + 100 * i for i in range(len(counts))]
            offset += 100 * len(counts)
            ts = ts - step if back else ts + step
            # Start where a caller resumes: at message 0, or in the middle of the batch's hashes.
            msg = rng.randrange(len(counts))
            p = sum(c for c in counts[:msg] if c > 0)
            hpos = p + (rng.randrange(counts[msg]) if counts[msg] > 0 else 0)
            # One store time for the put, or one per message (a chunk of puts).
            stamps: int | list[int] = (
                ts if rng.random() < 0.5 else [ts + rng.randrange(-3000, 3000) for _ in counts]
            )
            ref = files["reference"].py_put_batch(hashes, counts, offsets, stamps, msg, hpos)
            got = C.put_batch(files["compiled"], hashes, counts, offsets, stamps, msg, hpos)
            assert got == ref
            assert files["compiled"].header == files["reference"].header
            assert files["compiled"]._reserved_end == files["reference"]._reserved_end
            assert files["compiled"]._slot_chunks == files["reference"]._slot_chunks
            assert file_bytes(files["compiled"]) == file_bytes(files["reference"])
    finally:
        for f in files.values():
            f.destroy()


@pytest.mark.parametrize("n", [64, 65, 300])
def test_put_batch_of_many_messages(C: ModuleType, tmp_path: Path, n: int) -> None:
    # More than 64 messages: the offsets go to a heap buffer instead of the stack.
    counts = array.array("i", [(i % 4) - 1 for i in range(n)])
    hashes = array.array("i", [(i * 2654435761) % 2**31 for i in range(sum(c for c in counts if c > 0))])
    offsets = [i * 64 for i in range(n)]
    files = [IndexFile.create(tmp_path / name, 31, 40) for name in ("reference", "compiled")]
    try:
        ref = files[0].py_put_batch(hashes, counts, offsets, T0, 3, 0)
        got = C.put_batch(files[1], hashes, counts, offsets, T0, 3, 0)
        assert got == ref and ref[0] < n  # the file filled up part way
        assert file_bytes(files[1]) == file_bytes(files[0])
        # Per-message store times go to the heap buffer too.
        stamps = [T0 + 1000 * i for i in range(n)]
        more = [IndexFile.create(tmp_path / name, 31, 40) for name in ("reference2", "compiled2")]
        files += more
        assert C.put_batch(more[1], hashes, counts, offsets, stamps, 3, 0) == more[0].py_put_batch(
            hashes, counts, offsets, stamps, 3, 0
        )
        assert file_bytes(more[1]) == file_bytes(more[0])
        with pytest.raises(IndexError):
            C.put_batch(files[1], hashes, counts, offsets[:10], T0, 0, 0)
    finally:
        for f in files:
            f.destroy()


def test_put_batch_checks_its_positions(C: ModuleType, tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "f", 4, 8)
    try:
        counts = array.array("i", [2])
        with pytest.raises(ValueError, match="outside the batch"):
            C.put_batch(f, array.array("i", [1, 2]), counts, [0], T0, 5, 0)
        with pytest.raises(ValueError, match="more than the hashes"):
            C.put_batch(f, array.array("i", [1]), counts, [0], T0, 0, 0)
        assert f.header.index_count == 1
    finally:
        f.destroy()


# ---------------------------------------------------------------------------- a whole index
@contextlib.contextmanager
def bound_to(impl: ModuleType | None) -> Iterator[None]:
    """The index's names bound to ``impl`` (the reference when None), as the loader binds them."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(native, "impl", impl)
        m.setattr(service, "hash_batch", py_hash_batch if impl is None else impl.hash_batch)
        m.setattr(service, "hash_chunk", indexfile.py_hash_chunk if impl is None else impl.hash_chunk)
        m.setattr(service, "key_hash", py_key_hash if impl is None else impl.key_hash)
        put_batch = IndexFile.py_put_batch if impl is None else impl.put_batch
        m.setattr(service, "put_batch", put_batch)
        m.setattr(indexfile, "put_batch", put_batch)
        yield


_MESSAGES = st.lists(
    st.lists(st.tuples(_PROPS, st.sampled_from([0, 0, 0, 12, 8])), min_size=1, max_size=6),
    min_size=1,
    max_size=12,
)


def build(
    root: Path,
    slots: int,
    entries: int,
    topic: str,
    puts: list[list[tuple[dict[str, str], int]]],
    one_chunk: bool = False,
) -> tuple[list[bytes], dict[str, tuple[int, ...]], int]:
    index = HashIndex(root, HashIndexOptions(max_hash_slot_num=slots, max_index_num=entries))
    index.load(True, 0)
    if one_chunk:  # no index thread: the flush indexes every put queued, in one drain
        index._worker = threading.current_thread()
    offset, ts = 0, T0
    keys: set[str] = {"missing"}
    for i, put in enumerate(puts):
        props = [p for p, _ in put]
        flags = [f for _, f in put]
        offsets = [offset + 50 * j for j in range(len(put))]
        offset += 50 * len(put)
        ts += 700 * (i % 3)
        index.dispatch_batch(topic, 0, props, offsets, [50] * len(put), [0] * len(put), ts, i, flags)
        for p in props:
            keys.add(p.get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) or "missing")
            keys.update(k for k in p.get(Prop.KEYS, "").split(" ") if k)
    if one_chunk:  # and the first put again, as a recovery re-dispatches it: skipped
        props = [p for p, _ in puts[0]]
        flags = [f for _, f in puts[0]]
        n = len(props)
        index.dispatch_batch(topic, 0, props, [50 * j for j in range(n)], [50] * n, [0] * n, T0, 0, flags)
    covered = index.flush()
    answers = {k: index.query(topic, k, 1000, 0, 2**62).phy_offsets for k in sorted(keys)}
    index.shutdown()
    contents = [p.read_bytes() for p in sorted(root.iterdir())]
    return contents, answers, covered


@SETTINGS
@given(st.integers(1, 16), st.integers(2, 12), _TOPIC.filter(bool), _MESSAGES)
def test_index_files_and_queries_are_identical_both_ways(
    C: ModuleType,
    tmp_path_factory: pytest.TempPathFactory,
    slots: int,
    entries: int,
    topic: str,
    puts: list[list[tuple[dict[str, str], int]]],
) -> None:
    d = tmp_path_factory.mktemp("index")
    with bound_to(None):
        ref = build(d / "reference", slots, entries, topic, puts)
    with bound_to(C):
        got = build(d / "compiled", slots, entries, topic, puts)
    assert got == ref


@SETTINGS
@given(st.integers(1, 16), st.integers(2, 12), _TOPIC.filter(bool), _MESSAGES)
def test_a_chunk_of_puts_is_indexed_as_put_by_put(
    C: ModuleType,
    tmp_path_factory: pytest.TempPathFactory,
    slots: int,
    entries: int,
    topic: str,
    puts: list[list[tuple[dict[str, str], int]]],
) -> None:
    # The index thread indexes a drained chunk of puts in one hash and one insertion call (the
    # GIL released): the same files, answers and checkpoint as indexing them one put at a time.
    d = tmp_path_factory.mktemp("chunk")
    with bound_to(C):
        got = build(d / "chunked", slots, entries, topic, puts, one_chunk=True)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(HashIndex, "_index_chunk", lambda self, items, gil: False)  # put by put
            ref = build(d / "per_put", slots, entries, topic, puts, one_chunk=True)
    assert got == ref
