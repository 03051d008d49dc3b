"""Hostile SQL92 subscriptions against a live broker (issue 20, item 7): refused fast, no stall, no loss.

A SQL92 expression is compiled on the broker's event loop when a pull or CHECK_CLIENT_CONFIG brings
it, and each distinct one registers with the dispatch-time pre-check of its topic.  These tests send
huge and deeply nested expressions, hypothesis-generated SQL-ish strings and a flood of distinct
subscriptions while a producer sends, and check that every request is answered within a bound that
shows no multi-second stall, that the broker stays up and answers, that every acknowledged message
is served afterwards (acknowledged lost = 0), and that its log holds no traceback.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import threading
import time
from collections.abc import Iterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.message import iter_messages
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import RequestCode, ResponseCode

from .cluster import Cluster, assert_broker_serves, assert_log_clean, faults_cluster, report, rss_kib
from .rawclient import RawConn, pull_fields

TOPIC = "SqlHostile"
QUEUES = 4
#: a pull or check is answered within this, hostile expression or not (the issue saw 1.5-3.7 s)
ANSWER_BOUND_S = 1.0
PULL_ANSWERS = {
    ResponseCode.SUCCESS,
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = faults_cluster(tmp_path_factory.mktemp("sql92"))
    with BlockingProducer("sql-seed", c.namesrv.address) as p:
        futs = [
            p.send_async(Message(TOPIC, b"seed-%d" % i, tags="S", properties={"n": str(i)}))
            for i in range(40)
        ]
        assert all(f.result(30).status is SendStatus.SEND_OK for f in futs)
    yield c
    c.close()


def pull_request(
    expression: str, queue_id: int = 0, offset: int = 0, expression_type: str = "SQL92", group: str = "sql-cg"
) -> RemotingCommand:
    fields = pull_fields(
        TOPIC,
        group=group,
        queue_id=queue_id,
        offset=offset,
        expression=expression,
        expression_type=expression_type,
    )
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, fields)


def check_request(expression: str) -> RemotingCommand:
    sub = {"topic": TOPIC, "subString": expression, "expressionType": "SQL92", "subVersion": 1}
    body = orjson.dumps({"clientId": "127.0.0.1@hostile", "group": "sql-cg", "subscriptionData": sub})
    return RemotingCommand.request(RequestCode.CHECK_CLIENT_CONFIG, {}, body)


def timed_call(conn: RawConn, cmd: RemotingCommand, timeout: float = 30.0) -> tuple[RemotingCommand, float]:
    start = time.perf_counter()
    resp = conn.call(cmd, timeout)
    took = time.perf_counter() - start
    assert resp is not None, f"no answer within {timeout} s"
    return resp, took


def hostile_expressions() -> dict[str, str]:
    return {
        "or-50000-terms": " OR ".join(f"a{i} = {i}" for i in range(50_000)),
        "and-50000-terms": " AND ".join(f"n > {i}" for i in range(50_000)),
        "in-list-50000": "a IN (" + ", ".join(f"'v{i}'" for i in range(50_000)) + ")",
        "parens-20000": "(" * 20_000 + "a = 1" + ")" * 20_000,
        "open-parens-100000": "(" * 100_000,
        "not-chain-20000": "NOT " * 20_000 + "a = 1",
        "not-parens-10000": "NOT (" * 10_000 + "a = 1" + ")" * 10_000,
        "minus-chain-20000": "- " * 20_000 + "a > 1",
        "string-1MiB": "a = '" + "x" * (1 << 20) + "'",
        "comment-unterminated": "a = 1 /*" + " x" * 200_000,
        "between-5000": " OR ".join(f"a BETWEEN {i} AND {i + 1}" for i in range(5_000)),
    }


def test_huge_and_deep_expressions_are_refused_at_once(cluster: Cluster) -> None:
    conn = RawConn(cluster.broker_address, timeout=30)
    longest, tried = 0.0, 0
    try:
        for name, expression in hostile_expressions().items():
            for cmd in (pull_request(expression), check_request(expression)):
                resp, took = timed_call(conn, cmd)
                tried += 1
                longest = max(longest, took)
                assert resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, (
                    name,
                    resp.code,
                    resp.remark[:300],
                )
                assert "\n" not in (resp.remark or ""), name
                assert took < ANSWER_BOUND_S, f"{name}: answered in {took:.2f} s"
        # A valid subscription is still served, exactly: n = 10, 11 and 12, wherever the producer's
        # selector (which starts at a random queue, as RocketMQ's) put them.
        served = []
        for queue_id in range(QUEUES):
            resp, _ = timed_call(conn, pull_request("n >= 10 AND n < 13", queue_id=queue_id))
            assert resp.code in PULL_ANSWERS and resp.code != ResponseCode.SUBSCRIPTION_PARSE_FAILED, resp
            if resp.code == ResponseCode.SUCCESS:
                served += [m.body for m in iter_messages(resp.payload())]
        assert sorted(served) == [b"seed-10", b"seed-11", b"seed-12"]
    finally:
        conn.close()
    assert_broker_serves(cluster)
    report("sql92-huge", inputs=tried, longest_answer_ms=round(longest * 1000, 1), broker_alive=True)


_WORDS = [
    "a", "n", "TAGS", "region", "=", "<>", ">", ">=", "<", "<=", "(", ")", "NOT", "AND", "OR", "BETWEEN",
    "IN", "IS", "NULL", "TRUE", "FALSE", "CONTAINS", "STARTSWITH", "ENDSWITH", "'eu'", "'it''s'", "1",
    "-2", "3.5", "1E3", "10L", ",", "+", "-", "@", "'", "/*", "*/", "--", "\n", "\x00", "é",
]  # fmt: skip
_sqlish = st.one_of(
    st.lists(st.sampled_from(_WORDS), max_size=80).map(" ".join),
    st.text(max_size=200),
    # Big shapes: long chains and deep nesting of a random size, some under the bounds, most over.
    st.builds(lambda n, w: (w + " ") * n + "a = 1", st.integers(1, 30_000), st.sampled_from(["NOT", "-", "+"])),
    st.builds(lambda n: "(" * n + "n = 1" + ")" * n, st.integers(1, 30_000)),
    st.builds(lambda n, op: f" {op} ".join(f"n = {i}" for i in range(n)), st.integers(1, 20_000), st.sampled_from(["AND", "OR"])),
    st.builds(lambda n: "TAGS IN (" + ",".join(f"'t{i}'" for i in range(n)) + ")", st.integers(1, 20_000)),
)  # fmt: skip


def run_sql_fuzz(cluster: Cluster, examples: int) -> dict[str, object]:
    conn = RawConn(cluster.broker_address, timeout=30)
    stats = {"inputs": 0, "refused": 0, "accepted": 0, "longest_s": 0.0}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(expression=_sqlish, queue_id=st.integers(0, QUEUES - 1), check=st.booleans())
    def fuzz(expression: str, queue_id: int, check: bool) -> None:
        cmd = check_request(expression) if check else pull_request(expression, queue_id)
        resp, took = timed_call(conn, cmd)
        stats["inputs"] += 1
        stats["longest_s"] = max(stats["longest_s"], took)
        if check:
            assert resp.code in (ResponseCode.SUCCESS, ResponseCode.SUBSCRIPTION_PARSE_FAILED), resp.remark
        else:
            assert resp.code in PULL_ANSWERS, (resp.code, resp.remark[:300])
        stats["refused" if resp.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED else "accepted"] += 1
        # One line, apart from the expression itself, which the pull's remark quotes whole.
        assert "\n" not in (resp.remark or "").replace(expression, "")
        assert took < ANSWER_BOUND_S, f"answered in {took:.2f} s: {expression[:100]!r}"

    try:
        fuzz()
    finally:
        conn.close()
    assert_broker_serves(cluster)
    longest = stats.pop("longest_s")
    return {**stats, "longest_answer_ms": round(float(longest) * 1000, 1), "broker_alive": True}


def test_fuzzed_sql92_subscriptions(cluster: Cluster) -> None:
    report("sql92-fuzz", **run_sql_fuzz(cluster, 300))


@pytest.mark.slow
def test_fuzzed_sql92_subscriptions_long(cluster: Cluster) -> None:
    report("sql92-fuzz-long", **run_sql_fuzz(cluster, 3000))


class Sender:
    """A producer sending 1-by-1 in a thread, timing each send and keeping what was acknowledged."""

    def __init__(self, cluster: Cluster) -> None:
        self.producer = BlockingProducer(f"sql-flood-{time.monotonic_ns()}", cluster.namesrv.address)
        self.producer.start()
        self.acked: list[tuple[int, int, bytes, str]] = []  # queue, offset, body, region
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.count = 0
        self.last_offset = dict.fromkeys(range(QUEUES), 0)  # per queue: the newest acknowledged

    def send_one(self) -> None:
        i = self.count
        self.count += 1
        body = b"flood-%d" % i
        region = ("eu", "us", "ap")[i % 3]
        msg = Message(TOPIC, body, tags="F", properties={"n": str(1000 + i), "region": region})
        start = time.perf_counter()
        try:
            result = self.producer.send(msg, timeout=30)
        except Exception:  # an unacknowledged send may or may not be stored: not counted as acked
            self.failures += 1
            return
        self.latencies.append(time.perf_counter() - start)
        if result.status is SendStatus.SEND_OK:
            self.acked.append((result.queue.queue_id, result.queue_offset, body, region))
            self.last_offset[result.queue.queue_id] = result.queue_offset

    def run(self) -> None:
        while not self.stop.is_set():
            self.send_one()

    def p50_ms(self, since: int = 0) -> float:
        return round(statistics.median(self.latencies[since:]) * 1000, 3)

    def close(self) -> None:
        self.producer.shutdown()


def read_queue(
    conn: RawConn, queue_id: int, expression: str, expression_type: str
) -> list[tuple[int, bytes]]:
    """Every message the broker serves for ``expression`` on one queue: (queue offset, body)."""
    offset, got = 0, []
    for _ in range(100_000):
        resp, _took = timed_call(
            conn, pull_request(expression, queue_id, offset, expression_type, "sql-reader")
        )
        if resp.code == ResponseCode.SUCCESS:
            got.extend((m.queue_offset, m.body) for m in iter_messages(resp.payload()))
        elif resp.code not in (ResponseCode.PULL_RETRY_IMMEDIATELY, ResponseCode.PULL_NOT_FOUND):
            raise AssertionError(f"{resp.code} {resp.remark}")
        nxt = int(resp.ext_fields["nextBeginOffset"])
        if resp.code == ResponseCode.PULL_NOT_FOUND or nxt == offset:
            return got
        offset = nxt
    raise AssertionError("did not reach the end of the queue")


def run_flood(cluster: Cluster, name: str, subscriptions: int) -> None:
    pid = cluster.broker.pid
    sender = Sender(cluster)
    conn = RawConn(cluster.broker_address, timeout=30)
    try:
        for _ in range(300):
            sender.send_one()
        baseline = sender.p50_ms()
        rss0 = rss_kib(pid)
        mark = len(sender.latencies)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(sender.run)
            longest = 0.0
            try:
                for i in range(subscriptions):
                    # Distinct, valid, each registers with the topic's pre-check on its first pull.
                    # Pulled near the queue's end, as a caught-up consumer does: a pull from 0 would
                    # measure the scan of a growing backlog (a store cost, not the subscriptions').
                    # A few groups only: what is measured is the expressions, not group creation.
                    q = i % QUEUES
                    expression = f"(n = {i} AND region = 'eu') OR uid = 'user-{i}'"
                    cmd = pull_request(expression, q, sender.last_offset[q], group=f"flood-{i % 8}")
                    resp, took = timed_call(conn, cmd)
                    assert resp.code in PULL_ANSWERS - {ResponseCode.SUBSCRIPTION_PARSE_FAILED}, resp.remark
                    longest = max(longest, took)
                time.sleep(0.5)  # sends keep going with every subscription registered
            finally:
                sender.stop.set()
                running.result(60)
        during = sender.p50_ms(mark)
        rss1 = rss_kib(pid)
        # Every acknowledged message is served at its queue offset; SQL92 answers stay exact.
        served: dict[int, dict[int, bytes]] = {}
        eu: set[bytes] = set()
        for q in range(QUEUES):
            served[q] = dict(read_queue(conn, q, "*", "TAG"))
            eu.update(body for _off, body in read_queue(conn, q, "region = 'eu' AND n >= 1000", "SQL92"))
        lost = sum(1 for q, off, body, _r in sender.acked if served[q].get(off) != body)
        want_eu = {body for _q, _off, body, region in sender.acked if region == "eu"}
        figures = {
            "subscriptions": subscriptions,
            "messages_acked": len(sender.acked),
            "send_failures": sender.failures,
            "acked_lost": lost,
            "sql92_eu_served": len(eu),
            "sql92_eu_expected": len(want_eu),
            "longest_pull_answer_ms": round(longest * 1000, 1),
            "send_p50_ms_before": baseline,
            "send_p50_ms_during": during,
            "rss_before_kib": rss0,
            "rss_after_kib": rss1,
        }
        report(name, **figures)  # before the asserts: the figures are wanted most when they fail
        assert lost == 0, figures
        assert eu == want_eu, figures
        assert longest < ANSWER_BOUND_S, figures
        # The issue saw the p50 go 1.5 -> 6-8 ms; a pre-check evaluated off the store lock and bounded
        # in registrations keeps it near the baseline (the bound leaves room for a shared machine).
        assert during < 2 * baseline + 2.0, figures
        assert rss1 - rss0 < 256 * 1024, figures
    finally:
        conn.close()
        sender.close()
    assert_broker_serves(cluster)


def test_a_thousand_distinct_subscriptions_while_producing(cluster: Cluster) -> None:
    run_flood(cluster, "sql92-flood", 1000)


@pytest.mark.slow
def test_five_thousand_distinct_subscriptions_while_producing(cluster: Cluster) -> None:
    run_flood(cluster, "sql92-flood-long", 5000)


def test_broker_log_has_no_tracebacks(cluster: Cluster) -> None:
    """Hostile expressions are refused with one line; nothing reaches a handler's crash path.

    After the module's other tests, or alone (``-k``, xdist): a short fuzz of its own first, so the
    log always holds hostile expressions to check."""
    run_sql_fuzz(cluster, 40)
    assert_log_clean(cluster, "failed to compile")  # nor the catch-all of compile_expression
