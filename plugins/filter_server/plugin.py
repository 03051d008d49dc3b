"""Entry point of the filter_server plugin: its hook implementations."""

from tidemq import hookimpl  # noqa: F401
