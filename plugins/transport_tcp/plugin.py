"""Entry point of the transport_tcp plugin: its hook implementations."""

from tidemq import hookimpl  # noqa: F401
