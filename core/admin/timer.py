"""Timer messages (RocketMQ 5): how many wait per topic, from each master's GET_TIMER_METRICS.

RocketMQ's mqadmin has no command for it (its dashboard and exporter read the same request);
``getTimerMetrics`` is named after the request.  ``topicStatus`` adds the topic's count below its
table when messages of it wait in the wheel (:func:`scheduled_of`).
"""

from __future__ import annotations

import click

from tidemq.admin._common import _run, _table, admin
from tidemq.client.admin import AdminClient, AdminError


async def scheduled_of(client: AdminClient, addrs: list[str], topic: str) -> int:
    """Timer messages of ``topic`` waiting on the brokers at ``addrs`` (those without a timer,
    or not answering, count 0)."""
    total = 0
    for addr in addrs:
        try:
            counts = await client.timer_metrics(addr)
        except AdminError:
            continue
        total += (counts or {}).get(topic, 0)
    return total


@admin.command("getTimerMetrics")
@click.option("-t", "--topic", help="Only this topic.")
@click.option("-b", "--brokerAddr", "--broker-addr", "broker_addr", help="Only this broker (host:port).")
@click.option(
    "-c", "--clusterName", "--cluster", "cluster", help="The masters of this cluster (default: all)."
)
@_run
async def get_timer_metrics(
    client: AdminClient, topic: str | None, broker_addr: str | None, cluster: str | None
) -> None:
    """Timer messages waiting per topic on each master (GET_TIMER_METRICS; tidemq's command)."""
    targets = (
        {broker_addr: broker_addr}
        if broker_addr
        else {a: n for n, a in (await client.masters(cluster)).items()}
    )
    if not targets:
        raise AdminError("no master broker is registered with the NameServer")
    rows = []
    failed: list[str] = []
    for addr, name in sorted(targets.items(), key=lambda kv: kv[1]):
        try:
            counts = await client.timer_metrics(addr)
        except AdminError as exc:
            failed.append(str(exc))
            continue
        if counts is None:
            click.echo(f"{addr}: no timer (GET_TIMER_METRICS not supported)", err=True)
            continue
        for t, n in sorted(counts.items()):
            if topic is None or t == topic:
                rows.append([name, t, n])
    _table(rows, ["#Broker Name", "#Topic", "#Scheduled"])
    if failed:
        raise AdminError(f"GET_TIMER_METRICS failed on {len(failed)} broker(s): {'; '.join(failed)}")
