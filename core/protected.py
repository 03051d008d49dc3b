"""Protected mode: a listener reachable beyond loopback must authenticate, unless told it need not.

Redis refuses remote clients without a password unless told otherwise; tidemq does the same for
the listeners that would otherwise hand the cluster to anyone who reaches them:

==================== ============================================= ===============================
listener             authenticated when                            opt-out
==================== ============================================= ===============================
broker (remoting)    ``[plugins] acl`` names an enforcing          ``[broker] insecure = true``
                     validator (``"plain"``)
NameServer           ``[namesrv] credentials_file`` is set (its    ``[namesrv] insecure = true``
                     writes need a signature)
HA port (master)     ``secret_file`` is set in                     ``insecure = true`` in that
                     ``[replication.master_slave]`` or             table
                     ``[replication.controller]``
==================== ============================================= ===============================

"Beyond loopback" is any host that is not a loopback address (``127.0.0.0/8``, ``::1``,
``localhost``): a wildcard (``0.0.0.0``, ``::``), a routable address or a host name.  Refusal is a
:class:`~tidemq.errors.ConfigError` of one line naming the fix; ``tidemq check-config`` runs the
same checks and prints the warning of each listener left open with ``insecure = true``.

:func:`broker_credentials` reads the broker's own account (``[broker] access_key`` and
``secret_key_file``), which signs its registrations for NameServers that check them.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import attrs

from tidemq.errors import ConfigError
from tidemq.secretfile import read_secret_file

log = logging.getLogger(__name__)

_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name, brackets allowed) is reachable only from this machine."""
    h = host.strip().strip("[]").lower()
    if h in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h.split("%", 1)[0]).is_loopback
    except ValueError:
        return False  # a wildcard ("") or a host name: reachable from elsewhere


@attrs.frozen
class Listener:
    """One listener as protected mode sees it."""

    #: What listens, in messages ("broker broker-a", "NameServer", "HA port of broker-a").
    what: str
    #: The host it binds (the part of HOST:PORT before the port).
    host: str
    #: Whether its clients must authenticate (see the module's table).
    authenticated: bool
    #: How to turn authentication on, as the operator would write it.
    fix: str
    #: The option that allows it open (``[broker] insecure``).
    insecure_option: str
    #: The value of that option.
    insecure: bool = False


def open_beyond_loopback(listener: Listener) -> bool:
    return not listener.authenticated and not is_loopback(listener.host)


def refusal(listener: Listener) -> str:
    where = listener.host or "every interface"
    return (
        f"protected mode: the {listener.what} would listen on {where} beyond loopback without "
        f"authentication; {listener.fix}, or set {listener.insecure_option} = true to run open on a "
        "trusted network (RocketMQ's behaviour)"
    )


def warning(listener: Listener) -> str:
    where = listener.host or "every interface"
    return (
        f"insecure: the {listener.what} listens on {where} without authentication "
        f"({listener.insecure_option} = true): anyone who reaches it can use it; {listener.fix}"
    )


_issued: list[str] = []


def check(listener: Listener) -> str | None:
    """Raise ConfigError for an open listener beyond loopback; return the warning when
    ``insecure`` lets it run open (also logged, and kept for :func:`issued_warnings`), None when
    it is protected."""
    if not open_beyond_loopback(listener):
        return None
    if not listener.insecure:
        raise ConfigError(refusal(listener))
    text = warning(listener)
    log.warning("%s", text)
    _issued.append(text)
    return text


def issued_warnings() -> list[str]:
    """The warnings :func:`check` gave in this process so far, and forget them (check-config prints them)."""
    out = list(_issued)
    _issued.clear()
    return out


# ------------------------------------------------------------------ the kernel's listeners
def check_broker_settings(settings: Any, acl: Any) -> None:
    """The broker's remoting listener (``[broker]``, ``acl`` the validator or None) and its
    own account: raise ConfigError, or return (a warning logged when left open)."""
    enforcing = acl is not None and bool(getattr(acl, "enforcing", False))
    check(
        Listener(
            what=f"broker {settings.name}",
            host=settings.host,
            authenticated=enforcing,
            fix='turn the ACL on with [plugins] acl = "plain" and an [acl.plain] file',
            insecure_option="[broker] insecure",
            insecure=settings.insecure,
        )
    )
    broker_credentials(settings)


def broker_credentials(settings: Any) -> tuple[str, str] | None:
    """(access key, secret key) the broker signs its own requests with, None when not configured."""
    key, path = settings.access_key, settings.secret_key_file
    if not key and not path:
        return None
    if not key or not path:
        raise ConfigError(
            "[broker] access_key and secret_key_file go together: the account this broker signs "
            "its registrations (and a slave's metadata copies) with"
        )
    return key, read_secret_file(path, "[broker] secret_key_file")


def check_namesrv_settings(settings: Any) -> None:
    """The NameServer's listener (``[namesrv]``): authenticated when ``credentials_file`` is set."""
    check(
        Listener(
            what="NameServer",
            host=settings.host,
            authenticated=bool(settings.credentials_file),
            fix="set [namesrv] credentials_file to a plain_acl.yml of the accounts allowed to write "
            "(brokers sign with [broker] access_key)",
            insecure_option="[namesrv] insecure",
            insecure=settings.insecure,
        )
    )


def check_ha_listener(broker: str, host: str, secret_file: str, insecure: bool, table: str) -> None:
    """A replication plugin's HA port on ``host``: authenticated when ``secret_file`` is set."""
    check(
        Listener(
            what=f"HA port of broker {broker}",
            host=host,
            authenticated=bool(secret_file),
            fix=f"set secret_file in {table} to a file of at least 16 random bytes (mode 0600) on "
            "the master and its slaves",
            insecure_option=f"{table} insecure",
            insecure=insecure,
        )
    )


__all__ = [
    "Listener",
    "broker_credentials",
    "check",
    "check_broker_settings",
    "check_ha_listener",
    "check_namesrv_settings",
    "is_loopback",
    "issued_warnings",
    "open_beyond_loopback",
    "refusal",
    "warning",
]
