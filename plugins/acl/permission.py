"""Permission bits and their ``plain_acl.yml`` spellings (RocketMQ's ``Permission``)."""

from __future__ import annotations

from tidemq.remoting.codes import RequestCode

DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3

_BY_NAME = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}

#: Request codes only an ``admin: true`` account may send (RocketMQ's Permission.ADMIN_CODE).
ADMIN_CODES: frozenset[int] = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
    }
)


def parse_perm(text: object) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB``, ``DENY``; anything else (or nothing) is DENY, as in RocketMQ."""
    if not isinstance(text, str):
        return DENY
    return _BY_NAME.get(text.strip(), DENY)


def perm_name(perm: int) -> str:
    if perm & DENY:
        return "DENY"
    names = [n for n, bit in (("PUB", PUB), ("SUB", SUB)) if perm & bit]
    return "|".join(names) or "DENY"


def check_permission(needed: int, owned: int) -> bool:
    """Whether ``owned`` grants ``needed``; DENY beats everything."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)
