"""The mmap store's put of a call's groups, compiled (``tidemq_store_mmap._group_put``, issue 38 groupc).

Two mmap stores on one fixed clock get the same calls of ``put_message_groups``: one runs the
compiled twin, the other the Python reference (``group_put.put_groups_py``).  The results (every
:class:`PutResult` field), the calls the dispatchers and the arrival listener get, the key index's
answers and the commit-log and consume-queue files (byte for byte) must be equal: hypothesis over
topics, queues, group and body sizes, keyed, prepared-transaction (no queue entry) and refused
groups (a message over the size bound, mixed queues, an empty topic), with files small enough that
calls cross file ends; with per-group dispatch (a listener with a callable filter) and with the
call's effects (a dispatcher that takes groups, the store's map); a queue file that cannot be
created mid call; a transient store pool and compression.  ``test_store_group_put.py`` compares
whichever runs (the twin when built, the reference under ``TIDEMQ_NO_EXTENSIONS=1``) with one
``put_messages`` per group, failures and restarts included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_group_put import (
    STORE_OPTION_IDS,
    STORE_OPTIONS,
    T0,
    TOPICS,
    Side,
    blocked_queue_scenario,
    files_of,
    fixed_clock,
    message,
    twelve_calls_past_file_ends,
)

import tidemq_store_mmap.group_put as group_put_module
from tidemq.message import TRANSACTION_PREPARED_TYPE, MessageInner
from tidemq.store import DispatchedPut, PutResult, PutStatus

TWIN = group_put_module.compiled
needs_twin = pytest.mark.skipif(TWIN is None, reason="tidemq_store_mmap._group_put not built or not allowed")
pytestmark = [pytest.mark.timeout(300), needs_twin]


class GroupRecorder:
    """A dispatcher that takes a call's puts at once (the store's call then does its effects for
    the call), noting each put as ``dispatch_batch`` would get it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def dispatch_batch(self, topic: str, queue_id: int, properties: Any, *rest: Any) -> None:
        self.calls.append(("dispatch", topic, queue_id, [dict(p) for p in properties], *map(_plain, rest)))

    def dispatch_groups(self, puts: Sequence[DispatchedPut]) -> None:
        for put in puts:
            self.dispatch_batch(*put)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


class TwinSide(Side):
    """A :class:`Side` whose calls run the compiled twin (``compiled``) or the Python reference."""

    def __init__(self, root: Path, name: str, compiled: bool, effects: bool = False, **options: Any) -> None:
        self.compiled = compiled
        self.effects = effects
        super().__init__(root, name, **options)
        if effects:  # no callable filter, a group dispatcher: the call's effects (_Effects)
            self.store.reput.listeners.clear()
            self.store.reput.notifier._interest = []
            self.store.reput.dispatchers.remove(self.recorder)
            self.recorder = GroupRecorder()  # type: ignore[assignment]
            self.store.add_dispatcher(self.recorder)

    def put_all(self, groups: Sequence[Sequence[MessageInner]], one_call: bool = True) -> list[PutResult]:
        group_put_module.compiled = TWIN if self.compiled else None
        try:
            return super().put_all(groups, True)
        finally:
            group_put_module.compiled = TWIN


def pair_of(root: Path, effects: bool = False, **options: Any) -> dict[str, TwinSide]:
    with fixed_clock():
        return {
            "compiled": TwinSide(root, "compiled", True, effects, **options),
            "python": TwinSide(root, "python", False, effects, **options),
        }


def compare(pair: dict[str, TwinSide], groups: list[list[MessageInner]]) -> list[PutResult]:
    with fixed_clock():
        got = {name: side.put_all(groups) for name, side in pair.items()}
    assert got["compiled"] == got["python"]
    a, b = pair["compiled"], pair["python"]
    assert a.recorder.calls == b.recorder.calls
    for side in (a, b):
        side.store.commitlog.commit(0)
    assert files_of(a.root) == files_of(b.root)
    for group in groups:
        for m in group:
            key = m.properties.get("KEYS")
            if m.topic and key:
                assert a.index.query(m.topic, key, 4, 0, T0 + 1) == b.index.query(m.topic, key, 4, 0, T0 + 1)
    return got["compiled"]


@pytest.fixture(scope="module", params=["per-group", "call-effects"])
def pair(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TwinSide]]:
    sides = pair_of(tmp_path_factory.mktemp("twins"), effects=request.param == "call-effects")
    try:
        yield sides
    finally:
        for side in sides.values():
            side.close()


def test_the_store_runs_the_compiled_twin_when_built(pair: dict[str, TwinSide]) -> None:
    assert group_put_module.put_groups.__module__ == group_put_module.__name__
    assert group_put_module.compiled is TWIN
    assert group_put_module.describe().startswith("compiled")
    side = pair["compiled"]
    called: list[int] = []
    assert TWIN is not None
    real = TWIN.put_groups

    class Spy:
        @staticmethod
        def put_groups(store: Any, groups: Any) -> Any:
            called.append(len(groups))
            return real(store, groups)

    group_put_module.compiled = Spy  # a module's stand-in
    try:
        with fixed_clock():
            futures = side.store.put_message_groups(
                [[message(TOPICS[0], q, b"twin", f"twin-{q}")] for q in range(3)]
            )
    finally:
        group_put_module.compiled = TWIN
    assert called == [3] and all(f.result(10).ok for f in futures)
    with fixed_clock():  # the other side gets the same puts (the module's pair stays equal)
        pair["python"].put_all([[message(TOPICS[0], q, b"twin", f"twin-{q}")] for q in range(3)])


def test_a_read_of_single_sends_over_eight_queues(pair: dict[str, TwinSide]) -> None:
    groups = [
        [message(TOPICS[0], q, b"%d" % q * 128, f"read-{q}-{i}") for i in range(1 + q % 4)] for q in range(8)
    ]
    for side in pair.values():  # the path the fixture's parameter names is the one taken
        assert (group_put_module._effects(side.store) is not None) is side.effects
    results = compare(pair, groups)
    assert all(r.ok for r in results)
    for before, after in zip(results, results[1:], strict=False):
        assert after.wrote_offset == before.wrote_offset + before.wrote_bytes


kinds = st.sampled_from(("plain", "plain", "plain", "keyless", "prepared", "too-big", "mixed", "no-topic"))
group_calls = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(TOPICS),
            st.integers(0, 3),
            st.integers(1, 5),
            st.sampled_from((0, 1, 100, 1024, 4000, 9000)),
            kinds,
        ),
        min_size=1,
        max_size=10,
    ),
    min_size=1,
    max_size=4,
)


def _group(
    topic: str, queue: int, count: int, size: int, kind: str, tag: str, limit: int
) -> list[MessageInner]:
    msgs = [message(topic, queue, bytes([65 + i]) * size, f"{tag}-{i}") for i in range(count)]
    if kind == "keyless":
        for m in msgs:
            m.properties.pop("KEYS")
    elif kind == "prepared":
        for m in msgs:
            m.sys_flag |= TRANSACTION_PREPARED_TYPE
    elif kind == "too-big":
        msgs[-1] = message(topic, queue, bytes(limit + 1), f"{tag}-big")
    elif kind == "mixed" and count > 1:
        msgs[-1] = message(topic, queue + 1, b"other queue", f"{tag}-mixed")
    elif kind == "no-topic":
        msgs[0] = message("", queue, b"no topic", f"{tag}-nt")
    return msgs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=group_calls)
def test_random_calls_match_the_python_reference(
    pair: dict[str, TwinSide], calls: list[list[tuple[str, int, int, int, str]]]
) -> None:
    seq = len(pair["compiled"].recorder.calls)
    limit = pair["compiled"].store.max_message_size
    for c, call in enumerate(calls):
        groups = [_group(*spec, tag=f"h{seq}-{c}-{g}", limit=limit) for g, spec in enumerate(call)]
        compare(pair, groups)


def test_a_queue_file_that_cannot_be_created_mid_call(tmp_path: Path) -> None:
    sides = pair_of(tmp_path)
    try:
        blocked_queue_scenario(sides, compare)
    finally:
        for side in sides.values():
            side.close()


@pytest.mark.parametrize("options", STORE_OPTIONS, ids=STORE_OPTION_IDS)
def test_the_store_options_give_the_same_puts(tmp_path: Path, options: dict[str, Any]) -> None:
    sides = pair_of(tmp_path, **options)
    try:
        twelve_calls_past_file_ends(sides, compare)
    finally:
        for side in sides.values():
            side.close()


def test_a_store_that_is_not_running_refuses_alike(tmp_path: Path) -> None:
    sides = pair_of(tmp_path)
    try:
        for side in sides.values():
            side.store._running = False
        results = compare(sides, [[message(TOPICS[0], q, b"x", f"nr-{q}")] for q in range(3)])
        assert {r.status for r in results} == {PutStatus.SERVICE_NOT_AVAILABLE}
    finally:
        for side in sides.values():
            side.store._running = True
            side.close()
