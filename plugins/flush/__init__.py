"""flush plugin."""

from tidemq import hookimpl  # noqa: F401
