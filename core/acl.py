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

import binascii
import functools
import hashlib
import hmac
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

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


#: Per tuple of a header's keys, what reads its signed values in signing order: a client writes
#: the same names in the same order on every request, so the sort runs once per shape (bounded).
_ORDERS: dict[tuple[str, ...], Callable[[Mapping[str, Any]], tuple[Any, ...]]] = {}
_ORDERS_MAX = 1024


def _signed_values(keys: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    read = _ORDERS.get(keys)
    if read is None:
        if all(k.isascii() for k in keys):
            order = sorted(keys)  # the usual case, where code-point order is Java's order
        else:
            order = sorted(keys, key=_java_order)
        order = [k for k in order if k != SIGNATURE and k != UNIQUE_KEY_QUERY]
        if len(order) > 1:
            read = operator.itemgetter(*order)  # a tuple of the values, in C
        else:
            read = functools.partial(_values_of, tuple(order))
        if len(_ORDERS) >= _ORDERS_MAX:
            _ORDERS.clear()
        _ORDERS[keys] = read
    return read


def _values_of(order: tuple[str, ...], fields: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(fields[k] for k in order)


def signed_values(ext_fields: Mapping[str, Any]) -> bytes:
    """The header part of what RocketMQ signs: the ext field values sorted by key (Java's order),
    without ``Signature`` and ``_UNIQUE_KEY_QUERY``, as UTF-8."""
    values = _signed_values(tuple(ext_fields))(ext_fields)
    try:
        text = "".join(values)
    except TypeError:  # a value that is no string (a caller's int): its str(), as RocketMQ's
        text = "".join([v if type(v) is str else str(v) for v in values])
    return text.encode("utf-8")


def signature_content(ext_fields: Mapping[str, Any], body: bytes | None) -> bytes:
    """The bytes RocketMQ signs: sorted ext field values (no Signature) followed by the body."""
    data = signed_values(ext_fields)
    return data + body if body else data


class SigningKey:
    """A secret key's HmacSHA1 (RFC 2104), its inner and outer hash states keyed once: what signs
    and checks RocketMQ's signatures here (:func:`calc_signature`, :func:`verify_fields`)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret_key: str) -> None:
        key = secret_key.encode("utf-8")
        if len(key) > _SHA1_BLOCK:
            key = hashlib.sha1(key).digest()
        key = key.ljust(_SHA1_BLOCK, b"\0")
        self._inner = hashlib.sha1(key.translate(_IPAD))
        self._outer = hashlib.sha1(key.translate(_OPAD))

    def digest(self, *parts: bytes) -> bytes:
        """HmacSHA1 of the parts, one after the other (no joined copy)."""
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def signature(self, *parts: bytes) -> str:
        """``base64(HmacSHA1(secret, parts))``: a request's ``Signature``."""
        return binascii.b2a_base64(self.digest(*parts), newline=False).decode("ascii")


_SHA1_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


@functools.lru_cache(maxsize=256)
def signing_key(secret_key: str) -> SigningKey:
    """The :class:`SigningKey` of ``secret_key`` (kept for the few keys a process signs with)."""
    return SigningKey(secret_key)


def calc_signature(content: bytes, secret_key: str) -> str:
    """``base64(HmacSHA1(secret_key, content))`` (RocketMQ's AclSigner, spas_sign in the C++ client)."""
    return signing_key(secret_key).signature(content)


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
    return verify_fields(request.ext_fields or {}, request.payload() or None, secret_key)


def verify_fields(ext_fields: Mapping[str, Any], body: bytes | None, secret_key: str | SigningKey) -> bool:
    """:func:`verify_signature` of a request's ext fields and body as they are (a request lane's
    frame: no command object made)."""
    given = ext_fields.get(SIGNATURE)
    if not given:
        return False
    key = secret_key if isinstance(secret_key, SigningKey) else signing_key(secret_key)
    values = signed_values(ext_fields)
    expected = key.digest(values, body) if body else key.digest(values)
    return hmac.compare_digest(
        binascii.b2a_base64(expected, newline=False),
        given.encode("utf-8", "replace") if type(given) is str else str(given).encode("utf-8", "replace"),
    )


# ---------------------------------------------------------------------------- request lanes
@runtime_checkable
class LaneAccessCheck(Protocol):
    """An access validator's check of a request from what a compiled request lane already has
    (issue 38): the code, the header's ext fields (``AccessKey``, ``Signature``... included), the
    body and the peer, without a command object.  Optional: a validator offers it through
    :class:`AccessLanes`; without one, every request goes the Python way (``validate``).

    ``admits`` answers True only where ``validate`` of that request would return (allow); False
    in any doubt (an unknown account, a refusal, a code or a field it does not read): the request
    then goes the Python way, whose ``validate`` decides and words the refusal.  It changes
    nothing a later ``validate`` sees (a reload of the rules it may do, as ``validate`` would).
    """

    #: What the broker's start-up log says of it.
    description: str

    def admits(self, code: int, ext_fields: Mapping[str, Any], body: bytes | None, remote_addr: str) -> bool:
        """Whether ``validate`` would allow the request (True), or the Python way must decide (False).
        Runs on the broker's event loop, per request."""


@runtime_checkable
class AccessLanes(Protocol):
    """An access validator that offers a :class:`LaneAccessCheck` (asked once, at start)."""

    def lane_check(self) -> LaneAccessCheck | None:
        """The check, or None when this validator (or its configuration) has none."""


def lane_access_check(validator: object) -> LaneAccessCheck | None:
    """``validator``'s lane check, or None when it offers none (or there is no validator)."""
    if validator is None or not isinstance(validator, AccessLanes):
        return None
    return validator.lane_check()


# ---------------------------------------------------------------------------- RocketMQ 5 (gRPC)
#: gRPC metadata of a RocketMQ 5 client's signature (the proxy's AuthenticationHeader).
V5_AUTHORIZATION = "authorization"
V5_DATE_TIME = "x-mq-date-time"
#: The signing method the v5 clients name: ``MQv2-HMAC-SHA1 Credential=<ak>,
#: SignedHeaders=x-mq-date-time, Signature=<hex HmacSHA1(secretKey, x-mq-date-time)>``.
V5_METHOD = "MQv2-HMAC-SHA1"


class NotAuthenticated(AccessDenied):
    """Refused before any permission was looked at: no, a malformed or a wrong signature, or an
    unknown access key (a v5 client gets UNAUTHORIZED; a plain :class:`AccessDenied` is FORBIDDEN)."""


@attrs.frozen
class SignedCall:
    """A RocketMQ 5 client's call (gRPC) as an access validator sees it: its signature metadata
    and what it needs.  Built by the gRPC transport (:meth:`of`) from the call's metadata and request."""

    #: The RPC's name (``SendMessage``...), for messages.
    rpc: str
    #: The ``authorization`` metadata (None: the call carries none, an unsigned call).
    authorization: str | None
    #: ``x-mq-date-time``: what the signature signs.
    date_time: str | None
    #: Topics the call writes to (PUB), reads from (SUB), or only looks up (either will do).
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    look_up: tuple[str, ...] = ()
    #: Consumer groups the call consumes as (SUB).
    groups: tuple[str, ...] = ()

    @classmethod
    def of(cls, rpc: str, metadata: Iterable[tuple[str, Any]], **needs: tuple[str, ...]) -> SignedCall:
        """The call of ``rpc`` with gRPC ``metadata`` (the signature's two keys are read)."""
        found: dict[str, str] = {}
        for key, value in metadata:
            if key in (V5_AUTHORIZATION, V5_DATE_TIME):
                found[key] = value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")
        return cls(rpc, found.get(V5_AUTHORIZATION), found.get(V5_DATE_TIME), **needs)


def parse_v5_authorization(value: str) -> tuple[str, str]:
    """``(access key, hex signature)`` of an ``authorization`` metadata value (RocketMQ's
    AuthorizationHeader); :class:`NotAuthenticated` when it is not one."""
    method, _, rest = value.partition(" ")
    if method != V5_METHOD or not rest:
        raise NotAuthenticated(f"authorization is not {V5_METHOD} (got {method[:40]!r})")
    access_key = signature = None
    for item in rest.split(","):
        key, sep, val = item.strip().partition("=")
        if not sep:
            raise NotAuthenticated("authorization keyValues length is incorrect")
        if key == "Credential":
            access_key = val.split("/")[0]
        elif key == "Signature":
            signature = val
    if access_key is None or not signature:
        raise NotAuthenticated("authorization names no Credential or no Signature")
    return access_key, signature


def v5_signature(secret_key: str, date_time: str) -> str:
    """What a v5 client signs with: ``hex(HmacSHA1(secretKey, x-mq-date-time))``."""
    return hmac.digest(secret_key.encode("utf-8"), date_time.encode("utf-8"), "sha1").hex()


def verify_v5_signature(signature: str, date_time: str, secret_key: str) -> bool:
    """Whether ``signature`` (hex) is ``secret_key``'s over ``date_time``."""
    expected = v5_signature(secret_key, date_time)
    return hmac.compare_digest(expected.encode("ascii"), signature.lower().encode("utf-8", "replace"))


@runtime_checkable
class CallValidator(Protocol):
    """An access validator that also checks RocketMQ 5 clients' calls (the gRPC endpoint serves
    with ACL on only when the broker's validator is one)."""

    def validate_call(self, call: SignedCall, remote_addr: str) -> None:
        """Return when ``call`` from ``remote_addr`` (``host:port``) may run; raise
        :class:`NotAuthenticated` (bad or no signature, unknown key) or :class:`AccessDenied`
        (no permission) otherwise.  Runs on the broker's event loop."""
