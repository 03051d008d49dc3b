"""Remote edits of ``plain_acl.yml`` (RocketMQ's PlainPermissionManager.updateAccessConfig,
deleteAccessConfig, updateGlobalWhiteAddrsConfig).

Every edit reads the file, changes the document, checks the result with the same parser the
broker loads it with, bumps ``dataVersion`` and replaces the file atomically (temp file, fsync,
rename): a crash mid-write leaves the old file or the new one, never half of one, and an edit that
would make the file unloadable is refused before anything is written.  Comments in the file do not
survive an edit (RocketMQ's snakeyaml dump drops them too).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs

from tidemq.jsonfile import atomic_write_bytes
from tidemq_acl.accounts import MIN_KEY_LENGTH, AclConfigError, PlainAcl, data_version_of, parse_plain_acl
from tidemq_acl.address import AddressPatternError, compile_pattern
from tidemq_acl.permission import DENY, parse_perm

DATA_VERSION = "dataVersion"


class AclEditError(AclConfigError):
    """An edit that RocketMQ refuses too (short keys, a malformed ``name=PERM``...)."""


@attrs.frozen
class AccessConfig:
    """One account as UPDATE_AND_CREATE_ACL_CONFIG carries it (RocketMQ's PlainAccessConfig).

    ``None`` means "not given": an update keeps what the file has for that key.
    """

    access_key: str
    secret_key: str | None = attrs.field(default=None, repr=False)
    white_remote_address: str | None = None
    admin: bool = False
    default_topic_perm: str | None = None
    default_group_perm: str | None = None
    topic_perms: list[str] | None = None
    group_perms: list[str] | None = None


def _check_resource_perms(entries: list[str] | None) -> None:
    """RocketMQ's Permission.checkResourcePerms: ``name=PERM`` with a PERM it knows."""
    for entry in entries or []:
        items = [p for p in entry.split("=") if p]
        if len(items) != 2:
            raise AclEditError(
                f"Parse Resource format error for {entry}. The expected resource format is 'Res=Perm'. "
                f"For example: topicA=SUB"
            )
        if items[1].strip() != "DENY" and parse_perm(items[1]) == DENY:
            raise AclEditError(
                f"Parse resource permission error for {entry}. The expected permissions are 'SUB' or "
                f"'PUB' or 'SUB|PUB' or 'PUB|SUB'."
            )


def check_access_config(config: AccessConfig) -> None:
    """What RocketMQ checks before an update: key lengths and ``name=PERM`` entries."""
    ak, sk = config.access_key, config.secret_key
    if not ak or not sk or len(ak) < MIN_KEY_LENGTH or len(sk) < MIN_KEY_LENGTH:
        raise AclEditError(
            f"The accessKey={ak} and secretKey cannot be null and length should longer than {MIN_KEY_LENGTH - 1}"
        )
    _check_resource_perms(config.topic_perms)
    _check_resource_perms(config.group_perms)
    if config.white_remote_address:
        try:
            compile_pattern(config.white_remote_address)
        except AddressPatternError as exc:
            raise AclEditError(str(exc)) from None


# ---------------------------------------------------------------------------- the document
def read_document(path: Path) -> dict[str, Any]:
    """The file as a mapping (every scalar a string, as the loader reads it); ``{}`` if absent or empty."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise AclConfigError(f"cannot read ACL file {path}: {exc}") from None
    import yaml  # here, not with the plugin: see accounts.load_plain_acl

    try:
        data = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        raise AclConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if data is None or data == "":
        return {}
    if not isinstance(data, dict):
        raise AclConfigError(
            f"{path}: the file must be a YAML mapping (globalWhiteRemoteAddresses, accounts)"
        )
    return data


def _typed(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with RocketMQ's types back on the keys that are not strings (``admin``,
    ``dataVersion``); everything else stays a string, so ``secretKey: '0123'`` stays text."""
    out = dict(doc)
    accounts = out.get("accounts")
    if isinstance(accounts, list):
        typed = []
        for account in accounts:
            if isinstance(account, dict) and isinstance(account.get("admin"), str):
                account = {**account, "admin": account["admin"].strip().lower() == "true"}
            typed.append(account)
        out["accounts"] = typed
    return out


def _write(path: Path, doc: dict[str, Any]) -> PlainAcl:
    """Bump the version, check the document loads, replace the file; the ACL now in the file."""
    counter, _ = data_version_of(doc)
    doc = _typed(doc)
    # RocketMQ's DataVersion.nextVersion: counter + 1, timestamp now.
    doc[DATA_VERSION] = [{"counter": counter + 1, "timestamp": int(time.time() * 1000)}]
    import yaml

    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False)
    # Parse what will be on disk exactly as the broker will read it, before it is on disk.
    acl = parse_plain_acl(yaml.load(text, Loader=yaml.BaseLoader), str(path))
    atomic_write_bytes(path, text.encode("utf-8"), mode=0o600)  # it holds secrets: 0600 when created
    return acl


def _account_map(existing: dict[str, Any] | None, config: AccessConfig) -> dict[str, Any]:
    """RocketMQ's createAclAccessConfigMap: given keys replace the file's, the rest stay."""
    out: dict[str, Any] = dict(existing or {})
    out["accessKey"] = config.access_key
    if config.secret_key:
        out["secretKey"] = config.secret_key
    if config.white_remote_address is not None:
        out["whiteRemoteAddress"] = config.white_remote_address
    out["admin"] = config.admin
    if config.default_topic_perm:
        out["defaultTopicPerm"] = config.default_topic_perm
    if config.default_group_perm:
        out["defaultGroupPerm"] = config.default_group_perm
    if config.topic_perms is not None:
        out["topicPerms"] = list(config.topic_perms)
    if config.group_perms is not None:
        out["groupPerms"] = list(config.group_perms)
    return out


def _accounts(doc: dict[str, Any]) -> list[Any]:
    accounts = doc.get("accounts")
    if accounts is None or accounts == "":
        return []
    if not isinstance(accounts, list):
        raise AclConfigError("accounts in the ACL file is not a list")
    return list(accounts)


def update_account(path: Path, config: AccessConfig) -> PlainAcl:
    """Create the account or update the keys given; the file is rewritten."""
    check_access_config(config)
    doc = read_document(path)
    accounts = _accounts(doc)
    for i, account in enumerate(accounts):
        if isinstance(account, dict) and account.get("accessKey") == config.access_key:
            accounts[i] = _account_map(account, config)
            break
    else:
        accounts.append(_account_map(None, config))
    doc["accounts"] = accounts
    return _write(path, doc)


def delete_account(path: Path, access_key: str) -> PlainAcl | None:
    """Remove the account; None when the file has no such account (nothing is written)."""
    doc = read_document(path)
    accounts = _accounts(doc)
    kept = [a for a in accounts if not (isinstance(a, dict) and a.get("accessKey") == access_key)]
    if len(kept) == len(accounts):
        return None
    doc["accounts"] = kept
    return _write(path, doc)


def update_global_white(path: Path, addresses: list[str]) -> PlainAcl:
    """Replace ``globalWhiteRemoteAddresses``."""
    for pattern in addresses:
        try:
            compile_pattern(pattern)
        except AddressPatternError as exc:
            raise AclEditError(str(exc)) from None
    doc = read_document(path)
    doc["globalWhiteRemoteAddresses"] = list(addresses)
    return _write(path, doc)


def account_configs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every account as RocketMQ's PlainAccessConfig JSON (fastjson: sorted keys, nulls left out)."""
    out = []
    for account in _accounts(doc):
        if not isinstance(account, dict):
            continue
        admin = account.get("admin", False)
        entry: dict[str, Any] = {
            "admin": admin.strip().lower() == "true" if isinstance(admin, str) else bool(admin)
        }
        for key in ("accessKey", "secretKey", "whiteRemoteAddress", "defaultTopicPerm", "defaultGroupPerm"):
            value = account.get(key)
            if value is not None and value != "":
                entry[key] = str(value)
        for key in ("topicPerms", "groupPerms"):
            value = account.get(key)
            if isinstance(value, list):
                entry[key] = [str(v) for v in value]
        out.append(dict(sorted(entry.items())))
    return out


def global_white(doc: dict[str, Any]) -> list[str]:
    value = doc.get("globalWhiteRemoteAddresses")
    return [str(v) for v in value] if isinstance(value, list) else []
