"""Access control contract (role ``acl``) and RocketMQ's request signature.

The broker hands every request to the configured :class:`AccessValidator` before its processor
runs; a validator that refuses raises :class:`AccessDenied` and the broker answers
``NO_PERMISSION``.  The signature helpers here are shared by the broker-side plugin and tidemq's
clients, so both compute RocketMQ's definition (``AclClientRPCHook`` / ``AclUtils``) from one place:

    content   = values of the request's ext fields sorted by key, without ``Signature``
                (and without ``_UNIQUE_KEY_QUERY``, which the broker ignores), then the body
    Signature = base64(HmacSHA1(secretKey, content))

Everything is UTF-8, as RocketMQ's ``SessionCredentials.CHARSET``.
"""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from tidemq.errors import TidemqError

#: Ext field names RocketMQ's ACL uses (SessionCredentials).
ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
ONS_CHANNEL = "OnsChannel"
#: MixAll.UNIQUE_MSG_QUERY_FLAG: the broker leaves it out of the signed content.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"


class AccessDenied(TidemqError):
    """A request refused by the access validator; ``str()`` is the one-line reason."""

    def __init__(self, reason: str, access_key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.access_key = access_key


@runtime_checkable
class AccessValidator(Protocol):
    """What an ``acl`` factory returns; called by the broker for every request it receives."""

    #: False for a validator that allows everything: the broker then skips the call entirely.
    enforcing: bool

    def validate(self, request: Any, remote_addr: str) -> None:
        """Return when ``request`` (a RemotingCommand) from ``remote_addr`` (``host:port``) may
        run; raise :class:`AccessDenied` otherwise.  Must not block for long: it runs on the
        broker's event loop."""


class AllowAll:
    """The ``none`` validator: every request is allowed (the broker skips the call entirely)."""

    enforcing = False

    def validate(self, request: Any, remote_addr: str) -> None:
        return None


def _java_order(key: str) -> bytes:
    # Java's TreeMap<String> orders by UTF-16 code units; big-endian UTF-16 bytes sort the same.
    return key.encode("utf-16-be", "surrogatepass")


def signature_content(ext_fields: Mapping[str, str], body: bytes | None) -> bytes:
    """The bytes RocketMQ signs: sorted ext field values (no Signature) followed by the body."""
    keys = list(ext_fields)
    if all(k.isascii() for k in keys):
        keys.sort()  # the usual case, where code-point order is Java's order: no key function
    else:
        keys.sort(key=_java_order)
    values = "".join(
        [
            v if type(v) is str else str(v)
            for k in keys
            if k != SIGNATURE and k != UNIQUE_KEY_QUERY
            for v in (ext_fields[k],)
        ]
    )
    data = values.encode("utf-8")
    return data + body if body else data


def calc_signature(content: bytes, secret_key: str) -> str:
    """``base64(HmacSHA1(secret_key, content))`` (RocketMQ's AclSigner, spas_sign in the C++ client)."""
    digest = hmac.digest(secret_key.encode("utf-8"), content, "sha1")  # one-shot, in C
    return base64.b64encode(digest).decode("ascii")


def sign_request(
    request: Any, access_key: str, secret_key: str, *, channel: str | None = None, token: str | None = None
) -> None:
    """Add ``AccessKey`` (and ``OnsChannel``/``SecurityToken`` when given) and the ``Signature``.

    The client-side RPC hook: the signature covers every ext field the request carries, so it
    must be called last, after all header fields are set.
    """
    fields = request.ext_fields
    fields.pop(SIGNATURE, None)
    fields[ACCESS_KEY] = access_key
    if channel is not None:
        fields[ONS_CHANNEL] = channel
    if token:
        fields[SECURITY_TOKEN] = token
    fields[SIGNATURE] = calc_signature(signature_content(fields, request.payload() or None), secret_key)


def verify_signature(request: Any, secret_key: str) -> bool:
    """Whether the request's ``Signature`` matches its content under ``secret_key``."""
    fields = request.ext_fields or {}
    given = fields.get(SIGNATURE)
    if not given:
        return False
    expected = calc_signature(signature_content(fields, request.payload() or None), secret_key)
    return hmac.compare_digest(expected.encode("ascii"), str(given).encode("utf-8", "replace"))
