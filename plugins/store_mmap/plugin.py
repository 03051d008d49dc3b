"""Entry point of the store_mmap plugin: its hook implementations."""

from tidemq import hookimpl  # noqa: F401
