"""Entry point of the ha_replication plugin: its hook implementations."""

from tidemq import hookimpl
from tidemq.plugins import Register

from . import none


@hookimpl
def tidemq_register_replications(register: Register) -> None:
    register.add("none", none.create, "no replication: a standalone master")
