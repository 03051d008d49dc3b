"""``plain_acl.yml`` in RocketMQ 4.x's format, read into accounts.

    globalWhiteRemoteAddresses:
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        whiteRemoteAddress:
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms:
          - topicA=DENY
          - topicB=PUB|SUB
        groupPerms:
          - groupA=DENY

Keys are those of RocketMQ's PlainAccessConfig; a mistake is an :class:`AclConfigError` naming
the file and the account, never the secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.errors import ConfigError
from tidemq_acl.address import AddressPatternError, Matcher, compile_pattern

if TYPE_CHECKING:
    import yaml
from tidemq_acl.permission import DENY, parse_perm
from tidemq_acl.resources import retry_topic

#: RocketMQ refuses keys of 6 characters or fewer (AclConstants.ACCESS_KEY_MIN_LENGTH).
MIN_KEY_LENGTH = 7
_ACCOUNT_KEYS = {
    "accessKey",
    "secretKey",
    "whiteRemoteAddress",
    "admin",
    "defaultTopicPerm",
    "defaultGroupPerm",
    "topicPerms",
    "groupPerms",
}
_TOP_KEYS = {"globalWhiteRemoteAddresses", "accounts", "dataVersion"}


class AclConfigError(ConfigError):
    """``plain_acl.yml`` cannot be used; the message names the file and what is wrong."""


@attrs.frozen
class Account:
    """One ``accounts`` entry (RocketMQ's PlainAccessResource as built from the file)."""

    access_key: str
    secret_key: str = attrs.field(repr=False)  # never in logs or reprs
    white_address: Matcher
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    #: topic -> perm, and ``%RETRY%group`` -> perm
    perms: Mapping[str, int]


@attrs.frozen
class PlainAcl:
    """The whole file."""

    global_white: tuple[Matcher, ...]
    accounts: Mapping[str, Account]
    #: ``dataVersion: [{counter, timestamp}]`` (RocketMQ's DataVersion); moved by every remote edit.
    data_version: tuple[int, int] = (0, 0)


_NULLS = ("", "~", "null", "Null", "NULL")


def _scalar(value: Any) -> str | None:
    """A scalar as text; YAML's spellings of null (the file is read with every scalar a string) are None."""
    if value is None or value in _NULLS:
        return None
    return str(value)


def _resource_perms(entries: Any, where: str, *, group: bool) -> dict[str, int]:
    what = "groupPerms" if group else "topicPerms"
    if entries is None or entries in _NULLS:
        return {}
    if not isinstance(entries, list):
        raise AclConfigError(f"{where}: {what} must be a list of 'name=PERM' strings")
    out: dict[str, int] = {}
    for entry in entries:
        items = [p for p in str(entry).split("=") if p]  # StringUtils.split drops empty parts
        if len(items) != 2:
            raise AclConfigError(f"{where}: {what} entry {entry!r} is not 'name=PERM'")
        name = items[0].strip()
        out[retry_topic(name) if group else name] = parse_perm(items[1])
    return out


def _account(raw: Any, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclConfigError(f"{where}: an account must be a mapping of accessKey, secretKey...")
    unknown = sorted(set(raw) - _ACCOUNT_KEYS)
    if unknown:
        raise AclConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_ACCOUNT_KEYS))}"
        )
    ak, sk = raw.get("accessKey"), raw.get("secretKey")
    ak = _scalar(ak)
    sk = _scalar(sk)
    if not ak or len(ak) < MIN_KEY_LENGTH:
        raise AclConfigError(f"{where}: accessKey must be at least {MIN_KEY_LENGTH} characters")
    where = f"{where} (accessKey {ak})"
    if not sk or len(sk) < MIN_KEY_LENGTH:
        raise AclConfigError(f"{where}: secretKey must be at least {MIN_KEY_LENGTH} characters")
    admin = raw.get("admin", False)
    if isinstance(admin, str):
        admin = admin.strip().lower() == "true"
    perms = _resource_perms(raw.get("groupPerms"), where, group=True)
    perms.update(_resource_perms(raw.get("topicPerms"), where, group=False))
    try:
        white = compile_pattern(_scalar(raw.get("whiteRemoteAddress")))
    except AddressPatternError as exc:
        raise AclConfigError(f"{where}: {exc}") from None
    return Account(
        access_key=ak,
        secret_key=sk,
        white_address=white,
        admin=bool(admin),
        default_topic_perm=parse_perm(raw.get("defaultTopicPerm")) if "defaultTopicPerm" in raw else DENY,
        default_group_perm=parse_perm(raw.get("defaultGroupPerm")) if "defaultGroupPerm" in raw else DENY,
        perms=perms,
    )


def parse_plain_acl(data: Any, source: str) -> PlainAcl:
    """Validate a parsed ``plain_acl.yml`` document."""
    if data is None or data in _NULLS:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(
            f"{source}: the file must be a YAML mapping (globalWhiteRemoteAddresses, accounts)"
        )
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise AclConfigError(
            f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(_TOP_KEYS))}"
        )
    white = data.get("globalWhiteRemoteAddresses") or []
    if white in _NULLS:
        white = []
    if not isinstance(white, list):
        raise AclConfigError(f"{source}: globalWhiteRemoteAddresses must be a list of address patterns")
    try:
        matchers = tuple(compile_pattern(p) for p in white)
    except AddressPatternError as exc:
        raise AclConfigError(f"{source}: globalWhiteRemoteAddresses: {exc}") from None
    raw_accounts = data.get("accounts") or []
    if raw_accounts in _NULLS:
        raw_accounts = []
    if not isinstance(raw_accounts, list):
        raise AclConfigError(f"{source}: accounts must be a list")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _account(raw, f"{source}: accounts[{i}]")
        if account.access_key in accounts:
            raise AclConfigError(f"{source}: accessKey {account.access_key} appears twice")
        accounts[account.access_key] = account
    return PlainAcl(global_white=matchers, accounts=accounts, data_version=data_version_of(data))


def data_version_of(data: dict[str, Any]) -> tuple[int, int]:
    """(counter, timestamp) of ``dataVersion``; (0, 0) when absent or not numbers (it is bookkeeping,
    not access control: a hand-edited stamp must not stop the broker)."""
    raw = data.get("dataVersion")
    first = raw[0] if isinstance(raw, list) and raw else None
    if not isinstance(first, dict):
        return (0, 0)
    try:
        return (int(first.get("counter", 0)), int(first.get("timestamp", 0)))
    except (TypeError, ValueError):
        return (0, 0)


def yaml_where(exc: yaml.YAMLError) -> str:
    """``" at line L, column C: <problem>"`` of a YAML error, without the text of the line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    # Some problems quote what they found ("found undefined alias 'x'"): only quote-free ones are kept.
    return f"{where}: {problem}" if isinstance(problem, str) and not set("'\"`") & set(problem) else where


def load_plain_acl(path: Path) -> PlainAcl:
    """Read and validate the file; every problem is one :class:`AclConfigError` line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AclConfigError(f"ACL file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"cannot read ACL file {path}: {exc}") from None
    import yaml  # here: a broker without the ACL does not hold PyYAML (docs/operations.md, "Memory")

    try:
        # Every scalar stays a string, as snakeyaml gives RocketMQ's String fields: a numeric
        # secret like 0123 or 1e10 must not turn into a number first.
        data = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        # Never str(exc): it quotes the offending line, which may hold a secretKey.
        raise AclConfigError(f"{path}: not valid YAML{yaml_where(exc)}") from None
    return parse_plain_acl(data, str(path))
