"""queue_select plugin."""

from tidemq import hookimpl  # noqa: F401
