"""``tidemq admin controllerStatus``: each broker group's master, epoch, synchronous set and lag, from etcd."""

from __future__ import annotations

import asyncio
from typing import Any

import click


def add_admin_command(cli: click.Group) -> None:
    """Add ``controllerStatus`` to ``tidemq admin`` (or to ``tidemq`` when there is no admin group)."""
    group = cli.commands.get("admin")
    target = group if isinstance(group, click.Group) else cli
    target.add_command(controller_status)


@click.command("controllerStatus")
@click.option(
    "--etcd",
    "endpoints",
    multiple=True,
    default=("http://127.0.0.1:2379",),
    show_default=True,
    help="etcd client URL (repeat for several).",
)
@click.option("-c", "--cluster", default="DefaultCluster", show_default=True, help="Cluster name.")
@click.option(
    "--max-lag",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Lag bound of the sync set (bytes).",
)
def controller_status(endpoints: tuple[str, ...], cluster: str, max_lag: int) -> None:
    """Each broker group's master, epoch, synchronous replica set and lag (controller mode)."""
    try:
        from .etcd import ControllerError, EtcdClient
        from .status import cluster_status
    except ImportError:
        raise click.ClickException("controllerStatus needs httpx: pip install 'tidemq[controller]'") from None

    async def read() -> list[Any]:
        client = EtcdClient(list(endpoints), 2.0)
        try:
            return await cluster_status(client, cluster, max_lag)
        finally:
            await client.close()

    try:
        groups = asyncio.run(read())
    except (ControllerError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    if not groups:
        click.echo(f"no broker group of cluster {cluster} in etcd")
        return
    click.echo(f"{'#Broker Name':<20}{'#Master':<10}{'#Epoch':<8}{'#Confirmed':<14}{'#Sync Set':<12}#Lag")
    for g in groups:
        master = str(g.master.broker_id) if g.master is not None else "-"
        sync = ",".join(map(str, g.sync_set)) or "-"
        lags = " ".join(f"{m.member.broker_id}={m.lag}" for m in g.members) or "-"
        click.echo(f"{g.broker_name:<20}{master:<10}{g.epoch:<8}{g.confirmed:<14}{sync:<12}{lags}")
