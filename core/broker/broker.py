"""The broker process: lifecycle, request dispatch, periodic services."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from tidemq import _native
from tidemq.acl import ACCESS_KEY, AccessDenied, AccessValidator
from tidemq.address import split_address
from tidemq.broker.composition import BrokerFigures, build_parts
from tidemq.broker.confirmed import ReadBound
from tidemq.broker.dedup_rebuild import attach_window
from tidemq.broker.headers import HeaderFieldError
from tidemq.broker.hold import PullRequestHoldService
from tidemq.broker.lanes import SendLaneEntry, lane_access, send_lane_entry
from tidemq.broker.roles import RoleFollower
from tidemq.client.credentials import SessionCredentials, SigningRemoting
from tidemq.config import Components, registered_address
from tidemq.context import Handler, ProcessorRegister
from tidemq.datadir import DataDirLock, lock_data_dir
from tidemq.errors import StoreError, TidemqError
from tidemq.filter import DispatchingFilterFactory
from tidemq.message import local_ip
from tidemq.misdirected import UnsupportedRequests
from tidemq.names import InvalidNameError
from tidemq.protected import broker_credentials
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.replication import MetadataFollower, RoleAware
from tidemq.tasks import phase_of, sleep_until_tick, supervise
from tidemq.transport import BatchedProcessor, Connection, TransportClient, TransportServer

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_S = 3.0
_SEND_MESSAGE_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND_BATCH_MESSAGE = int(RequestCode.SEND_BATCH_MESSAGE)
_SEND_MESSAGE = int(RequestCode.SEND_MESSAGE)
#: The codes a store's send lane may serve (:mod:`tidemq.broker.lanes`).
_SEND_CODES = frozenset((_SEND_MESSAGE, _SEND_MESSAGE_V2, _SEND_BATCH_MESSAGE))
HOUSEKEEPING_PERIOD_S = 10.0


class _NotStartedClient:
    """The broker's client before :meth:`Broker.start` made the transport's."""

    async def invoke(self, address: str, request: Any, timeout: float) -> Any:
        raise TidemqError("the broker has not started: it has no client yet")

    async def invoke_oneway(self, address: str, request: Any) -> None:
        raise TidemqError("the broker has not started: it has no client yet")

    async def close(self) -> None:
        return None


_NOT_STARTED: TransportClient = _NotStartedClient()


def request_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class Broker:
    """A RocketMQ 4.x compatible broker over the plugins in ``components``."""

    def __init__(self, components: Components):
        self.components = components
        self.config = components.config
        self.settings = components.config.broker
        self.manager = components.manager
        self.hooks = components.manager.hook
        self.transport = components.transport
        self.store = components.store
        self.index = components.index
        self.replication = components.replication
        #: The replication when it decides the role at run time (controller mode), else None:
        #: cached here because ``is_master`` is read per send.
        self.role_aware: RoleAware | None = (
            self.replication if isinstance(self.replication, RoleAware) else None
        )
        self._static_master = self.settings.id == 0 and self.settings.role != "SLAVE"
        acl = components.acl
        #: The access validator (role ``acl``), None when access control is off.
        self.acl: AccessValidator | None = acl if acl is not None and acl.enforcing else None
        #: Its check from a request's fields alone (issue 38), asked before ``validate``; None: none.
        self.acl_lane = lane_access(self.acl)
        #: The metrics exporter (role ``metrics``), None when off; ``metrics_url`` once serving.
        self.metrics = components.metrics
        self.metrics_url = ""
        #: Seconds the store took to load (recovery), and requests the access validator refused.
        self.recovery_seconds = 0.0
        self.acl_refusals = 0
        #: Services of this process whose figures the exporter serves too (standalone's NameServer).
        self.metrics_companions: list[Any] = []
        #: Endpoints plugins serve beside the transport, name -> host:port, and their counters
        #: (BrokerContext.endpoints, .endpoint_figures).
        self.endpoints: dict[str, str] = {}
        self.endpoint_figures: dict[str, Callable[[], Mapping[str, int]]] = {}
        self.data_dir = self.settings.store_path
        self.hold: PullRequestHoldService | None = None
        #: Consumers' reads bounded by the replication's confirm offset (controller SYNC masters).
        self.read_bound = ReadBound(self.store, self.replication)
        # The composition root builds the rest (tidemq.broker.composition); plain attributes, as
        # processors read them per request.
        parts = build_parts(self, components)
        self.topics = parts.topics
        self.offsets = parts.offsets
        self.groups = parts.groups
        self.consumers = parts.consumers
        self.producers = parts.producers
        self.locks = parts.locks
        self.stats = parts.stats
        self.filters = parts.filters
        self.registrar = parts.registrar
        self.schedule = parts.schedule
        self.transactions = parts.transactions
        self.filter_servers = parts.filter_servers
        self.pop = parts.pop  # POP consumption (issue 39)
        self.timers = parts.timers  # timer messages (issue 36)
        self.dedup = parts.dedup  # the duplicate window (issue 37)
        #: Where a replication plugin writes the metadata a slave copies from its master.
        self.metadata_sink = parts.metadata_sink
        #: What the metrics exporter reads (read-only).
        self.figures = BrokerFigures(self, self.metrics_companions)
        #: Made as the broker starts (the transport's options are checked then); refuses before.
        self.client: TransportClient = _NOT_STARTED
        self._server: TransportServer | None = None
        self._address = self.settings.address
        self._store_host: tuple[str, tuple[str, int]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: dict[int, Handler] = {}
        self._running = False
        self._background: set[asyncio.Task[Any]] = set()
        self._dir_lock: DataDirLock | None = None
        self._unsupported = UnsupportedRequests("broker", log)
        #: Applies the role changes of a RoleAware replication (None otherwise).
        self.roles = (
            RoleFollower(self, self.role_aware, (self.schedule, self.timers, self.transactions))
            if self.role_aware is not None
            else None
        )

    # ------------------------------------------------------------------ identity
    @property
    def address(self) -> str:
        """``host:port`` clients and NameServers use to reach this broker."""
        return self._address

    @property
    def store_host(self) -> tuple[str, int]:
        """``address`` split: read per send, so parsed once per address, not per request."""
        cached = self._store_host
        if cached is None or cached[0] != self._address:
            cached = self._store_host = (self._address, split_address(self._address))
        return cached[1]

    @property
    def running(self) -> bool:
        """Serving requests: from the end of :meth:`start` to the beginning of :meth:`stop`."""
        return self._running

    @property
    def is_master(self) -> bool:
        """Takes writes now: the configured role, or the replication's in controller mode."""
        role_aware = self.role_aware
        if role_aware is not None:
            return role_aware.current_role() != "SLAVE"
        return self._static_master

    @property
    def role(self) -> str:
        """``ASYNC_MASTER``, ``SYNC_MASTER`` or ``SLAVE``, now (RocketMQ's brokerRole)."""
        role_aware = self.role_aware
        return role_aware.current_role() if role_aware is not None else self.settings.role

    @property
    def broker_id(self) -> int:
        """The id registered with the NameServers now (0: master)."""
        role_aware = self.role_aware
        return role_aware.current_broker_id() if role_aware is not None else self.settings.id

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        # Before anything reads or writes the directory: a second process on it is refused here.
        self._dir_lock = lock_data_dir(
            self.data_dir, f"tidemq broker {self.settings.name}", mode=self.settings.data_dir_mode
        )
        try:
            await self._start()
        except BaseException:
            self._dir_lock.release()
            raise

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self.topics.load()
        self.offsets.load()
        self.groups.load()
        # Before the store loads: a plugin that cannot register fails the start before recovery runs.
        self._handlers = self._collect_processors()
        loading = time.monotonic()
        if not self.store.load():
            raise StoreError(f"the store in {self.data_dir} could not be loaded")
        self.recovery_seconds = time.monotonic() - loading
        bound = self.read_bound
        self.hold = PullRequestHoldService(
            loop,
            bound.max_offset if bound.active else self.store.get_max_offset_in_queue,
            bounded=bound.active,
        )
        bound.bind(loop, self.hold.recheck, self.hold.has_waiters)
        self.hold.listen(self.store)
        self.schedule.load()
        self.schedule.attach(loop)
        self.pop.attach(loop)  # replays the POP journal; arrivals wake held pops
        bound.bind(loop, self.pop.waiters.notify_all, self.pop.waiters.has_waiters)
        self.timers.load()
        self.timers.attach(loop)
        self.store.start()
        if self.roles is not None:
            self.roles.bind(loop)
        try:
            self.replication.start(self.store, self.settings)
        except BaseException:
            # A taken HA port must not leave the store running (and its abort marker behind).
            self.store.shutdown()
            raise
        attach_window(self, self.dedup)  # from the commit log's tail; again at each new epoch
        self.topics.on_change = self.registrar.request
        server = self._server = self.transport.server(
            self.settings.host,
            self.settings.port,
            RequestHandler(self),  # handle, and handle_many for the requests of one read
            max_frame_size=self.settings.max_frame_size,
        )
        try:
            await server.start()
        except BaseException:
            # A taken port must not leave the store running (and its abort marker behind).
            self.replication.shutdown()
            self.store.shutdown()
            raise
        host, port = server.address[:2]
        try:
            # advertise, else the bound address; a wildcard becomes this machine's routable address
            # (refused when it has none: NameServers must not hand out 0.0.0.0 or 127.0.0.1).
            self._address = registered_address(self.settings, host, port, local_ip)
        except BaseException:
            await server.stop()
            self.replication.shutdown()
            self.store.shutdown()
            raise
        # The store derives message ids from the configured address; when the port was 0 it only
        # becomes known now, and ids must name the address clients can reach.
        self.store.store_host = self.store_host
        if self.metrics is not None:
            try:
                self.metrics_url = await self.metrics.start(self.figures)
            except BaseException:
                await server.stop()
                self.replication.shutdown()
                self.store.shutdown()
                raise
        self.client = self.transport.client()
        own = broker_credentials(self.settings)  # [broker] access_key: registrations, a slave's copies
        if own is not None:
            self.client = SigningRemoting(self.client, SessionCredentials(*own))
        if isinstance(self.replication, MetadataFollower):
            # handed here, not fished out of the broker by a hook: a slave copies its master's metadata
            self.replication.follow_metadata(self.metadata_sink, self.client)
        self._running = True
        if self.roles is not None:
            # Synchronous up to the registration: a role change reported meanwhile follows it.
            self.roles.started()
        self.schedule.start()
        self.timers.start()
        self.transactions.start()
        self.pop.start()
        await self.registrar.register_all()
        self.registrar.start()
        # Supervised: a periodic loop that fails is logged and restarted, never silently gone.
        self._tasks.append(supervise(self._flush_offsets_loop, "tidemq-offset-flush"))
        self._tasks.append(supervise(self._housekeeping_loop, "tidemq-client-housekeeping"))
        self._tasks.append(supervise(self.stats.sample_loop, "tidemq-stats-sampling"))
        log.info(
            "broker %s (%s) serving on %s; codec: %s; request lanes: %s",
            self.settings.name,
            self.settings.cluster,
            self._address,
            _native.DESCRIPTION,
            self.send_lane.description if self.send_lane is not None else "none",
        )
        try:
            self.hooks.tidemq_broker_started(broker=self)
        except Exception:
            log.exception("a tidemq_broker_started hook failed")

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            self.hooks.tidemq_broker_stopping(broker=self)
        except Exception:
            log.exception("a tidemq_broker_stopping hook failed")
        await self.registrar.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        try:
            await asyncio.wait_for(self.registrar.unregister_all(), 4.0)
        except (TimeoutError, Exception):
            pass
        if self.hold is not None:
            self.hold.stop()
        if self.metrics is not None:
            await self.metrics.stop()
        if self._server is not None:
            await self._server.stop()
        for factory in self.filters.values():
            if isinstance(factory, DispatchingFilterFactory):  # its own threads (the SQL92 bit map)
                factory.close()
        for task in list(self._background):
            task.cancel()
        self.dedup.close()  # its records would keep it (and their sends) alive after the stop
        # A full disk must not stop the shutdown: a table that cannot be written is logged and the
        # store below is still shut down and the data directory released.
        try:
            await self.schedule.stop()
        except OSError as exc:
            log.error("cannot write the delay offsets while stopping: %s", exc)
        await self.timers.stop()
        await self.transactions.stop()
        await self.pop.stop()
        _persisting("consumer offsets", lambda: self.offsets.persist(force=True))
        _persisting("topic configs", self.topics.close)
        _persisting("subscription groups", self.groups.close)
        self.replication.shutdown()
        self.store.shutdown()
        self.timers.close()
        await self.client.close()
        if self._dir_lock is not None:
            self._dir_lock.release()
        log.info("broker %s stopped", self.settings.name)

    # ------------------------------------------------------------------ dispatch
    #: The handlers that also serve runs of requests (``many``), by code; filled with the handlers.
    _batched: Mapping[int, BatchedProcessor] = {}
    #: The store's send lane when the broker may take it (:mod:`tidemq.broker.lanes`).
    send_lane: SendLaneEntry | None = None

    def _collect_processors(self) -> dict[int, Handler]:
        """Every plugin's request handlers (``tidemq_register_processors``), before the server starts.

        Called once per plugin through pluggy's hook caller (hook tracing sees it), registration
        order, built-ins first: a code taken twice names both plugins.
        """
        register = ProcessorRegister(self)
        self.manager.call_per_plugin(
            "tidemq_register_processors", lambda plugin: {"register": register._as(plugin)}
        )
        handlers = register.handlers()
        # A wrapped code's handler is the wrapper: served one request at a time.
        self._batched = {code: h for code, h in handlers.items() if isinstance(h, BatchedProcessor)}
        self.send_lane = send_lane_entry(
            self, [handlers.get(code) for code in sorted(_SEND_CODES)], self.failed
        )
        return handlers

    async def handle(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        """The transport's request handler: one processor per code, errors become responses."""
        response: RemotingCommand | None
        if self.acl is not None:
            refused = self.refused(conn, request)
            if refused is not None:
                return None if request.is_oneway else refused
        lane = self.send_lane
        if lane is not None and request.code in _SEND_CODES:
            try:
                works = lane.serve(conn, [request])
                if works is not None:
                    work = works[0]
                    response = work if type(work) is RemotingCommand else await work  # type: ignore[misc]
                    return None if request.is_oneway else response
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = self.failed(conn, request, exc)
                return None if request.is_oneway else response
        handler = self._handlers.get(request.code)
        if handler is None:
            # Usually a client given the broker's port as its NameServer: say so, once per peer.
            response = self._unsupported.answer(request, conn.remote_address, self._address)
        else:
            try:
                response = await handler(conn, request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = self.failed(conn, request, exc)
        if request.is_oneway:
            return None
        return response

    def handle_many(
        self, conn: Connection, requests: list[RemotingCommand]
    ) -> list[Awaitable[RemotingCommand | None]]:
        """The requests of one read, one awaitable each, in order (the transport awaits them in turn).

        Consecutive requests whose handler is a :class:`~tidemq.transport.BatchedProcessor` (the
        send handler, which coalesces their messages into one store append) reach its ``many``
        together, each past the same access check as :meth:`handle` and answered on failure with the
        same :meth:`failed`; any other request, or a wrapped handler, is served by :meth:`handle`
        alone.  Nothing runs before the first awaitable is awaited, and a run starts when its first
        member is: requests keep the order they came in.
        """
        out: list[Awaitable[RemotingCommand | None]] = []
        batched = self._batched
        run: list[RemotingCommand] = []
        run_processor: BatchedProcessor | None = None
        for request in requests:
            processor = batched.get(request.code)
            if run_processor is not None and processor is run_processor:
                run.append(request)
                continue
            if run_processor is not None:
                self._add_run(conn, run, run_processor, out)
            if processor is not None:
                run, run_processor = [request], processor
            else:
                run, run_processor = [], None
                out.append(self.handle(conn, request))
        if run_processor is not None:
            self._add_run(conn, run, run_processor, out)
        return out

    def _add_run(
        self,
        conn: Connection,
        run: list[RemotingCommand],
        processor: BatchedProcessor,
        out: list[Awaitable[RemotingCommand | None]],
    ) -> None:
        if len(run) == 1:
            out.append(self.handle(conn, run[0]))
        else:
            coalesced = _CoalescedRun(self, conn, run, processor)
            out.extend([coalesced.answer(i) for i in range(len(run))])

    def failed(self, conn: Connection, request: RemotingCommand, exc: Exception) -> RemotingCommand:
        """The answer to a request whose handling raised ``exc``: the one error mapping of the
        broker, for a request served alone and for one of a coalesced run alike."""
        if isinstance(exc, HeaderFieldError | InvalidNameError):
            # A peer's mistake, answered with the reason; not logged per request (a flood of
            # bad names must not become a flood of log lines).
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        if isinstance(exc, TidemqError | ValueError):
            log.warning("%s from %s failed: %s", request_name(request.code), conn.remote_address, exc)
        else:
            log.error("%s from %s failed", request_name(request.code), conn.remote_address, exc_info=exc)
        return request.reply(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")

    def refused(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        """The one access check: the NO_PERMISSION answer when the validator refuses, else None
        (also None when access control is off)."""
        acl = self.acl
        if acl is None:
            return None
        remote = conn.remote_address
        fast = self.acl_lane
        if fast is not None and fast.admits(request.code, request.ext_fields, request.payload(), remote):
            return None
        try:
            acl.validate(request, remote)
            return None
        except AccessDenied as exc:
            reason = exc.reason
        except Exception as exc:  # a validator bug must refuse (fail closed), not let requests in
            log.exception("access validator failed on %s from %s", request_name(request.code), remote)
            reason = f"access check failed: {type(exc).__name__}: {exc}"
        self.acl_refusals += 1
        access_key = (request.ext_fields or {}).get(ACCESS_KEY)
        # Never log the signature or any secret: the access key names the account.
        log.warning(
            "refused %s (code %s) from %s, access key %r: %s",
            request_name(request.code),
            request.code,
            remote,
            access_key,
            reason,
        )
        return request.reply(ResponseCode.NO_PERMISSION, f"no permission: {reason}")

    # ------------------------------------------------------------------ helpers for processors
    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a fire-and-forget coroutine, keeping a reference until it ends."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def notify_consumer_ids_changed(self, group: str) -> None:
        """Tell every consumer of ``group`` to rebalance now (NOTIFY_CONSUMER_IDS_CHANGED, oneway)."""
        cfg = self.groups.get(group)
        if cfg is not None and not cfg.notify_consumer_ids_changed_enable:
            return
        info = self.consumers.get(group)
        if info is None:
            return
        for conn in dict.fromkeys(ch.conn for ch in info.channels.values()):  # a proxy's: once
            if conn.closed:
                continue
            req = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
            req.mark_oneway()
            self.spawn(self._notify(conn, req, group))

    async def _notify(self, conn: Connection, req: RemotingCommand, group: str) -> None:
        try:
            await asyncio.wait_for(conn.invoke_oneway(req), NOTIFY_TIMEOUT_S)
        except Exception as exc:
            log.info("cannot notify %s of a change in group %s: %s", _remote(conn), group, exc)

    def watch_connection(self, conn: Connection) -> None:
        """Drop a client's registrations when its connection closes (once per connection)."""
        state = conn.context
        if state.watched:
            return
        state.watched = True
        conn.add_close_callback(self._connection_closed)

    def _connection_closed(self, conn: Connection) -> None:
        self.producers.connection_closed(conn)
        for group in self.consumers.connection_closed(conn):
            log.info("consumer %s of group %s disconnected", _remote(conn), group)
            if self._running:
                self.notify_consumer_ids_changed(group)

    # ------------------------------------------------------------------ periodic services
    # The periodic loops tick on a grid at a phase of their own (tidemq.tasks.until_tick), not
    # all at the instant the broker started them: their passes stay out of each other's way.
    async def _flush_offsets_loop(self) -> None:
        phase = phase_of("tidemq-offset-flush")
        while True:
            await sleep_until_tick(self.settings.consumer_offset_flush_s, phase)
            try:
                await asyncio.to_thread(self.offsets.persist)
            except Exception:
                log.exception("cannot persist consumer offsets")

    async def _housekeeping_loop(self) -> None:
        timeout = self.settings.consumer_housekeeping_s
        phase = phase_of("tidemq-client-housekeeping")
        while True:
            await sleep_until_tick(min(HOUSEKEEPING_PERIOD_S, timeout), phase)
            self.dedup.expire()  # an idle window's expired records released (issue 37)
            for conn in self.producers.scan_not_active(timeout):
                log.info("producer %s silent for %.0f s, dropped", _remote(conn), timeout)
            changed = set()
            for group, conn in self.consumers.scan_not_active(timeout):
                log.info("consumer %s of group %s silent for %.0f s, dropped", _remote(conn), group, timeout)
                changed.add(group)
            for group in changed:
                self.notify_consumer_ids_changed(group)

    def now_ms(self) -> int:
        return int(time.time() * 1000)


def _remote(conn: Connection) -> str:
    return conn.remote_address


class RequestHandler:
    """What the broker hands its transport, a :class:`~tidemq.transport.BatchedRequestHandler`:
    ``handler(conn, request)`` serves one request, and ``handler.handle_many(conn, requests)`` the
    requests of one read (:meth:`Broker.handle_many`)."""

    __slots__ = ("_handle", "handle_many", "serve_read")

    def __init__(self, broker: Broker) -> None:
        self._handle = broker.handle
        self.handle_many = broker.handle_many
        # A read's send frames served from its bytes (tidemq.transport.ReadLaneHandler), when the lane can.
        # Left unset otherwise: the transport then never offers it a read.
        lane = broker.send_lane
        if lane is not None and lane.reads:
            self.serve_read = lane.serve_read

    def __call__(self, conn: Connection, request: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        return self._handle(conn, request)


class _CoalescedRun:
    """Consecutive requests of one read for one batched processor, started when the first is awaited.

    The broker's access check (:meth:`Broker.refused`) runs per request, then the admitted ones go
    to ``processor.many(conn, requests, failed)`` together, which returns per request its response
    or an awaitable of it; a request whose handling raised is answered by :meth:`Broker.failed`,
    inside ``many`` or here.
    """

    __slots__ = ("_broker", "_conn", "_processor", "_requests", "_works")

    def __init__(
        self, broker: Broker, conn: Connection, requests: list[RemotingCommand], processor: BatchedProcessor
    ):
        self._broker = broker
        self._conn = conn
        self._requests = requests
        self._processor = processor
        self._works: list[RemotingCommand | Awaitable[RemotingCommand | None]] | None = None

    def _start(self) -> list[RemotingCommand | Awaitable[RemotingCommand | None]]:
        broker, conn, requests = self._broker, self._conn, self._requests
        works: list[Any] = [None] * len(requests)
        admitted: list[RemotingCommand] = []
        places: list[int] = []
        check = broker.acl is not None
        for i, request in enumerate(requests):
            if check:
                refused = broker.refused(conn, request)
                if refused is not None:
                    works[i] = refused
                    continue
            admitted.append(request)
            places.append(i)
        if admitted:
            results: list[RemotingCommand | Awaitable[RemotingCommand | None]] | None = None
            lane = broker.send_lane
            try:
                if lane is not None and self._processor is lane.handler:
                    results = lane.serve(conn, admitted)  # None: the handler serves them
                if results is None:
                    results = list(self._processor.many(conn, admitted, self._failed))
                if len(results) != len(admitted):
                    raise RuntimeError(
                        f"{self._processor!r} answered {len(results)} of {len(admitted)} requests"
                    )
            except Exception as exc:  # a bug in the processor: each admitted request is answered with it
                results = [broker.failed(conn, request, exc) for request in admitted]
            for i, work in zip(places, results, strict=True):
                works[i] = work
        return works

    def _failed(self, request: RemotingCommand, exc: Exception) -> RemotingCommand:
        return self._broker.failed(self._conn, request, exc)

    async def answer(self, i: int) -> RemotingCommand | None:
        request = self._requests[i]
        response: RemotingCommand | None
        try:
            works = self._works
            if works is None:
                works = self._works = self._start()
            work = works[i]
            response = work if type(work) is RemotingCommand else await work  # type: ignore[misc]
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = self._broker.failed(self._conn, request, exc)
        return None if request.is_oneway else response


def _persisting(what: str, write: Callable[[], object]) -> None:
    """One of :meth:`Broker.stop`'s table writes: an OSError (a full disk) is logged, and the stop goes on."""
    try:
        write()
    except OSError as exc:
        log.error("cannot write the %s while stopping: %s", what, exc)
