"""The broker's ACL administration requests (RocketMQ's AdminBrokerProcessor, ACL part):
UPDATE_AND_CREATE_ACL_CONFIG (50), DELETE_ACL_CONFIG (51), GET_BROKER_CLUSTER_ACL_INFO (52),
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG (53) and GET_BROKER_CLUSTER_ACL_CONFIG (54, served by RocketMQ
4.9.0-4.9.7).

Edits rewrite ``plain_acl.yml`` atomically (:mod:`tidemq_acl.editor`) and are in force when the
answer leaves.  The admin-only rule is the validator's (these codes are in
:data:`tidemq_acl.permission.ADMIN_CODES`): a request reaches a handler here only from an admin
account or a globally white-listed address.  On a broker whose ACL is not ``plain`` the edits are
answered with RocketMQ's ``*_FAILED`` codes and the reads with SYSTEM_ERROR, naming the setting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

from tidemq.context import BrokerContext, ProcessorRegister
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import dumps
from tidemq.transport import Connection, RequestHandler
from tidemq_acl.accounts import AclConfigError, PlainAcl
from tidemq_acl.editor import (
    AccessConfig,
    account_configs,
    delete_account,
    global_white,
    read_document,
    update_account,
    update_global_white,
)
from tidemq_acl.validator import PlainAccessValidator

log = logging.getLogger(__name__)

NOT_ENABLED = 'the plain ACL is not enabled on this broker ([plugins] acl = "plain")'


class _Missing(Exception):
    """A required header field is absent (answered SYSTEM_ERROR with RocketMQ's remark)."""


def _required(request: RemotingCommand, name: str) -> str:
    value = (request.ext_fields or {}).get(name)
    if value is None:
        raise _Missing(f"the custom field <{name}> is null")  # RocketMQ's @CFNotNull remark
    return str(value)


def _split(value: str | None) -> list[str] | None:
    """RocketMQ's UtilAll.split on ``,`` (None stays None: "not given")."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",")]


def _version_json(acl: PlainAcl, path: Path) -> dict[str, int]:
    counter, timestamp = acl.data_version
    if not timestamp:
        # A file no remote edit has stamped: RocketMQ's DataVersion would say "loaded now"; the
        # file's modification time is the closer answer to "last updated".
        try:
            timestamp = path.stat().st_mtime_ns // 1_000_000
        except OSError:
            timestamp = 0
    return {"counter": counter, "timestamp": timestamp}  # DataVersion in fastjson's key order


class AclAdminProcessor:
    """Handlers over the broker's :class:`PlainAccessValidator` (looked up per request)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        # One edit at a time (RocketMQ's handlers are synchronized): read-modify-write of one file.
        self._edit_lock = threading.Lock()

    def _validator(self) -> PlainAccessValidator | None:
        acl = self.broker.acl
        return acl if isinstance(acl, PlainAccessValidator) else None

    async def _edit(self, validator: PlainAccessValidator, edit: Any, *args: Any) -> PlainAcl | None:
        def run() -> PlainAcl | None:
            with self._edit_lock:
                acl = edit(validator.path, *args)
                if acl is not None:
                    validator.apply(acl)
                return acl

        return await asyncio.to_thread(run)

    async def update_and_create(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        failed = ResponseCode.UPDATE_AND_CREATE_ACL_CONFIG_FAILED
        validator = self._validator()
        if validator is None:
            return request.reply(failed, NOT_ENABLED)
        f = request.ext_fields or {}
        config = AccessConfig(
            access_key=_required(request, "accessKey"),
            secret_key=f.get("secretKey"),
            white_remote_address=f.get("whiteRemoteAddress"),
            admin=str(f.get("admin", "")).strip().lower() == "true",  # Boolean.parseBoolean
            default_topic_perm=f.get("defaultTopicPerm"),
            default_group_perm=f.get("defaultGroupPerm"),
            topic_perms=_split(f.get("topicPerms")),
            group_perms=_split(f.get("groupPerms")),
        )
        try:
            await self._edit(validator, update_account, config)
        except (AclConfigError, OSError) as exc:
            log.warning("ACL account %s not updated: %s", config.access_key, exc)
            return request.reply(failed, str(exc))
        log.info("ACL account %s created or updated by %s", config.access_key, conn.remote_address)
        return request.reply()

    async def delete(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        failed = ResponseCode.DELETE_ACL_CONFIG_FAILED
        validator = self._validator()
        if validator is None:
            return request.reply(failed, NOT_ENABLED)
        access_key = _required(request, "accessKey")
        try:
            acl = await self._edit(validator, delete_account, access_key)
        except (AclConfigError, OSError) as exc:
            return request.reply(failed, str(exc))
        if acl is None:
            return request.reply(
                failed,
                f"The accesskey[{access_key}] corresponding to accessConfig has been deleted failed: "
                f"no such account in {validator.path}",
            )
        log.info("ACL account %s deleted by %s", access_key, conn.remote_address)
        return request.reply()

    async def update_global_white(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        failed = ResponseCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED
        validator = self._validator()
        if validator is None:
            return request.reply(failed, NOT_ENABLED)
        raw = _required(request, "globalWhiteAddrs")
        # 4.9.4+ mqadmin names the file (-p); tidemq has one ACL file, so only that one is accepted.
        path = str((request.ext_fields or {}).get("aclFileFullPath") or "")
        if path and path != str(validator.path):
            return request.reply(
                failed,
                f"The globalWhiteAddresses[{raw}] has been updated failed: {path} is not this broker's "
                f"ACL file ({validator.path})",
            )
        addresses = [a for a in _split(raw) or [] if a]  # "" clears the list
        try:
            await self._edit(validator, update_global_white, addresses)
        except (AclConfigError, OSError) as exc:
            return request.reply(failed, f"The globalWhiteAddresses[{raw}] has been updated failed: {exc}")
        log.info("ACL global white addresses set to %s by %s", addresses, conn.remote_address)
        return request.reply()

    async def version_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        validator = self._validator()
        if validator is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, NOT_ENABLED)
        validator.maybe_reload()
        acl = validator.acl
        version = _version_json(acl, validator.path)
        settings = self.broker.settings
        fields = {
            "version": dumps(version).decode(),
            "allAclFileVersion": dumps({str(validator.path): version}).decode(),
            "brokerName": settings.name,
            "brokerAddr": self.broker.address,
            "clusterName": settings.cluster,
        }
        return request.reply(ext_fields=fields)

    async def cluster_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        validator = self._validator()
        if validator is None:
            return request.reply(ResponseCode.SYSTEM_ERROR, NOT_ENABLED)
        try:
            doc = await asyncio.to_thread(read_document, validator.path)
            body = {"globalWhiteAddrs": global_white(doc), "plainAccessConfigs": account_configs(doc)}
        except AclConfigError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        return request.reply(body=dumps(body))


def _answer_missing(handler: RequestHandler) -> RequestHandler:
    async def run(conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        try:
            return await handler(conn, request)
        except _Missing as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))

    return run


def register(register: ProcessorRegister) -> None:
    """Add the ACL administration handlers."""
    processor = AclAdminProcessor(register.context)
    for code, handler in (
        (RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, processor.update_and_create),
        (RequestCode.DELETE_ACL_CONFIG, processor.delete),
        (RequestCode.GET_BROKER_CLUSTER_ACL_INFO, processor.version_info),
        (RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, processor.update_global_white),
        (RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG, processor.cluster_config),
    ):
        register.add(code, _answer_missing(handler))
