"""store_memory plugin."""

from tidemq import hookimpl  # noqa: F401
