"""Broker and NameServer configuration from TOML, and composition of a broker from plugins.

A broker file looks like::

    [broker]
    name = "broker-a"
    listen = "127.0.0.1:10911"
    namesrv = ["127.0.0.1:9876"]
    data_dir = "/var/lib/tidemq"

    [plugins]            # which plugin serves each role
    store = "mmap"
    flush = "async"

    [store.mmap]         # options of the chosen plugin, checked by the plugin
    commitlog_file_size = 1073741824

Every mistake (an unknown key, a wrong type, a number that is not finite or out of its range, an
address that is not ``HOST:PORT``, an unknown plugin name, a missing role) is a
:class:`~tidemq.errors.ConfigError` whose message is one line naming the key and the valid
choices.  :func:`check_broker` is what both ``tidemq check-config`` and ``tidemq broker`` run before
anything starts.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from tidemq.address import format_address, parse_address
from tidemq.datadir import check_dir_mode
from tidemq.delay import DEFAULT_DELAY_LEVELS, parse_delay_levels
from tidemq.errors import ConfigError, PluginError
from tidemq.names import check_topic_name
from tidemq.plugins import BUILD_ORDER, ROLES, PluginManager, get_plugin_manager
from tidemq.store import DEFAULT_IN_MEMORY_RATIO

if typing.TYPE_CHECKING:
    from tidemq.acl import AccessValidator
    from tidemq.filter import FilterFactory
    from tidemq.flush import FlushPolicy
    from tidemq.index import KeyIndex
    from tidemq.metrics import MetricsExporter
    from tidemq.replication import Replication
    from tidemq.store import MessageStore
    from tidemq.transport import Transport

T = TypeVar("T")

DEFAULT_HOME = Path(os.environ.get("TIDEMQ_HOME", "~/.tidemq")).expanduser()


def _suggest(key: str, valid: list[str]) -> str:
    hint = difflib.get_close_matches(key, valid, n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = typing.get_args(tp)
        return origin is tuple or not args or all(_type_ok(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _takes_float(tp: Any) -> bool:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_takes_float(a) for a in typing.get_args(tp))
    return tp is float


def parse_options(cls: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """Build the attrs class ``cls`` from a TOML table, with one-line errors naming the key.

    Plugins use this for their own ``[role.name]`` tables.  ``where`` names the table in errors
    (``"[store.mmap]"``).  Every float must be finite (TOML has ``nan`` and ``inf``: a ``nan``
    interval kills the loop that sleeps on it); per-field ranges are the fields' validators
    (:func:`number`).
    """
    values = dict(values or {})
    fields = {f.name: f for f in attrs.fields(cls)}  # type: ignore[arg-type]  # cls: an attrs class
    valid = sorted(fields)
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key {key!r}{_suggest(key, valid)}; valid keys: {', '.join(valid)}"
            )
        tp = hints.get(key)
        if tp is not None and not _type_ok(value, tp):
            raise ConfigError(f"{where}: {key} = {value!r} should be of type {_type_name(tp)}")
        if tp is not None and _takes_float(tp) and isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where}: {key} = {value!r} must be a finite number")
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(
                f"{where}: {key} = {value!r} is not valid{_suggest(str(value), list(choices))}; choices: {', '.join(choices)}"
            )
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _type_name(tp: Any) -> str:
    return str(getattr(tp, "__name__", tp)) if typing.get_origin(tp) is None else str(tp)


def _choice(*choices: str) -> dict[str, Any]:
    return {"choices": choices}


# ---------------------------------------------------------------------------- number ranges
#: The longest period a ``*_s`` interval may have: beyond a day a periodic service is off in all but name.
DAY_S = 86_400.0
INT32_MAX = 2**31 - 1


def number(
    default: float,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Any:
    """An attrs field whose value must be a finite number within the given bounds.

    The bounds are also kept in the field's metadata (``"range"``), for documentation and listings.
    """

    def show(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:g}"

    parts = [f"> {show(gt)}" if gt is not None else "", f">= {show(ge)}" if ge is not None else ""]
    parts.append(f"<= {show(le)}" if le is not None else "")
    text = " and ".join(p for p in parts if p)

    def check(_inst: object, attribute: attrs.Attribute, value: float) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{attribute.name} = {value!r} must be a finite number {text}")
        if (
            (gt is not None and not value > gt)
            or (ge is not None and not value >= ge)
            or (le is not None and not value <= le)
        ):
            raise ValueError(f"{attribute.name} = {value!r} must be {text}")

    return attrs.field(default=default, validator=check, metadata={**(metadata or {}), "range": text})


def interval(default: float) -> Any:
    """A period or timeout in seconds: more than 0, at most a day."""
    return number(default, gt=0, le=DAY_S)


# ---------------------------------------------------------------------------- addresses
# parse_address and format_address live in tidemq.address; importable from here as before.


def _listen_address(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    try:
        parse_address(value, attribute.name, allow_port_zero=True)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


def _reachable_address(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    if value:  # "" = not set
        try:
            parse_address(value, attribute.name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def _reachable_addresses(_inst: object, attribute: attrs.Attribute, value: list[str]) -> None:
    for address in value:
        try:
            parse_address(address, attribute.name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


def _delay_levels(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    try:
        parse_delay_levels(value)
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("[broker] ")) from None


def _file_name(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    # The broker name is also the default data directory's name.
    if not value or value.strip() != value or any(c in value for c in "/\\\0"):
        raise ValueError(
            f"{attribute.name} = {value!r} must be a non-empty name without '/' or spaces around it"
        )


def _topic_name(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    problem = check_topic_name(value)
    if problem:
        raise ValueError(f"{attribute.name} = {value!r}: {problem}")


@attrs.define
class BrokerSettings:
    """The ``[broker]`` table (names follow RocketMQ's BrokerConfig in snake case)."""

    cluster: str = "DefaultCluster"
    name: str = attrs.field(default="broker-a", validator=_file_name)
    id: int = number(0, ge=0)  # 0 = master, > 0 = slave
    #: HOST:PORT to listen on (port 0: any free port).
    listen: str = attrs.field(default="127.0.0.1:10911", validator=_listen_address)
    #: HOST:PORT registered with NameServers (what clients connect to); defaults to `listen`, and a
    #: wildcard `listen` (0.0.0.0, ::) registers this machine's routable address (see registered_address).
    advertise: str = attrs.field(default="", validator=_reachable_address)
    namesrv: list[str] = attrs.field(factory=lambda: ["127.0.0.1:9876"], validator=_reachable_addresses)
    data_dir: str = ""  # defaults to ~/.tidemq/<name>
    #: Mode a new data directory gets (a wider existing one is warned about); files get no more (0600).
    data_dir_mode: int = attrs.field(default=0o700, validator=lambda _i, _a, v: check_dir_mode(v))
    role: str = attrs.field(default="ASYNC_MASTER", metadata=_choice("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"))
    auto_create_topic: bool = True
    default_topic_queues: int = number(4, ge=1, le=1024)
    default_perm: int = number(6, ge=0, le=7)  # PermName bits: 4 read, 2 write, 1 inherit
    max_message_size: int = number(4 * 1024 * 1024, ge=1, le=INT32_MAX)
    register_interval_s: float = interval(30.0)
    long_polling: bool = True
    short_polling_ms: int = number(1000, ge=1, le=DAY_S * 1000)
    max_reconsume_times: int = number(16, ge=0, le=INT32_MAX)
    delay_levels: str = attrs.field(default=DEFAULT_DELAY_LEVELS, validator=_delay_levels)
    consumer_housekeeping_s: float = interval(120.0)
    max_frame_size: int = number(16 * 1024 * 1024, ge=1024, le=INT32_MAX)
    slave_read_enable: bool = False
    # accessMessageInMemoryMaxRatio: % of the machine's memory the newest records count as in (the
    # page cache); a pull further behind is told to read from a slave, a new group's first
    # QUERY_CONSUMER_OFFSET on such a backlog starts at the end.
    access_message_in_memory_max_ratio: int = number(DEFAULT_IN_MEMORY_RATIO, ge=0, le=100)
    auto_create_subscription_group: bool = True
    consumer_offset_flush_s: float = interval(5.0)  # how often committed consumer offsets are written
    # Transactional messages (issue 10): transactionCheckInterval / transactionTimeOut / transactionCheckMax.
    transaction_check_interval_s: float = interval(60.0)  # how often unresolved half messages are checked
    transaction_timeout_s: float = number(6.0, ge=0, le=DAY_S)  # younger half messages are not checked yet
    transaction_check_max: int = number(15, ge=1, le=INT32_MAX)  # checks before a half message is discarded
    enable_property_filter: bool = True  # enablePropertyFilter: refuse SQL92 (non-TAG) subscriptions when off
    # Long polling: a pull asking to be held longer is held this long (clients ask 15-20 s).
    max_suspend_ms: int = number(30_000, ge=0, le=DAY_S * 1000)
    # Held pulls one connection may have; more are answered SYSTEM_BUSY (the client backs off).
    max_held_pulls_per_connection: int = number(1024, ge=1, le=1 << 20)
    # Messages in one SEND_BATCH_MESSAGE: decoding 100 000 tiny ones held the event loop ~1 s.
    max_batch_messages: int = number(4096, ge=1, le=1 << 20)
    # The cluster-name and broker-name topics are readable and writable (mqadmin clusterRT, sendMsgStatus).
    cluster_topic_enable: bool = True
    broker_topic_enable: bool = True
    # Message trace (RocketMQ 4.4+): the broker creates the trace topic (1 queue) at start.
    trace_topic_enable: bool = False
    msg_trace_topic_name: str = attrs.field(default="RMQ_SYS_TRACE_TOPIC", validator=_topic_name)
    # Request-reply (RocketMQ 4.6+): a reply is also stored in its topic, besides being pushed.
    store_reply_message_enable: bool = True
    #: Protected mode (tidemq.protected): listen beyond loopback without an ACL (RocketMQ's open broker).
    insecure: bool = False
    #: The account this broker signs its own requests with (RocketMQ's ACL signature): registrations
    #: with NameServers that check them, a slave's metadata copies from an ACL master; "" = unsigned.
    access_key: str = ""
    #: File holding that account's secret key (mode 0600); needed with access_key.
    secret_key_file: str = ""
    # Timer messages (RocketMQ 5's TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS; tidemq.broker.timer).
    timer_wheel_enable: bool = True
    timer_max_delay_sec: int = number(3 * 86_400, ge=1, le=400 * 86_400)
    timer_precision_ms: int = number(1000, ge=10, le=60_000)
    timer_flush_interval_ms: int = number(1000, ge=10, le=3_600_000)
    timer_roll_window_slots: int = number(2 * 86_400, ge=0, le=1 << 25)
    # The duplicate window on UNIQ_KEY (issue 37; tidemq.broker.dedup): a resend is answered, not stored.
    dedup_window_s: float = number(120.0, ge=0, le=DAY_S)
    dedup_key: str = attrs.field(default="uniq_key", metadata=_choice("uniq_key", "content"))
    dedup_max_entries: int = number(500_000, ge=1, le=1 << 30)
    dedup_max_bytes: int = number(128 * 1024 * 1024, ge=4096, le=1 << 40)

    @property
    def host(self) -> str:
        return parse_address(self.listen, "listen", allow_port_zero=True)[0]

    @property
    def port(self) -> int:
        return parse_address(self.listen, "listen", allow_port_zero=True)[1]

    @property
    def address(self) -> str:
        return self.advertise or self.listen

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else DEFAULT_HOME / self.name


@attrs.define
class NamesrvSettings:
    """The ``[namesrv]`` table."""

    listen: str = attrs.field(default="127.0.0.1:9876", validator=_listen_address)
    #: A broker silent this long is dropped from the routes (also settable over the wire).
    broker_expire_s: float = interval(120.0)
    #: How often silent brokers are looked for (also settable over the wire).
    scan_interval_s: float = interval(10.0)
    data_dir: str = ""
    max_frame_size: int = number(16 * 1024 * 1024, ge=1024, le=INT32_MAX)
    #: plain_acl.yml-style accounts (mode 0600); writes need a signature of an `admin: true` one.
    credentials_file: str = ""
    #: Protected mode (tidemq.protected): listen beyond loopback without credentials_file.
    insecure: bool = False

    @property
    def host(self) -> str:
        return parse_address(self.listen, "listen", allow_port_zero=True)[0]

    @property
    def port(self) -> int:
        return parse_address(self.listen, "listen", allow_port_zero=True)[1]


#: What a broker runs when the config names no plugin for a role.
DEFAULT_PLUGINS: dict[str, str] = {
    "transport": "tcp",
    "store": "mmap",
    "flush": "async",
    "index": "hash",
    "replication": "none",
    "allocate": "averagely",
    "select": "latency_fault",
}
#: Roles a broker must have one plugin for (filters are all active at once; allocate/select are client roles).
BROKER_ROLES: tuple[str, ...] = BUILD_ORDER
#: Roles a broker may have a plugin for (``[plugins] acl = "plain"``, ``metrics = "prometheus"``).
OPTIONAL_ROLES: tuple[str, ...] = ("acl", "metrics")


@attrs.define
class Config:
    """A parsed configuration file."""

    broker: BrokerSettings = attrs.field(factory=BrokerSettings)
    namesrv: NamesrvSettings = attrs.field(factory=NamesrvSettings)
    plugins: dict[str, str] = attrs.field(factory=lambda: dict(DEFAULT_PLUGINS))
    #: role -> plugin name -> options table
    options: dict[str, dict[str, dict[str, Any]]] = attrs.field(factory=dict)
    source: str = "<defaults>"

    def plugin_options(self, role: str) -> dict[str, Any]:
        return dict(self.options.get(role, {}).get(self.plugins[role], {}))


_TOP_LEVEL = ["broker", "namesrv", "plugins", *ROLES]


def parse_config(
    data: Mapping[str, Any], source: str = "<config>", manager: PluginManager | None = None
) -> Config:
    """Validate a parsed TOML document; plugin names are checked against ``manager``."""
    for key in data:
        if key not in _TOP_LEVEL:
            raise ConfigError(
                f"{source}: unknown table [{key}]{_suggest(key, _TOP_LEVEL)}; valid tables: {', '.join(_TOP_LEVEL)}"
            )
    for key in ("broker", "namesrv", "plugins"):
        if key in data and not isinstance(data[key], dict):
            raise ConfigError(f"{source}: {key} must be a table ([{key}])")
    broker = parse_options(BrokerSettings, data.get("broker"), f"{source}: [broker]")
    namesrv = parse_options(NamesrvSettings, data.get("namesrv"), f"{source}: [namesrv]")
    plugins = dict(DEFAULT_PLUGINS)
    for role, name in dict(data.get("plugins", {})).items():
        if role not in ROLES or role == "filter":
            valid = [r for r in ROLES if r != "filter"]
            raise ConfigError(
                f"{source}: [plugins] unknown role {role!r}{_suggest(role, valid)}; roles: {', '.join(valid)}"
            )
        if not isinstance(name, str):
            raise ConfigError(f"{source}: [plugins] {role} must be a plugin name string, got {name!r}")
        plugins[role] = name
    options: dict[str, dict[str, dict[str, Any]]] = {}
    for role in ROLES:
        table = data.get(role)
        if table is None:
            continue
        if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
            raise ConfigError(
                f"{source}: [{role}] must only hold tables named after plugins, like [{role}.<name>]"
            )
        options[role] = {name: dict(opts) for name, opts in table.items()}
    cfg = Config(broker=broker, namesrv=namesrv, plugins=plugins, options=options, source=source)
    if manager is not None:
        check_plugins(cfg, manager)
    return cfg


def check_plugins(cfg: Config, manager: PluginManager) -> None:
    """Fail with one line when a role names a plugin that is not installed."""
    for role, name in cfg.plugins.items():
        try:
            manager.lookup(role, name, key=f"[plugins] {role}")
        except PluginError as exc:
            raise ConfigError(f"{cfg.source}: {exc}") from exc
    for role, tables in cfg.options.items():
        installed = manager.available(role)
        for name in tables:
            if name not in installed:
                raise ConfigError(
                    f"{cfg.source}: [{role}.{name}] configures a plugin that is not installed"
                    f"{_suggest(name, list(installed))}; installed {role} plugins: {', '.join(sorted(installed)) or 'none'}"
                )


def load_config(path: str | os.PathLike[str] | None, manager: PluginManager | None = None) -> Config:
    """Read and validate a TOML file (defaults when ``path`` is None)."""
    manager = manager or get_plugin_manager()
    if path is None:
        cfg = Config()
        check_plugins(cfg, manager)
        return cfg
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {p} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    return parse_config(data, str(p), manager)


@attrs.define
class Components:
    """The plugin instances a broker is made of, by role.

    ``instances`` is what factories see as ``ctx.components``; the typed properties are how the
    composition root reads them (each instance was checked against its role's contract when built).
    """

    config: Config
    instances: dict[str, Any]
    manager: PluginManager

    def __getitem__(self, role: str) -> Any:
        return self.instances[role]

    @property
    def transport(self) -> Transport:
        return typing.cast("Transport", self.instances["transport"])

    @property
    def flush(self) -> FlushPolicy:
        return typing.cast("FlushPolicy", self.instances["flush"])

    @property
    def index(self) -> KeyIndex | None:
        return typing.cast("KeyIndex | None", self.instances.get("index"))

    @property
    def store(self) -> MessageStore:
        return typing.cast("MessageStore", self.instances["store"])

    @property
    def replication(self) -> Replication:
        return typing.cast("Replication", self.instances["replication"])

    @property
    def metrics(self) -> MetricsExporter | None:
        """None when ``[plugins] metrics`` is unset or "none": no metrics endpoint."""
        return typing.cast("MetricsExporter | None", self.instances.get("metrics"))

    @property
    def acl(self) -> AccessValidator | None:
        """None when ``[plugins] acl`` is unset or "none": the broker then checks nothing."""
        return typing.cast("AccessValidator | None", self.instances.get("acl"))


def compose(cfg: Config, manager: PluginManager | None = None) -> Components:
    """Build the broker's roles in :data:`tidemq.plugins.BUILD_ORDER` from ``cfg``."""
    manager = manager or get_plugin_manager()
    check_plugins(cfg, manager)
    built: dict[str, Any] = {}
    data_dir = cfg.broker.store_path
    settings = attrs.asdict(cfg.broker)
    for role in BROKER_ROLES:
        name = cfg.plugins[role]
        try:
            built[role] = manager.create(
                role,
                name,
                options=cfg.plugin_options(role),
                data_dir=data_dir,
                components=built,
                settings=settings,
            )
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: {exc}") from exc
    # Access control (role ``acl``) and the metrics endpoint (role ``metrics``) are optional:
    # without their [plugins] key (or with "none") a broker never depends on such a plugin.
    for optional in OPTIONAL_ROLES:
        name = cfg.plugins.get(optional, "none")
        if name == "none":
            continue
        try:
            built[optional] = manager.create(
                optional,
                name,
                options=cfg.plugin_options(optional),
                data_dir=data_dir,
                components=built,
                settings=settings,
            )
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: {exc}") from exc
    return Components(config=cfg, instances=built, manager=manager)


# ---------------------------------------------------------------------------- before starting
def build_filters(cfg: Config, manager: PluginManager, instances: dict[str, Any]) -> dict[str, FilterFactory]:
    """Every registered filter type (role ``filter``: all live at once), built against ``instances``.

    Called by the broker's composition root (:mod:`tidemq.broker.composition`), which attaches
    their dispatchers to the store, and by :func:`check_broker`.  Options come from
    ``[filter.<TYPE>]``; a bad one is a :class:`ConfigError` naming the file.
    """
    settings = attrs.asdict(cfg.broker)
    filters: dict[str, FilterFactory] = {}
    for name in manager.available("filter"):
        try:
            filters[name] = manager.create(
                "filter",
                name,
                options=cfg.options.get("filter", {}).get(name),
                data_dir=cfg.broker.store_path,
                components=instances,
                settings=settings,
            )
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: {exc}") from exc
    return filters


_WILDCARDS = ("0.0.0.0", "::", "")


def registered_address(
    settings: BrokerSettings, host: str, port: int, local_ip: Callable[[], str] | None = None
) -> str:
    """The address a broker listening on ``host:port`` registers with NameServers.

    ``advertise`` when set; otherwise the listen address, where a wildcard host (0.0.0.0, ::)
    becomes this machine's routable address: a NameServer handing out 0.0.0.0 or 127.0.0.1 sends
    every remote client to itself.  With no routable address to pick the broker must be told.
    ``local_ip`` finds this machine's address (:func:`tidemq.message.local_ip`).
    """
    if settings.advertise:
        return settings.advertise
    if host in _WILDCARDS:
        if local_ip is None:
            from tidemq.message import local_ip as find_local_ip
        else:
            find_local_ip = local_ip
        ip = find_local_ip()
        if ipaddress.ip_address(ip).is_loopback:
            raise ConfigError(
                f"[broker] listen = {settings.listen!r} listens on every interface but this machine has no "
                f'routable address to register with NameServers: set [broker] advertise = "HOST:PORT" '
                "(the address clients connect to)"
            )
        host = ip
    return format_address(host, port)


def _refuse(conn: Any, request: Any) -> Any:  # the handler of a server that is never started
    raise RuntimeError("not serving")


def check_broker(cfg: Config, manager: PluginManager | None = None) -> Components:
    """Everything ``tidemq broker`` checks before it starts, without starting anything.

    ``tidemq check-config`` runs this and ``tidemq broker`` builds its broker from the result, so the
    two accept the same files.  Beyond :func:`parse_config`: every plugin's own options (the
    factories parse them; they create no file, directory, thread or buffer: stores and indexes do
    that in ``load``/``start``), the ACL file (read by the ``plain`` validator's factory), the
    filters' options, the listening server as the broker makes it (TLS files are loaded then; it is
    not bound) and the address the broker would register.
    """
    manager = manager or get_plugin_manager()
    components = compose(cfg, manager)
    # The broker builds these when it is composed; made here against the other plugins minus the
    # store, so no throwaway filter attaches itself to anything.
    spare = {role: inst for role, inst in components.instances.items() if role != "store"}
    build_filters(cfg, manager, spare)
    try:
        components["transport"].server(
            cfg.broker.host, cfg.broker.port, _refuse, max_frame_size=cfg.broker.max_frame_size
        )
        from tidemq.protected import check_broker_settings  # protected mode, the broker's own account

        check_broker_settings(cfg.broker, components.acl)
        registered_address(cfg.broker, cfg.broker.host, cfg.broker.port)
    except ConfigError as exc:
        raise ConfigError(f"{cfg.source}: {exc}") from exc
    return components
