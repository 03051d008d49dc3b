"""POP consumption's figures (issue 39) as Prometheus families."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.context import BrokerFiguresView


def pop_families(broker: BrokerFiguresView) -> list[Metric]:
    """The ``tidemq_pop_*`` families, read through the exporter's read-only view (``broker.pop``)."""
    pop = broker.pop
    in_flight = GaugeMetricFamily(
        "tidemq_pop_in_flight", "Popped messages not yet acknowledged", labels=["group", "topic"]
    )
    for (group, topic), n in sorted(pop.in_flight_table().items()):
        in_flight.add_metric([group, topic], n)
    figures = pop.figures()
    checkpoints = GaugeMetricFamily("tidemq_pop_checkpoints", "Open pop batches (checkpoints)")
    checkpoints.add_metric([], figures["popCheckpoints"])
    lag = GaugeMetricFamily(
        "tidemq_pop_revive_lag_ms", "How far past its invisible time the oldest unrevived checkpoint is"
    )
    lag.add_metric([], figures["popReviveLagMs"])
    revived = CounterMetricFamily("tidemq_pop_revived", "Messages written back for redelivery")
    revived.add_metric([], figures["popRevived"])
    dead = CounterMetricFamily("tidemq_pop_dead_lettered", "Popped messages sent to the DLQ")
    dead.add_metric([], figures["popDeadLettered"])
    journal = GaugeMetricFamily(
        "tidemq_pop_journal_bytes",
        "Bytes of POP state in the revive log since its last snapshot (what a restart replays)",
    )
    journal.add_metric([], figures["popJournalBytes"])
    return [in_flight, checkpoints, lag, revived, dead, journal]
