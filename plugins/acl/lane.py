"""The plain ACL's check of a request lane's frames (:class:`tidemq.acl.LaneAccessCheck`, issue 38).

A compiled request lane has a request's code, its header's ext fields and its body, but no
command object; :class:`PlainLaneCheck` decides from those whether
:meth:`~tidemq_acl.validator.PlainAccessValidator.validate` would allow the request, with the
validator's own pieces (its rules in force, reloads included; its admin codes; its resource rule,
:meth:`~tidemq_acl.validator.PlainAccessValidator.refusal`; :func:`tidemq.acl.verify_fields`
for the signature, the one HmacSHA1 of the broker and the clients).  It answers False in any doubt:
an unknown or missing access key, a refusal, a code whose resources are not header fields alone
(:data:`~tidemq_acl.resources.HEADER_ONLY_FIELDS`).  The broker then runs ``validate``, which
decides and words the refusal as it always did.

Per request it costs the signature (sort order of the header's names cached per shape, one
HmacSHA1 over the values and the body); what depends on the peer, the account, the code and the
header's topic and group alone (white addresses, admin rule, permissions) is decided once and
kept until the rules change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tidemq.acl import ACCESS_KEY, SigningKey, signing_key, verify_fields
from tidemq_acl.address import host_of
from tidemq_acl.resources import HEADER_ONLY_FIELDS, ResourceParseError, needed_resources

if TYPE_CHECKING:
    from tidemq_acl.accounts import PlainAcl
    from tidemq_acl.validator import PlainAccessValidator

#: Entries kept per cache before it starts over (peers, and accounts x codes x topics x groups).
_CACHE_MAX = 4096
#: A decision: (allowed by everything but the signature, the account's key to check it with, or
#: None when the account's white address waives it).
_Decision = tuple[bool, SigningKey | None]
_REFUSED: _Decision = (False, None)


class _BodyNotRead(Exception):
    """:func:`needed_resources` asked for the body of a code the lane check reads no body of."""


class _Header:
    """What :func:`needed_resources` reads of a request, here only the code and header fields."""

    __slots__ = ("code", "ext_fields")

    def __init__(self, code: int, ext_fields: dict[str, Any]) -> None:
        self.code = code
        self.ext_fields = ext_fields

    def payload(self) -> bytes:
        raise _BodyNotRead


class PlainLaneCheck:
    """``admits(code, ext_fields, body, remote_addr)``: True only where the validator's
    ``validate`` allows the request (see the module docstring)."""

    description = "plain ACL checked in the request lanes (HmacSHA1 and permissions from the frame)"

    __slots__ = ("_acl", "_decisions", "_hosts", "_validator")

    def __init__(self, validator: PlainAccessValidator) -> None:
        self._validator = validator
        self._acl: PlainAcl | None = None
        #: remote address -> (host, in the global white list)
        self._hosts: dict[str, tuple[str, bool]] = {}
        #: (access key, host, code, the code's header fields' values) -> decision
        self._decisions: dict[tuple[Any, ...], _Decision] = {}

    def admits(self, code: int, ext_fields: Mapping[str, Any], body: bytes | None, remote_addr: str) -> bool:
        validator = self._validator
        validator.maybe_reload()  # as validate does first
        acl = validator.acl
        if acl is not self._acl:  # reloaded or edited: every kept decision is of the old rules
            self._acl = acl
            self._hosts = {}
            self._decisions = {}
        peer = self._hosts.get(remote_addr)
        if peer is None:
            host = host_of(remote_addr)
            peer = (host, any(white(host) for white in acl.global_white))
            if len(self._hosts) >= _CACHE_MAX:
                self._hosts.clear()
            self._hosts[remote_addr] = peer
        if peer[1]:
            return True  # a global white address passes everything, signed or not
        names = HEADER_ONLY_FIELDS.get(code)
        access_key = ext_fields.get(ACCESS_KEY)
        if names is None or type(access_key) is not str:
            return False
        if len(names) == 2:  # every code's: a topic and a group
            key: tuple[Any, ...] = (
                access_key,
                peer[0],
                code,
                ext_fields.get(names[0]),
                ext_fields.get(names[1]),
            )
        else:
            key = (access_key, peer[0], code, *[ext_fields.get(name) for name in names])
        try:
            decision = self._decisions.get(key)
        except TypeError:  # a value that is no string (not from a wire header): validate's
            return False
        if decision is None:
            decision = self._decide(acl, access_key, peer[0], code, ext_fields, names)
            if len(self._decisions) >= _CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        allowed, signing = decision
        if not allowed:
            return False
        return signing is None or verify_fields(ext_fields, body, signing)

    def _decide(
        self,
        acl: PlainAcl,
        access_key: str,
        host: str,
        code: int,
        ext_fields: Mapping[str, Any],
        names: tuple[str, ...],
    ) -> _Decision:
        """validate's rules but the signature, for what the key holds: the peer, the account, the
        code and the header fields the code's resources are read from (and nothing else)."""
        validator = self._validator
        account = acl.accounts.get(access_key)
        if account is None:
            return _REFUSED
        if code in validator.admin_codes and not account.admin:
            return _REFUSED
        header = _Header(code, {name: ext_fields[name] for name in names if name in ext_fields})
        try:
            needed = needed_resources(header)
        except (ResourceParseError, _BodyNotRead):
            return _REFUSED
        if validator.refusal(account, needed) is not None:
            return _REFUSED
        return (True, None if account.white_address(host) else signing_key(account.secret_key))
