"""``tidemq filtersrv``: a filter server that pulls from its broker and serves filtered pulls.

RocketMQ 4.x's filter server (``FiltersrvController``) runs next to a broker, registers with it
(REGISTER_FILTER_SERVER every 10 s; the broker lists it to the NameServers, which hand it out in
the route's ``filterServerTable``), and answers consumers' PULL_MESSAGE requests by pulling from
the broker on their behalf and keeping only the messages the consumer's filter accepts.  RocketMQ
consumers upload Java filter *source* for it to compile; tidemq never runs code sent over the
wire.  Instead the filter is chosen by name:

* ``expressionType`` of the pull names any filter type installed as a plugin (``TAG``, ``SQL92``,
  or a third party's, e.g. a regular-expression filter), ``subscription`` is its expression;
* the broker pull is made with ``TAG *`` and the same group, queue, offset, commit offset and
  suspend timeout, so offsets, commits and long polling behave as with the broker itself;
* the answer keeps the broker's records byte for byte (only the matching ones) and its
  ``nextBeginOffset`` / ``minOffset`` / ``maxOffset``; a page with no match is answered
  PULL_RETRY_IMMEDIATELY with the advanced offset (the consumer pulls on at once).

REGISTER_MESSAGE_FILTER_CLASS (class upload) is refused with a one-line explanation.  Supported:
PULL_MESSAGE only; heartbeats, offsets and sends go to the broker as usual.

Access control (beside a broker with ``acl = "plain"``): given an access validator (``--acl-file``,
the broker's ``plain_acl.yml``), every consumer pull is checked against it, signature, topic and
group, before anything is forwarded; given credentials (``--access-key``), the filter server signs
its registration and the pulls it forwards with its own account.  RocketMQ's filter server checks
nothing and signs nothing, so deployments white-list it, which opens every topic to whoever
reaches it.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Mapping
from typing import Any

from tidemq.acl import (
    ACCESS_KEY,
    ONS_CHANNEL,
    SECURITY_TOKEN,
    SIGNATURE,
    AccessDenied,
    AccessValidator,
    sign_request,
)
from tidemq.address import split_address
from tidemq.errors import CorruptDataError, TidemqError
from tidemq.message import decode_message, local_ip, tags_hash_code
from tidemq.plugins import PluginManager, get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.tasks import supervise
from tidemq.transport import Connection

log = logging.getLogger(__name__)

REGISTER_INTERVAL_S = 10.0  # RocketMQ's filter server registers every 10 s
BROKER_TIMEOUT_S = 10.0
MAX_EMPTY_PAGES = 8  # broker pages read per consumer pull before answering "no match, go on"
PULL_FLAG_SUBSCRIPTION = 4
_TOTAL = struct.Struct(">i")
_CONSUMER_AUTH_FIELDS = frozenset({ACCESS_KEY, SIGNATURE, SECURITY_TOKEN, ONS_CHANNEL})


class FilterServer:
    """One filter server process serving one broker."""

    def __init__(
        self,
        broker_addr: str,
        listen: str = "127.0.0.1:0",
        *,
        transport: Any = None,
        manager: PluginManager | None = None,
        register_interval_s: float = REGISTER_INTERVAL_S,
        acl: AccessValidator | None = None,
        credentials: tuple[str, str] | None = None,
    ):
        self.broker_addr = broker_addr
        #: Checks each consumer's pull before it is forwarded (None: every pull is forwarded).
        self.acl = acl if acl is not None and acl.enforcing else None
        #: (access key, secret key) signing what this server sends its broker.
        self.credentials = credentials
        self.listen = listen
        self.manager = manager or get_plugin_manager()
        self.transport = transport or self.manager.create("transport", "tcp")
        self.register_interval_s = register_interval_s
        self.factories: dict[str, Any] = {}
        self._compiled: dict[tuple[str, str], Any] = {}
        self._server: Any = None
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._address = listen
        self.broker_name = ""
        self.registered = asyncio.Event()

    @property
    def address(self) -> str:
        return self._address

    async def start(self) -> None:
        for name in self.manager.available("filter"):
            # Filter types run here without a store: no dispatch-time pre-check.
            self.factories[name] = self.manager.create("filter", name)
        host, port = split_address(self.listen)
        self._server = self.transport.server(host, port, self.handle)
        await self._server.start()
        bound_host, bound_port = self._server.address[:2]
        if bound_host in ("0.0.0.0", "::", ""):
            bound_host = local_ip()
        self._address = f"{bound_host}:{bound_port}"
        self._client = self.transport.client()
        await self._register_once()
        self._task = supervise(self._register_loop, "tidemq-filtersrv-register")
        log.info(
            "filter server %s serving broker %s with filters: %s",
            self._address,
            self.broker_addr,
            ", ".join(sorted(self.factories)),
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._server is not None:
            await self._server.stop()
        if self._client is not None:
            await self._client.close()

    def _request(self, code: int, fields: dict[str, str]) -> RemotingCommand:
        """A request to the broker, signed with this server's account when it has one."""
        req = RemotingCommand.request(code, fields)
        if self.credentials is not None:
            sign_request(req, *self.credentials)
        return req

    # ------------------------------------------------------------------ registration
    async def _register_once(self) -> None:
        req = self._request(RequestCode.REGISTER_FILTER_SERVER, {"filterServerAddr": self._address})
        try:
            resp = await self._client.invoke(self.broker_addr, req, BROKER_TIMEOUT_S)
        except Exception as exc:
            log.warning("cannot register with broker %s: %s", self.broker_addr, exc)
            return
        if resp.code != ResponseCode.SUCCESS:
            log.warning(
                "broker %s refused the filter server: %s %s", self.broker_addr, resp.code, resp.remark
            )
            return
        if not self.registered.is_set():
            self.broker_name = (resp.ext_fields or {}).get("brokerName", "")
            log.info("registered with broker %s (%s)", self.broker_addr, self.broker_name)
        self.registered.set()

    async def _register_loop(self) -> None:
        while True:
            await asyncio.sleep(self.register_interval_s)
            await self._register_once()

    # ------------------------------------------------------------------ serving
    def compile(self, expression_type: str, expression: str) -> Any:
        key = (expression_type, expression)
        flt = self._compiled.get(key)
        if flt is None:
            factory = self.factories.get(expression_type)
            if factory is None:
                raise LookupError(
                    f"filter {expression_type!r} is not installed on this filter server; installed: {', '.join(sorted(self.factories))}"
                )
            flt = factory.compile(expression)
            if len(self._compiled) > 1024:
                self._compiled.clear()
            self._compiled[key] = flt
        return flt

    async def handle(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if self.acl is not None:
            try:
                self.acl.validate(request, conn.remote_address)
            except AccessDenied as exc:
                log.warning("refused request %s from %s: %s", request.code, conn.remote_address, exc.reason)
                return request.reply(ResponseCode.NO_PERMISSION, f"no permission: {exc.reason}")
        try:
            if request.code == RequestCode.PULL_MESSAGE:
                return await self.pull(request)
            if request.code == RequestCode.REGISTER_MESSAGE_FILTER_CLASS:
                return request.reply(
                    ResponseCode.SYSTEM_ERROR,
                    "tidemq filter servers do not accept filter classes over the wire; install a filter "
                    "plugin and name it as the pull's expressionType",
                )
            return request.reply(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                f"request type {request.code} not supported by tidemq filtersrv",
            )
        except (TidemqError, OSError, TimeoutError) as exc:
            log.warning("request %s failed: %s", request.code, exc)
            return request.reply(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    async def pull(self, request: RemotingCommand) -> RemotingCommand:
        fields = dict(request.ext_fields or {})
        expression_type = fields.get("expressionType") or "TAG"
        expression = fields.get("subscription") or "*"
        try:
            flt = self.compile(expression_type, expression)
        except (ValueError, LookupError) as exc:
            return request.reply(
                ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                f"parse the consumer's subscription[{expression}] failed: {exc}",
            )
        # The consumer's own signature fields are dropped: the pull is forwarded as this server's.
        forward = {k: v for k, v in fields.items() if k not in _CONSUMER_AUTH_FIELDS}
        forward["subscription"] = "*"
        forward["expressionType"] = "TAG"
        try:
            forward["sysFlag"] = str(int(fields.get("sysFlag", "0")) | PULL_FLAG_SUBSCRIPTION)
        except ValueError:
            return request.reply(
                ResponseCode.SYSTEM_ERROR, f"sysFlag = {fields.get('sysFlag')!r} is not an integer"
            )
        suspend_ms = int(fields.get("suspendTimeoutMillis") or 0)
        resp: RemotingCommand | None = None
        for _ in range(MAX_EMPTY_PAGES):
            resp = await self._client.invoke(
                self.broker_addr,
                self._request(RequestCode.PULL_MESSAGE, forward),
                BROKER_TIMEOUT_S + suspend_ms / 1000.0,
            )
            if resp.code != ResponseCode.SUCCESS:
                return request.reply(resp.code, resp.remark, dict(resp.ext_fields or {}))
            kept = self._filter(resp.payload(), flt)
            if kept:
                return request.reply(
                    ResponseCode.SUCCESS, None, dict(resp.ext_fields or {}), body_parts=tuple(kept)
                )
            # A page without a match: read on from where it ended, without holding this time.
            forward["queueOffset"] = resp.ext_fields["nextBeginOffset"]
            forward["suspendTimeoutMillis"] = "0"
            forward["sysFlag"] = str(int(forward["sysFlag"]) & ~2)
        assert resp is not None
        return request.reply(
            ResponseCode.PULL_RETRY_IMMEDIATELY, "no matched message", dict(resp.ext_fields or {})
        )

    @staticmethod
    def _filter(payload: bytes | memoryview | None, flt: Any) -> list[memoryview]:
        if not payload:
            return []
        view = memoryview(payload)
        kept = []
        pos = 0
        while pos + 4 <= len(view):
            (total,) = _TOTAL.unpack_from(view, pos)
            if total <= 0 or pos + total > len(view):
                log.error("broker answer holds a truncated record at %d", pos)
                break
            try:
                props: Mapping[str, str] = decode_message(view, pos, with_body=False).properties
            except CorruptDataError as exc:
                log.error("broker answer holds an unreadable record: %s", exc)
                pos += total
                continue
            if flt.matches_tags_code(tags_hash_code(props.get("TAGS"))) and flt.matches_message(props):
                kept.append(view[pos : pos + total])
            pos += total
        return kept
