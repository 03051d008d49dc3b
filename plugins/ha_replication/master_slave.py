"""The ``master_slave`` replication: RocketMQ's HAService behind the replication contract.

The broker's ``role`` picks the side: ``ASYNC_MASTER`` / ``SYNC_MASTER`` serve the HA port (broker
port + 1 unless ``listen`` says otherwise); ``SLAVE`` connects to its master's HA port (from
``master_address`` or from the NameServer's registration answer) and copies the commit log.  Under
``SYNC_MASTER`` a send is acknowledged once a slave confirmed its bytes.

Options (``[replication.master_slave]``)::

    listen = ""                   # HA host:port; default broker host, broker port + 1
    master_address = ""           # slave: the master's HA host:port (else learnt from the NameServer)
    master_broker_address = ""    # slave: the master broker's address, for metadata sync
    sync_timeout_s = 3.0          # SYNC_MASTER: FLUSH_SLAVE_TIMEOUT after this
    slave_fall_behind_max = 268435456   # SYNC_MASTER: SLAVE_NOT_AVAILABLE when a slave lags more
    heartbeat_s = 5.0             # slave reports / master heartbeats
    housekeeping_s = 20.0         # a silent peer is dropped after this
    transfer_batch = 32768        # bytes per frame (haTransferBatchSize)
    compression = "none"          # none | lz4 | zstd, negotiated
    digest = true                 # blake3 per batch, negotiated
    extended = true               # false: speak the plain RocketMQ HA protocol (no handshake)
    metadata_sync_s = 10.0        # slave: topic config, offsets, delay offsets
    group_sync_s = 60.0           # slave: subscription groups
    lag_log_s = 30.0              # master: log each slave's lag this often (0: never)
    secret_file = ""              # file holding the HA shared secret (>= 16 bytes, mode 0600); "" = none
    insecure = false              # true: a master's HA port may listen beyond loopback without secret_file

A slave also copies its master's metadata (:class:`~.slave_sync.SlaveSynchronize`): the broker
hands the replication its metadata sink and client through
:meth:`~tidemq.replication.MetadataFollower.follow_metadata`, and :meth:`MasterSlaveReplication.shutdown`
stops the copy.

:class:`MasterSlaveReplication` is public (:mod:`tidemq_ha_replication.api`) and meant to be
subclassed by replications that run the same HA stream with another way of choosing the master
(the ``controller`` plugin).  Its extension points are the public members: the attributes
``options``, ``role``, ``store``, ``server``, ``client``, ``transfer``, ``master_broker_address``,
``metadata`` and ``slave_sync`` (a subclass may swap ``server``/``client``/``transfer`` at run time,
on the broker's loop), :meth:`~MasterSlaveReplication.listen_address`,
:meth:`~MasterSlaveReplication.start_slave_sync` / :meth:`~MasterSlaveReplication.stop_slave_sync`,
and every contract method (``start``, ``wait_for_replicas``, ``ha_address``, ``update_master``,
``runtime_info``, ``follow_metadata``, ``shutdown``), which a subclass may override and extend
through ``super()``.  Members starting with ``_`` are not part of it.
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.address import parse_address, split_address
from tidemq.config import parse_options
from tidemq.errors import ConfigError
from tidemq.futures import StoreFuture
from tidemq.plugins import PluginContext
from tidemq.protected import check_ha_listener
from tidemq.replication import MetadataSink, ReplicaStatus
from tidemq.store import RawCommitLogStore

from .ha_master import GroupTransfer, HAServer
from .ha_slave import HAClient
from .wire import read_secret

if TYPE_CHECKING:
    from tidemq.transport import TransportClient

    from .slave_sync import SlaveSynchronize

log = logging.getLogger(__name__)


def _positive(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 < value < math.inf:  # also refuses nan
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value}")


def _address(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value:  # "" = derived (listen) or learnt from the NameServer (master addresses)
        try:
            parse_address(value, attribute.name, allow_port_zero=attribute.name == "listen")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def _secret_file(inst: Any, attribute: attrs.Attribute, value: str) -> None:
    # Read here too, so `tidemq check-config` reports a bad file; HAServer/HAClient read it at start.
    if value:
        if not inst.extended:
            raise ValueError(
                "secret_file needs extended = true: the plain RocketMQ HA protocol cannot authenticate"
            )
        try:
            read_secret(value, attribute.name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


@attrs.define
class MasterSlaveOptions:
    listen: str = attrs.field(default="", validator=_address)
    master_address: str = attrs.field(default="", validator=_address)
    master_broker_address: str = attrs.field(default="", validator=_address)
    sync_timeout_s: float = attrs.field(default=3.0, validator=_positive)
    slave_fall_behind_max: int = attrs.field(default=256 * 1024 * 1024, validator=_positive)
    heartbeat_s: float = attrs.field(default=5.0, validator=_positive)
    housekeeping_s: float = attrs.field(default=20.0, validator=_positive)
    transfer_batch: int = attrs.field(default=32 * 1024, validator=_positive)
    compression: str = attrs.field(default="none", metadata={"choices": ("none", "lz4", "zstd")})
    digest: bool = True
    extended: bool = True
    metadata_sync_s: float = attrs.field(default=10.0, validator=_positive)
    group_sync_s: float = attrs.field(default=60.0, validator=_positive)
    lag_log_s: float = attrs.field(default=30.0, validator=_positive)
    secret_file: str = attrs.field(default="", validator=_secret_file)
    #: Protected mode (tidemq.protected): a master's HA port beyond loopback without secret_file.
    insecure: bool = False


#: Resolved futures never change: one per status serves every put.
_DONE: dict[ReplicaStatus, Future[ReplicaStatus]] = {s: StoreFuture.completed(s) for s in ReplicaStatus}


def completed(status: ReplicaStatus) -> Future[ReplicaStatus]:
    """A resolved future holding ``status``: one shared per status, for answers known at once."""
    return _DONE[status]


class MasterSlaveReplication:
    """HA master or slave, by the broker's role (a :class:`~tidemq.replication.MasterAware`
    :class:`~tidemq.replication.MetadataFollower` replication); see the module docstring for what
    a subclass may use."""

    def __init__(self, options: MasterSlaveOptions):
        self.options = options
        self.role = "ASYNC_MASTER"
        self.store: Any = None
        self.server: HAServer | None = None
        self.client: HAClient | None = None
        self.transfer: GroupTransfer | None = None
        self.master_broker_address = options.master_broker_address
        self._stop = threading.Event()
        self._lag_thread: threading.Thread | None = None
        #: (the broker's metadata sink, its transport client), from :meth:`follow_metadata`.
        self.metadata: tuple[MetadataSink, TransportClient] | None = None
        #: The running metadata copy while this replica is a slave that follows metadata.
        self.slave_sync: SlaveSynchronize | None = None

    # ------------------------------------------------------------------ contract
    def start(self, store: Any, broker_config: Any) -> None:
        if not isinstance(store, RawCommitLogStore):
            raise ConfigError(
                f"[replication.master_slave] needs a store with raw commit-log access; {type(store).__name__} has none"
            )
        self.store = store
        self.role = str(broker_setting(broker_config, "role", "ASYNC_MASTER"))
        if self.role == "SLAVE" or int(broker_setting(broker_config, "id", 0)) != 0:
            self.role = "SLAVE"
            self.client = HAClient(store, self.options, self.options.master_address)
            self.client.start()
            return
        host, port = self.listen_address(broker_config)
        try:
            self.server = HAServer(store, self.options, host, port, self._on_ack)
        except OSError as exc:
            raise ConfigError(
                f"[replication.master_slave] cannot listen on HA port {host}:{port}: {exc.strerror or exc}"
                ' (set listen = "host:port")'
            ) from exc
        self.server.start()
        if self.role == "SYNC_MASTER":
            self.transfer = GroupTransfer()
        if self.options.lag_log_s > 0:
            self._lag_thread = threading.Thread(target=self._lag_loop, name="tidemq-ha-lag", daemon=True)
            self._lag_thread.start()
        log.info("HA %s listening on %s:%d", self.role, *self.server.address)

    def listen_address(self, broker_config: Any) -> tuple[str, int]:
        """The HA port's (host, port): ``listen``, else the broker's host and port + 1."""
        listen = self.options.listen or str(broker_setting(broker_config, "listen", "127.0.0.1:10911"))
        try:
            host, port = split_address(listen)
        except ValueError as exc:
            raise ConfigError(f"[replication.master_slave] listen = {listen!r} is not host:port") from exc
        if not self.options.listen and port:
            port += 1  # RocketMQ's haListenPort default: the broker port + 1
        return host or "0.0.0.0", port

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        server = self.server
        if server is not None:
            server.notify_data()
        if self.transfer is None or server is None:
            return completed(ReplicaStatus.PUT_OK)
        if server.slave_count == 0:
            return completed(ReplicaStatus.SLAVE_NOT_AVAILABLE)
        if self.store.get_max_phy_offset() - self.transfer.acked > self.options.slave_fall_behind_max:
            return completed(ReplicaStatus.SLAVE_NOT_AVAILABLE)
        return self.transfer.wait(end_offset, self.options.sync_timeout_s)

    def ha_address(self) -> str:
        if self.server is None:
            return ""
        host, port = self.server.address
        if host in ("0.0.0.0", "::", ""):
            from tidemq.message import local_ip

            host = local_ip()
        return f"{host}:{port}"

    def shutdown(self) -> None:
        self._stop.set()
        self.stop_slave_sync()
        if self.client is not None:
            self.client.shutdown()
        if self.server is not None:
            self.server.shutdown()
        if self.transfer is not None:
            self.transfer.shutdown()

    # ------------------------------------------------------------------ slave metadata
    def follow_metadata(self, sink: MetadataSink, client: TransportClient) -> None:
        """:class:`~tidemq.replication.MetadataFollower`: keep ``sink`` and ``client``; a slave
        starts copying its master's metadata now (on the broker's loop)."""
        self.metadata = (sink, client)
        if self.client is not None:  # following a master
            self.start_slave_sync()

    def start_slave_sync(self) -> None:
        """Start copying the master's metadata, once the broker handed its sink (no-op if running)."""
        if self.metadata is None or self.slave_sync is not None:
            return
        from .slave_sync import SlaveSynchronize

        sink, client = self.metadata
        self.slave_sync = SlaveSynchronize(sink, client, self)
        self.slave_sync.start()

    def stop_slave_sync(self) -> None:
        """Stop copying (a promoted replica, or shutdown); safe when not running."""
        sync, self.slave_sync = self.slave_sync, None
        if sync is not None:
            sync.cancel()

    # ------------------------------------------------------------------ HA state
    def _on_ack(self, offset: int) -> None:
        if self.transfer is not None:
            self.transfer.ack(offset)

    def update_master(self, ha_address: str, broker_address: str) -> None:
        """What the NameServer answered a slave's registration: its master's addresses."""
        if self.client is None:
            return
        learnt = False
        if broker_address and not self.options.master_broker_address:
            learnt = broker_address != self.master_broker_address
            self.master_broker_address = broker_address
        if ha_address and not self.options.master_address:
            learnt = learnt or ha_address != self.client.master_address
            self.client.set_master(ha_address)
        if learnt and self.slave_sync is not None:
            self.slave_sync.wake()  # copy from it now, not a metadata_sync_s later

    def runtime_info(self) -> dict[str, str]:
        """HA fields for GET_BROKER_RUNTIME_INFO (lag in bytes: how far the slaves are behind)."""
        info = {"haRole": self.role}
        if self.store is None:
            return info
        end = self.store.get_max_phy_offset()
        if self.server is not None:
            conns = list(self.server.connections)
            acked = max((c.ack_offset for c in conns), default=-1)
            info["haServerAddr"] = self.ha_address()
            info["haConnectedSlaves"] = str(len(conns))
            info["haSlaveAckOffset"] = str(acked)
            info["haSlaveFallBehind"] = str(end - acked if conns else -1)
            info["haSlaves"] = ";".join(f"{c.address}={max(0, end - c.ack_offset)}" for c in conns)
            if self.transfer is not None:
                info["haSyncWaiting"] = str(self.transfer.waiting)
            info["haAuthFailures"] = str(self.server.auth_failures)
        if self.client is not None:
            info["haMasterAddress"] = self.client.master_address
            info["haMasterConnected"] = str(self.client.connected).lower()
            info["haMasterOffset"] = str(self.client.master_offset)
            info["haSlaveFallBehind"] = str(self.client.fall_behind)
            info["haCorruptBatches"] = str(self.client.corrupt_batches)
            info["haCompression"] = self.client.session.codec
            info["haAuthRefusals"] = str(self.client.auth_refusals)
        return info

    def _lag_loop(self) -> None:
        while not self._stop.wait(self.options.lag_log_s):
            server = self.server
            if server is None or not server.connections:
                continue
            end = self.store.get_max_phy_offset()
            for c in list(server.connections):
                log.info(
                    "HA slave %s is %d bytes behind (acked %d of %d)",
                    c.address,
                    end - c.ack_offset,
                    c.ack_offset,
                    end,
                )


def broker_setting(config: Any, key: str, default: Any) -> Any:
    """``key`` of the broker settings :meth:`~tidemq.replication.Replication.start` receives (a
    ``BrokerSettings``, or a plain dict in tests and tools), else ``default``."""
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def check_protected(options: MasterSlaveOptions, settings: Any, table: str, *, always: bool = False) -> None:
    """Protected mode for the HA port a master (or, with ``always``, every replica) listens on."""
    if not settings or not (
        always or (broker_setting(settings, "role", "") != "SLAVE" and not broker_setting(settings, "id", 0))
    ):
        return
    listen = options.listen or str(broker_setting(settings, "listen", "127.0.0.1:10911"))
    check_ha_listener(
        str(broker_setting(settings, "name", "")),
        split_address(listen)[0],
        options.secret_file,
        options.insecure,
        table,
    )


def create(ctx: PluginContext) -> MasterSlaveReplication:
    options = parse_options(MasterSlaveOptions, ctx.options, "[replication.master_slave]")
    check_protected(options, ctx.settings, "[replication.master_slave]")
    return MasterSlaveReplication(options)
