"""Permission bits and their ``plain_acl.yml`` spellings (RocketMQ's ``Permission``)."""

from __future__ import annotations

from tidemq.remoting.codes import RequestCode

DENY = 1
ANY = 1 << 1
PUB = 1 << 2
SUB = 1 << 3

_BY_NAME = {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB, "DENY": DENY}

#: RocketMQ 4.9's Permission.ADMIN_CODE: the codes only an ``admin: true`` account may send.
ROCKETMQ_ADMIN_CODES: frozenset[int] = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
    }
)
#: The ACL administration codes.  RocketMQ 4.9 lets any signed account send them (so any account
#: could make itself admin); RocketMQ 5.2 added 50-52 to ADMIN_CODE.  All five are admin-only here:
#: 54 answers every secret key and 53 opens the broker to any address.
ACL_ADMIN_CODES: frozenset[int] = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
        RequestCode.DELETE_ACL_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    }
)
#: The other operator codes of mqadmin that change a broker, move a group's offsets, push messages
#: into a consumer or reveal the broker's configuration.  RocketMQ 4.9 checks only a signature for
#: them; tidemq asks for an admin account, as it does for the five above.
OPERATOR_ADMIN_CODES: frozenset[int] = frozenset(
    {
        RequestCode.GET_BROKER_CONFIG,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        RequestCode.CLONE_GROUP_OFFSET,
        RequestCode.CONSUME_MESSAGE_DIRECTLY,
        RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER,
        RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
        RequestCode.CLEAN_UNUSED_TOPIC,
        RequestCode.DELETE_EXPIRED_COMMITLOG,
        RequestCode.RESUME_CHECK_HALF_MESSAGE,
        # A filter server's address goes into the routes consumers follow: only an operator's
        # account may put one there (RocketMQ: anyone, signed or not).
        RequestCode.REGISTER_FILTER_SERVER,
        RequestCode.SET_MESSAGE_REQUEST_MODE,  # RocketMQ 5: mqadmin setConsumeMode
    }
)
#: Codes that read a whole broker's state at once, across tenants: every topic's configuration,
#: every group's offsets and subscription settings, every producer's address, raw consume-queue
#: entries.  RocketMQ 4.9 answers them to any signed account; here they need an admin account.
READ_ALL_ADMIN_CODES: frozenset[int] = frozenset(
    {
        RequestCode.GET_ALL_TOPIC_CONFIG,
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        RequestCode.GET_ALL_DELAY_OFFSET,
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
        RequestCode.GET_ALL_PRODUCER_INFO,
        RequestCode.QUERY_CONSUME_QUEUE,
    }
)
#: Every code that needs ``admin: true`` (``[acl.plain] extra_admin_codes`` adds more).
ADMIN_CODES: frozenset[int] = (
    ROCKETMQ_ADMIN_CODES | ACL_ADMIN_CODES | OPERATOR_ADMIN_CODES | READ_ALL_ADMIN_CODES
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
