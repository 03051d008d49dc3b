"""How the ``sync`` flush policy's rounds ran (:class:`tidemq.flush.FlushRoundStats`) as Prometheus
families, beside ``tidemq_flush_rounds_total`` (every round) and ``tidemq_flush_requests_total``.

The rounds not counted as inline or compiled ran on the policy's Python flush thread.  Read at
scrape time from the policy's counters (``docs/flush.md``, ``docs/metrics.md``).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, Metric

from tidemq.flush import FlushRoundStats

#: (metric name without ``_total``, help, the FlushRoundStats field).
_COUNTERS = (
    (
        "tidemq_flush_inline_rounds",
        "Flush rounds run on an event loop at its kick ([flush.sync] inline_max_us)",
        "inline",
    ),
    (
        "tidemq_flush_compiled_rounds",
        "Flush rounds a compiled worker ran without the GIL ([flush.sync] compiled_rounds)",
        "compiled",
    ),
    (
        "tidemq_flush_gathered_rounds",
        "Flush rounds that waited to gather the next sends ([flush.sync] loop_gather_us)",
        "gathered",
    ),
    ("tidemq_flush_gather_timeouts", "Gathering waits that ended by their time bound", "gather_timeouts"),
    (
        "tidemq_flush_kicks_held",
        "Loop turns a round's kick waited for sends already arrived ([flush.sync] kick_polls)",
        "kicks_held",
    ),
    (
        "tidemq_flush_kicks_sparse",
        "Kicks that found the worker idle but carried fewer than [flush.sync] kick_min_messages messages",
        "kicks_sparse",
    ),
    (
        "tidemq_flush_worker_gathered_rounds",
        "Rounds the compiled worker held to gather a busy stream's next sends ([flush.sync] worker_gather_us)",
        "worker_gathered",
    ),
    (
        "tidemq_flush_worker_gather_timeouts",
        "The compiled worker's gathering waits that ended by their time bound",
        "worker_gather_timeouts",
    ),
)


def flush_round_families(stats: FlushRoundStats) -> list[Metric]:
    """``tidemq_flush_inline_rounds_total``, ``tidemq_flush_compiled_rounds_total``,
    ``tidemq_flush_gathered_rounds_total``, ``tidemq_flush_gather_timeouts_total``,
    ``tidemq_flush_kicks_held_total``, ``tidemq_flush_kicks_sparse_total``,
    ``tidemq_flush_worker_gathered_rounds_total`` and ``tidemq_flush_worker_gather_timeouts_total``."""
    out: list[Metric] = []
    for name, doc, field in _COUNTERS:
        family = CounterMetricFamily(name, doc)
        family.add_metric([], getattr(stats, field))
        out.append(family)
    return out
