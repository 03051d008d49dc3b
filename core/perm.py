"""Topic permission bits (RocketMQ's ``PermName``), shared by the NameServer, the broker and clients."""

from __future__ import annotations

PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1


def is_readable(perm: int) -> bool:
    return bool(perm & PERM_READ)


def is_writeable(perm: int) -> bool:
    return bool(perm & PERM_WRITE)


def is_inherited(perm: int) -> bool:
    return bool(perm & PERM_INHERIT)


__all__ = [
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "is_inherited",
    "is_readable",
    "is_writeable",
]
