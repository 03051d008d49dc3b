"""The ``controller`` plugin (entry point ``controller``): elected masters through etcd.

Loaded by every tidemq process: nothing heavy at module level.  The replication module (and
httpx) is imported only when a broker selects ``[plugins] replication = "controller"``.  A
replica's metadata copy needs no hook: the broker hands its sink and client to the replication
(:meth:`~tidemq.replication.MetadataFollower.follow_metadata`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from tidemq import hookimpl
from tidemq.plugins import PluginContext, Register

if TYPE_CHECKING:
    from .replication import ControllerReplication


def create(ctx: PluginContext) -> ControllerReplication:
    """The ``controller`` replication, from ``[replication.controller]``."""
    from tidemq.config import parse_options
    from tidemq.errors import ConfigError

    try:
        import httpx  # noqa: F401
    except ImportError:
        raise ConfigError(
            "[plugins] replication = \"controller\" needs httpx: pip install 'tidemq[controller]'"
        ) from None
    from .options import ControllerOptions, check_broker_settings

    options = parse_options(ControllerOptions, ctx.options, "[replication.controller]")
    from .replication import ControllerReplication, election_config

    if ctx.settings:  # a broker's: refuse what controller mode cannot run with before it starts
        role = str(ctx.settings.get("role", ""))
        check_broker_settings(role, int(ctx.settings.get("id", 0)))
        election_config(options, role)
        from tidemq_ha_replication.api import check_protected

        check_protected(options, ctx.settings, "[replication.controller]", always=True)

    return ControllerReplication(options)


@hookimpl
def tidemq_register_replications(register: Register) -> None:
    register.add(
        "controller",
        create,
        "master_slave's HA stream with the master elected through etcd: automatic failover, epochs",
    )


@hookimpl
def tidemq_add_commands(cli: click.Group) -> None:
    """``tidemq admin controllerStatus``: each group's master, epoch, sync set and lag, from etcd."""
    from .admin import add_admin_command

    add_admin_command(cli)
