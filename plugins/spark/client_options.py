"""Client settings every ``tidemq`` source and sink passes through to tidemq's client.

Kafka's connector passes ``kafka.*`` options to its consumer and producer; tidemq's passes the
ACL credentials and the tcp transport's TLS keys, so a query can reach a secured cluster:

============================  =====================================  ==============================
Spark option                  also accepted                          tidemq client setting
============================  =====================================  ==============================
``accessKey``                 ``access.key`` (RocketMQ Flink/        ``SessionCredentials.access_key``
                              console), ``AccessKey`` (ONS)
``secretKey``                 ``secret.key``, ``SecretKey``          ``SessionCredentials.secret_key``
``securityToken``             ``security.token``, ``SecurityToken``  ``SessionCredentials.security_token``
``tls``                       ``tls.enabled``                        ``[transport.tcp] tls``
``tls.cafile``                ``tls_cafile``                         ``[transport.tcp] tls_cafile``
``tls.certfile``              ``tls_certfile``                       ``[transport.tcp] tls_certfile``
``tls.keyfile``               ``tls_keyfile``                        ``[transport.tcp] tls_keyfile``
``tls.checkHostname``         ``tls_check_hostname``                 ``[transport.tcp] tls_check_hostname``
============================  =====================================  ==============================

Option names are case-insensitive (as Spark's are).  The secret key and the token never appear
in a repr, a log line or an error message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from tidemq.client import SessionCredentials

from .options import TidemqSparkError

#: Spark option -> aliases (other connectors' spellings), all compared case-insensitively.
_ACCESS_KEY = ("accessKey", "access.key")
_SECRET_KEY = ("secretKey", "secret.key")
_TOKEN = ("securityToken", "security.token")
#: Spark option (and alias) -> the tcp transport's key.
_TLS_FILES = {
    "tls.cafile": ("tls_cafile", "tls_cafile"),
    "tls.certfile": ("tls_certfile", "tls_certfile"),
    "tls.keyfile": ("tls_keyfile", "tls_keyfile"),
}
_TLS = ("tls", "tls.enabled")
_TLS_HOSTNAME = ("tls.checkHostname", "tls_check_hostname")


def _lookup(options: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(option name as documented, value) of the first of ``names`` set in ``options``."""
    lowered = {str(k).lower(): v for k, v in options.items()}
    found = [(n, lowered[n.lower()]) for n in names if lowered.get(n.lower()) not in (None, "")]
    if len({str(v).strip() for _, v in found}) > 1:
        raise TidemqSparkError(
            f"options {' and '.join(n for n, _ in found)} are aliases but differ; give one"
        )
    if not found:
        return None
    return names[0], str(found[0][1]).strip()


def _flag(options: Mapping[str, str], names: tuple[str, ...]) -> bool | None:
    hit = _lookup(options, names)
    if hit is None:
        return None
    name, raw = hit
    value = raw.lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise TidemqSparkError(f"option {name} = {raw!r} is not true or false")


@attrs.frozen
class ClientOptions:
    """ACL credentials and transport options for :class:`~tidemq_spark.client.TidemqSession` and the sink's producer."""

    #: Every option name (and alias) :meth:`parse` reads, for the source's unknown-option check.
    OPTION_NAMES: ClassVar[tuple[str, ...]] = (
        *_ACCESS_KEY,
        *_SECRET_KEY,
        *_TOKEN,
        *_TLS,
        *_TLS_HOSTNAME,
        *(name for option, (alias, _) in _TLS_FILES.items() for name in (option, alias)),
    )

    access_key: str | None = None
    secret_key: str | None = attrs.field(default=None, repr=False)  # never in reprs or logs
    security_token: str | None = attrs.field(default=None, repr=False)
    #: The tcp transport's keys (``tls``, ``tls_cafile``...), as ``[transport.tcp]`` names them.
    transport_options: Mapping[str, Any] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ClientOptions:
        """The client settings named in ``options`` (see the module docstring for the names)."""
        ak, sk, token = (_lookup(options, names) for names in (_ACCESS_KEY, _SECRET_KEY, _TOKEN))
        if (ak is None) != (sk is None):
            given, missing = ("accessKey", "secretKey") if ak is not None else ("secretKey", "accessKey")
            raise TidemqSparkError(
                f"option {given} needs option {missing} too (ACL credentials come in pairs)"
            )
        if token is not None and ak is None:
            raise TidemqSparkError("option securityToken needs accessKey and secretKey")
        transport: dict[str, Any] = {}
        tls = _flag(options, _TLS)
        for option, (alias, key) in _TLS_FILES.items():
            hit = _lookup(options, (option, alias))
            if hit is None:
                continue
            if not os.path.isfile(hit[1]):
                raise TidemqSparkError(f"option {option} = {hit[1]!r} is not a readable file")
            transport[key] = hit[1]
        hostname = _flag(options, _TLS_HOSTNAME)
        if hostname is not None:
            transport["tls_check_hostname"] = hostname
        if transport and not tls:
            raise TidemqSparkError(
                f"options {', '.join(sorted(k.replace('_', '.', 1) for k in transport))} need tls=true"
            )
        if tls:
            transport["tls"] = True
        if "tls_certfile" in transport and "tls_keyfile" not in transport:
            raise TidemqSparkError("option tls.certfile needs tls.keyfile (the client certificate's key)")
        return cls(
            access_key=ak[1] if ak else None,
            secret_key=sk[1] if sk else None,
            security_token=token[1] if token else None,
            transport_options=transport,
        )

    @property
    def credentials(self) -> SessionCredentials | None:
        """What signs every request (RocketMQ's AclClientRPCHook), or None without keys."""
        if not (self.access_key and self.secret_key):
            return None
        return SessionCredentials(self.access_key, self.secret_key, security_token=self.security_token)

    def describe(self) -> str:
        """A log- and error-safe summary: the access key and whether TLS is on, never the secret."""
        who = f"access key {self.access_key!r}" if self.access_key else "no accessKey/secretKey options"
        return f"{who}, tls {'on' if self.transport_options.get('tls') else 'off'}"
