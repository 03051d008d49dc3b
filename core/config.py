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

Every mistake (an unknown key, a wrong type, an unknown plugin name, a missing role) is a
:class:`~tidemq.errors.ConfigError` whose message is one line naming the key and the valid
choices.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from tidemq.delay import DEFAULT_DELAY_LEVELS
from tidemq.errors import ConfigError, PluginError
from tidemq.plugins import BUILD_ORDER, ROLES, PluginManager, get_plugin_manager

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
        return isinstance(value, list | tuple)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def parse_options(cls: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """Build the attrs class ``cls`` from a TOML table, with one-line errors naming the key.

    Plugins use this for their own ``[role.name]`` tables.  ``where`` names the table in errors
    (``"[store.mmap]"``).
    """
    values = dict(values or {})
    fields = {f.name: f for f in attrs.fields(cls)}
    valid = sorted(fields)
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key {key!r}{_suggest(key, valid)}; valid keys: {', '.join(valid)}"
            )
        tp = hints.get(key)
        if tp is not None and not _type_ok(value, tp):
            raise ConfigError(f"{where}: {key} = {value!r} should be of type {getattr(tp, '__name__', tp)}")
        choices = fields[key].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(
                f"{where}: {key} = {value!r} is not valid{_suggest(str(value), list(choices))}; choices: {', '.join(choices)}"
            )
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def _choice(*choices: str) -> dict[str, Any]:
    return {"choices": choices}


@attrs.define
class BrokerSettings:
    """The ``[broker]`` table (names follow RocketMQ's BrokerConfig in snake case)."""

    cluster: str = "DefaultCluster"
    name: str = "broker-a"
    id: int = 0  # 0 = master, > 0 = slave
    listen: str = "127.0.0.1:10911"
    advertise: str = ""  # address registered with NameServers; defaults to `listen`
    namesrv: list[str] = attrs.field(factory=lambda: ["127.0.0.1:9876"])
    data_dir: str = ""  # defaults to ~/.tidemq/<name>
    role: str = attrs.field(default="ASYNC_MASTER", metadata=_choice("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"))
    auto_create_topic: bool = True
    default_topic_queues: int = 4
    default_perm: int = 6
    max_message_size: int = 4 * 1024 * 1024
    register_interval_s: float = 30.0
    long_polling: bool = True
    short_polling_ms: int = 1000
    max_reconsume_times: int = 16
    delay_levels: str = DEFAULT_DELAY_LEVELS
    consumer_housekeeping_s: float = 120.0
    max_frame_size: int = 16 * 1024 * 1024
    slave_read_enable: bool = False
    auto_create_subscription_group: bool = True
    consumer_offset_flush_s: float = 5.0  # how often committed consumer offsets are written
    # Transactional messages (issue 10): transactionCheckInterval / transactionTimeOut / transactionCheckMax.
    transaction_check_interval_s: float = 60.0  # how often unresolved half messages are checked
    transaction_timeout_s: float = 6.0  # a half message younger than this is not checked yet
    transaction_check_max: int = 15  # checks before an unresolved half message is discarded
    enable_property_filter: bool = True  # enablePropertyFilter: refuse SQL92 (non-TAG) subscriptions when off

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        return self.advertise or self.listen

    @property
    def store_path(self) -> Path:
        return Path(self.data_dir).expanduser() if self.data_dir else DEFAULT_HOME / self.name


@attrs.define
class NamesrvSettings:
    """The ``[namesrv]`` table."""

    listen: str = "127.0.0.1:9876"
    broker_expire_s: float = 120.0
    scan_interval_s: float = 10.0
    data_dir: str = ""
    max_frame_size: int = 16 * 1024 * 1024

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])


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
    """The plugin instances a broker is made of, by role."""

    config: Config
    instances: dict[str, Any]
    manager: PluginManager

    def __getitem__(self, role: str) -> Any:
        return self.instances[role]


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
    # Access control (role ``acl``) is optional: without ``[plugins] acl`` (or with "none") the
    # broker checks nothing, so a broker never depends on an ACL plugin being installed.
    acl = cfg.plugins.get("acl", "none")
    if acl != "none":
        try:
            built["acl"] = manager.create(
                "acl",
                acl,
                options=cfg.plugin_options("acl"),
                data_dir=data_dir,
                components=built,
                settings=settings,
            )
        except ConfigError as exc:
            raise ConfigError(f"{cfg.source}: {exc}") from exc
    return Components(config=cfg, instances=built, manager=manager)
