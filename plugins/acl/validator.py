"""The ``plain`` access validator (RocketMQ's PlainAccessValidator + PlainPermissionManager).

Order of checks, as RocketMQ 4.x: a global white address passes everything; otherwise the
request must name a known ``AccessKey``; the signature must match unless the peer is in the
account's own white address; admin request codes need ``admin: true`` and every resource the
request needs must be granted.  Unlike RocketMQ, the account's white address waives only the
signature (RocketMQ lets it waive the admin rule and the resources too), and the requests that name
a stored message by offset are checked against that message's topic (see ``README.md``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from tidemq.acl import (
    ACCESS_KEY,
    SIGNATURE,
    AccessDenied,
    NotAuthenticated,
    SignedCall,
    parse_v5_authorization,
    verify_signature,
    verify_v5_signature,
)
from tidemq.errors import CorruptDataError
from tidemq.message import Prop, decode_message
from tidemq.remoting.codes import RequestCode
from tidemq.store import MessageStore
from tidemq_acl.accounts import Account, AclConfigError, PlainAcl, load_plain_acl
from tidemq_acl.address import host_of
from tidemq_acl.lane import PlainLaneCheck
from tidemq_acl.permission import ADMIN_CODES, ANY, PUB, SUB, check_permission, perm_name
from tidemq_acl.resources import (
    STORED_MESSAGE_CODES,
    ResourceParseError,
    describe,
    is_group_key,
    needed_resources,
    retry_topic,
)

log = logging.getLogger(__name__)

#: RocketMQ's system topics holding messages for another topic (TopicValidator's names): a
#: transaction's half messages and delayed messages.
HOLDING_TOPICS = frozenset({"RMQ_SYS_TRANS_HALF_TOPIC", "SCHEDULE_TOPIC_XXXX"})


@attrs.define
class PlainAclOptions:
    """``[acl.plain]``."""

    #: plain_acl.yml; relative paths are under the broker's data directory.
    file: str = "plain_acl.yml"
    #: How often (at most) the file's modification is looked for; 0 = only at start.
    reload_check_s: float = 0.5
    #: Request codes that need an admin account besides the built-in ones (plugins/acl/README.md).
    extra_admin_codes: list[int] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        if self.reload_check_s < 0:
            raise ValueError(f"reload_check_s = {self.reload_check_s} must not be negative")
        for code in self.extra_admin_codes:
            if not isinstance(code, int) or isinstance(code, bool):
                raise ValueError(f"extra_admin_codes holds {code!r}, not a request code number")


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class PlainAccessValidator:
    """Validates requests against ``plain_acl.yml``, reloading it when it changes."""

    enforcing = True

    def __init__(
        self,
        path: Path,
        *,
        reload_check_s: float = 0.5,
        extra_admin_codes: frozenset[int] = frozenset(),
        store: MessageStore | None = None,
    ):
        self.path = path
        self.reload_check_s = reload_check_s
        #: The broker's store, read (``look_message_by_offset``) for the topic of a message named by
        #: offset.  Without one, those requests need an admin account.
        self.store = store
        self.admin_codes = ADMIN_CODES | extra_admin_codes
        if store is None:
            self.admin_codes |= frozenset(STORED_MESSAGE_CODES)
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self.acl: PlainAcl = load_plain_acl(path)  # a broken file at start is a config error
        self._next_check = time.monotonic() + reload_check_s
        log.info("plain ACL loaded from %s: %d account(s)", path, len(self.acl.accounts))

    # ------------------------------------------------------------------ reload
    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def maybe_reload(self, now: float | None = None) -> bool:
        """Reload when the file changed (checked at most every ``reload_check_s``); True if reloaded.

        A file that became invalid is logged and the accounts in force stay: a typo while editing
        must not lock every client out (nor let everyone in).
        """
        now = time.monotonic() if now is None else now
        if self.reload_check_s <= 0 or now < self._next_check:
            return False
        with self._lock:
            if now < self._next_check:
                return False
            self._next_check = now + self.reload_check_s
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            try:
                acl = load_plain_acl(self.path)
            except AclConfigError as exc:
                log.error("plain ACL not reloaded, the previous accounts stay in force: %s", exc)
                return False
            self.acl = acl
        log.info("plain ACL reloaded from %s: %d account(s)", self.path, len(acl.accounts))
        return True

    def apply(self, acl: PlainAcl) -> None:
        """Put ``acl``, just written to the file by a remote edit, in force at once (no reload wait)."""
        with self._lock:
            self.acl = acl
            self._stamp = self._file_stamp()  # the edit's own write is not a change to reload
        log.info(
            "plain ACL updated remotely in %s: %d account(s), data version %d",
            self.path,
            len(acl.accounts),
            acl.data_version[0],
        )

    # ------------------------------------------------------------------ validation
    def stored_topic(self, offset: int) -> str | None:
        """The topic of the message stored at commit-log ``offset``; None when there is none.

        A message held for later (a transaction's half message, a delayed message) belongs to
        the topic it will be delivered to, which its REAL_TOPIC property names.
        """
        assert self.store is not None
        raw = self.store.look_message_by_offset(offset)
        if raw is None:
            return None
        try:
            msg = decode_message(raw, with_body=False)
        except CorruptDataError:
            raise ResourceParseError(f"the message at offset {offset} cannot be read") from None
        if msg.topic in HOLDING_TOPICS:
            return msg.properties.get(Prop.REAL_TOPIC) or msg.topic
        return msg.topic

    def validate(self, request: Any, remote_addr: str) -> None:
        self.maybe_reload()
        acl = self.acl
        host = host_of(remote_addr)
        for white in acl.global_white:
            if white(host):
                return
        fields = request.ext_fields or {}
        access_key = fields.get(ACCESS_KEY)
        if access_key is None:
            raise AccessDenied(f"{_code_name(request.code)} carries no AccessKey (unsigned request)")
        account = acl.accounts.get(access_key)
        if account is None:
            raise AccessDenied(f"no ACL account for accessKey {access_key}", access_key)
        # The account's white address waives the signature only (RocketMQ: everything).
        if not account.white_address(host) and (
            SIGNATURE not in fields or not verify_signature(request, account.secret_key)
        ):
            raise AccessDenied(f"signature check failed for accessKey {access_key}", access_key)
        code = request.code
        if code in self.admin_codes and not account.admin:
            raise AccessDenied(
                f"request code {code} ({_code_name(code)}) needs an admin account; accessKey {access_key} is not",
                access_key,
            )
        try:
            needed = needed_resources(request, self.stored_topic if self.store is not None else None)
        except ResourceParseError as exc:
            raise AccessDenied(f"{_code_name(code)}: {exc}", access_key) from None
        refusal = self.refusal(account, needed)
        if refusal is not None:
            raise refusal

    def refusal(self, account: Account, needed: Mapping[str, int]) -> AccessDenied | None:
        """Why ``account`` may not have ``needed`` (resource -> permission), None when it may:
        :meth:`validate`'s resource rule, which the lane check (:mod:`tidemq_acl.lane`) shares."""
        if not needed or (account.admin and not account.perms):
            return None  # an admin without resource rules may do anything (as RocketMQ)
        access_key = account.access_key
        for resource, perm in needed.items():
            owned = account.perms.get(resource)
            default = owned is None
            if owned is None:
                owned = account.default_group_perm if is_group_key(resource) else account.default_topic_perm
            for bit in (PUB, SUB):  # a resource needed both ways needs both bits
                if not perm & bit or check_permission(bit, owned):
                    continue
                if default:
                    return AccessDenied(
                        f"no default permission for {describe(resource)} (accessKey {access_key} "
                        f"needs {perm_name(perm)})",
                        access_key,
                    )
                return AccessDenied(
                    f"no permission for {describe(resource)} (accessKey {access_key} has "
                    f"{perm_name(owned)}, needs {perm_name(perm)})",
                    access_key,
                )
        return None

    def lane_check(self) -> PlainLaneCheck:
        """:class:`tidemq.acl.AccessLanes`: this validator's check of a request lane's frames."""
        return PlainLaneCheck(self)

    def validate_call(self, call: SignedCall, remote_addr: str) -> None:
        """A RocketMQ 5 client's call (the gRPC endpoint): the same accounts, white addresses and
        topic/group permissions as a remoting request, its signature RocketMQ 5's
        (``hex(HmacSHA1(secretKey, x-mq-date-time))`` in the ``authorization`` metadata)."""
        self.maybe_reload()
        acl = self.acl
        host = host_of(remote_addr)
        for white in acl.global_white:
            if white(host):
                return
        if call.authorization is None:
            raise NotAuthenticated(f"{call.rpc} carries no authorization metadata (unsigned request)")
        access_key, signature = parse_v5_authorization(call.authorization)
        account = acl.accounts.get(access_key)
        if account is None:
            raise NotAuthenticated(f"no ACL account for accessKey {access_key}", access_key)
        if not account.white_address(host):
            if not call.date_time:
                raise NotAuthenticated(f"{call.rpc} carries no x-mq-date-time to check the signature of")
            if not verify_v5_signature(signature, call.date_time, account.secret_key):
                raise NotAuthenticated(f"signature check failed for accessKey {access_key}", access_key)
        if account.admin and not account.perms:
            return  # an admin without resource rules may do anything (as RocketMQ)
        needed: list[tuple[str, int]] = [(t, PUB) for t in call.publish]
        needed += [(t, SUB) for t in call.subscribe]
        needed += [(t, ANY) for t in call.look_up]
        needed += [(retry_topic(g), SUB) for g in call.groups]
        for resource, perm in needed:
            owned = account.perms.get(resource)
            default = owned is None
            if owned is None:
                owned = account.default_group_perm if is_group_key(resource) else account.default_topic_perm
            if check_permission(perm, owned):
                continue
            wanted = "PUB or SUB" if perm == ANY else perm_name(perm)
            if default:
                raise AccessDenied(
                    f"no default permission for {describe(resource)} (accessKey {access_key} needs {wanted})",
                    access_key,
                )
            raise AccessDenied(
                f"no permission for {describe(resource)} (accessKey {access_key} has "
                f"{perm_name(owned)}, needs {wanted})",
                access_key,
            )
