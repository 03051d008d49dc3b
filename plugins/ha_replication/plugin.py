"""Entry point of the ha_replication plugin: its hook implementations."""

from tidemq import hookimpl  # noqa: F401
