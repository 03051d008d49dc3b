"""Entry point of the index_hash plugin: its hook implementations."""

from tidemq import hookimpl  # noqa: F401
