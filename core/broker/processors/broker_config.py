"""Broker configuration at run time: GET_BROKER_CONFIG (26) and UPDATE_BROKER_CONFIG (25).

RocketMQ answers GET_BROKER_CONFIG with its BrokerConfig, NettyServerConfig and
MessageStoreConfig as Java properties text (``key=value`` lines) and the configuration's
DataVersion JSON in the ``version`` header field.  tidemq lists its ``[broker]`` options under
RocketMQ's names, plus the keys RocketMQ tools read (mqadmin ``exportConfigs`` reads sixteen of
them and fails on a missing one).

UPDATE_BROKER_CONFIG changes the options the broker reads at use time (:data:`LIVE`), applies them
at once and writes them to ``<data_dir>/config/broker.runtime.properties``, which the broker reads
again at start, over its TOML file.  Deviation from RocketMQ, which silently ignores keys it cannot
apply: every other key is refused by name and nothing of that request is applied.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.broker.services.readable import apply_memory_window
from tidemq.jsonfile import atomic_write_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import DataVersion, dumps
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.services import BrokerServices

log = logging.getLogger(__name__)

#: Where values changed over the wire are kept (relative to the data directory).
RUNTIME_FILE = Path("config") / "broker.runtime.properties"


@attrs.frozen
class Key:
    """One RocketMQ key mapped on a ``[broker]`` option; ``scale`` turns tidemq's seconds into ms."""

    name: str
    attr: str
    scale: int = 1


#: Keys UPDATE_BROKER_CONFIG may change: the broker reads these options at use time.
LIVE: dict[str, Key] = {
    k.name: k
    for k in (
        Key("longPollingEnable", "long_polling"),
        Key("shortPollingTimeMills", "short_polling_ms"),
        Key("slaveReadEnable", "slave_read_enable"),
        Key("accessMessageInMemoryMaxRatio", "access_message_in_memory_max_ratio"),
        Key("enablePropertyFilter", "enable_property_filter"),
        Key("autoCreateTopicEnable", "auto_create_topic"),
        Key("autoCreateSubscriptionGroup", "auto_create_subscription_group"),
        Key("clusterTopicEnable", "cluster_topic_enable"),
        Key("brokerTopicEnable", "broker_topic_enable"),
        Key("flushConsumerOffsetInterval", "consumer_offset_flush_s", 1000),
    )
}
#: ``[broker]`` options reported but read only at start (a restart applies a change).
AT_START: dict[str, Key] = {
    k.name: k
    for k in (
        Key("brokerClusterName", "cluster"),
        Key("brokerName", "name"),
        Key("brokerId", "id"),
        Key("brokerRole", "role"),
        Key("namesrvAddr", "namesrv"),
        Key("storePathRootDir", "data_dir"),
        Key("defaultTopicQueueNums", "default_topic_queues"),
        Key("maxMessageSize", "max_message_size"),
        Key("messageDelayLevel", "delay_levels"),
        Key("registerNameServerPeriod", "register_interval_s", 1000),
        Key("channelExpiredTimeout", "consumer_housekeeping_s", 1000),
        Key("transactionCheckInterval", "transaction_check_interval_s", 1000),
        Key("transactionTimeOut", "transaction_timeout_s", 1000),
        Key("transactionCheckMax", "transaction_check_max"),
        Key("traceTopicEnable", "trace_topic_enable"),
        Key("msgTraceTopicName", "msg_trace_topic_name"),
        Key("storeReplyMessageEnable", "store_reply_message_enable"),
    )
}


def java_value(value: Any) -> str:
    """A value as Java's ``String.valueOf`` writes it in a properties file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # RocketMQ's options are ints: 72, not 72.0
    return str(value)


def _java(key: Key, value: Any) -> str:
    return str(round(value * key.scale)) if key.scale != 1 else java_value(value)


def parse_properties(text: str) -> dict[str, str]:
    """Java properties text (``key=value``, ``key: value``, ``#``/``!`` comments) as a dict."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            key, value = line, ""
        else:
            key, value = line[:cut].strip(), line[cut + 1 :].strip()
        out[key] = value
    return out


def format_properties(props: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in sorted(props.items()))


def _typed(key: Key, text: str, current: Any) -> Any:
    """``text`` as the option's type; ValueError naming the key when it is not one."""
    if isinstance(current, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"{key.name}={text!r}: expected true or false")
        return text.lower() == "true"
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"{key.name}={text!r}: expected an integer") from None
    if key.scale != 1:
        return number / key.scale
    return number


class RuntimeConfig:
    """The broker's configuration as RocketMQ tools see it, and its changes at run time."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker
        self.path = broker.data_dir / RUNTIME_FILE
        self.data_version = DataVersion()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ at start
    def load(self) -> None:
        """Apply the values an operator changed before the last stop (they beat the TOML file)."""
        try:
            text = self.path.read_text("utf-8")
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as exc:
            log.error("%s: cannot read (%s); run-time config changes are not applied", self.path, exc)
            return
        for name, value in parse_properties(text).items():
            try:
                self._apply({name: value})
            except ValueError as exc:  # a key a later version no longer takes: keep starting
                log.error("%s: %s: ignored", self.path, exc)
                continue
            log.warning(
                "%s: %s=%s (set by UPDATE_BROKER_CONFIG, overrides the config file)", self.path, name, value
            )

    def system_topics(self) -> None:
        s = self.broker.settings
        self.broker.topics.add_system_topics(
            s.cluster,
            s.name,
            cluster_topic_enable=s.cluster_topic_enable,
            broker_topic_enable=s.broker_topic_enable,
            trace_topic=s.msg_trace_topic_name if s.trace_topic_enable else "",
        )

    # ------------------------------------------------------------------ the properties
    def properties(self) -> dict[str, str]:
        """Every key the broker reports, RocketMQ's names, Java's value text."""
        s = self.broker.settings
        out = {k.name: _java(k, getattr(s, k.attr)) for k in (*LIVE.values(), *AT_START.values())}
        out["storePathRootDir"] = str(s.store_path)
        host, port = self.broker.address.rsplit(":", 1)  # the bound address (listen may say port 0)
        out["brokerIP1"] = host.strip("[]")
        out["listenPort"] = port
        # Controller mode elects the role: report the one in force, not the configured start.
        out["brokerId"] = str(self.broker.broker_id)
        out["brokerRole"] = self.broker.role
        out.update(self._plugin_keys())
        return out

    def _plugin_keys(self) -> dict[str, str]:
        """Keys of the store, flush and transport plugins, and the ones RocketMQ tools expect."""
        config = getattr(self.broker, "config", None)
        plugins: dict[str, str] = dict(getattr(config, "plugins", {}) or {})
        options: dict[str, dict[str, Any]] = {}
        if config is not None:
            for role in ("store", "transport", "flush"):
                try:
                    options[role] = config.plugin_options(role)
                except KeyError:
                    options[role] = {}
        store = options.get("store", {})
        out = {
            # exportConfigs copies these; tidemq has no filter servers started by the broker and no trace.
            "filterServerNums": "0",
            "msgTraceTopicName": "RMQ_SYS_TRACE_TOPIC",
            "traceOn": "true",
            "traceTopicEnable": "false",
            "useTLS": java_value(bool(options.get("transport", {}).get("tls", False))),
            "flushDiskType": "SYNC_FLUSH" if plugins.get("flush") == "sync" else "ASYNC_FLUSH",
            "fileReservedTime": java_value(store.get("file_reserved_hours", 72)),
            "deleteWhen": str(store.get("delete_when", "04")),
        }
        store_attrs = {
            "mappedFileSizeCommitLog": "commitlog_file_size",
            "diskMaxUsedSpaceRatio": "disk_max_used_space_ratio",
        }
        for name, attr in store_attrs.items():
            if attr in store:
                out[name] = java_value(store[attr])
        return out

    # ------------------------------------------------------------------ changes
    def update(self, props: dict[str, str]) -> None:
        """Apply ``props`` (all or nothing; on the event loop); ValueError names what is refused."""
        self._apply(props)
        self.data_version = self.data_version.next_version()

    def save(self, names: list[str]) -> None:
        """Add the current values of ``names`` to the run-time file (blocking: not on the loop)."""
        s = self.broker.settings
        with self._lock:
            saved = parse_properties(self.path.read_text("utf-8")) if self.path.exists() else {}
            saved.update({n: _java(LIVE[n], getattr(s, LIVE[n].attr)) for n in names})
            atomic_write_bytes(self.path, format_properties(saved).encode())

    def _apply(self, props: dict[str, str]) -> None:
        s = self.broker.settings
        refused = [n for n in props if n not in LIVE]
        if refused:
            name = refused[0]
            if name in AT_START or name in self.properties():
                raise ValueError(
                    f"{name} cannot be changed at run time (set it in the broker's config file and restart); "
                    f"changeable: {', '.join(sorted(LIVE))}"
                )
            raise ValueError(f"unknown broker config key {name!r}; changeable: {', '.join(sorted(LIVE))}")
        wanted = {LIVE[n].attr: _typed(LIVE[n], v, getattr(s, LIVE[n].attr)) for n, v in props.items()}
        # attrs runs the option's validators: check them all on a copy before touching the broker.
        try:
            attrs.evolve(s, **wanted)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"refused: {exc}") from None
        before = {a: getattr(s, a) for a in wanted}
        for attr, value in wanted.items():
            setattr(s, attr, value)
        self._follow(before)

    def _follow(self, before: dict[str, Any]) -> None:
        """Tell the parts that copied an option at start about its new value."""
        b, s = self.broker, self.broker.settings
        if "auto_create_subscription_group" in before:
            b.groups.auto_create = s.auto_create_subscription_group
        if "auto_create_topic" in before:
            b.topics.set_auto_create_topic(s.auto_create_topic)
        if "cluster_topic_enable" in before or "broker_topic_enable" in before:
            self.system_topics()
        if "access_message_in_memory_max_ratio" in before:
            apply_memory_window(b)


class BrokerConfigProcessor:
    def __init__(self, broker: BrokerContext, runtime: RuntimeConfig) -> None:
        self.broker = broker
        self.runtime = runtime

    async def get_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        body = format_properties(self.runtime.properties()).encode()
        version = dumps(self.runtime.data_version.to_dict()).decode()
        return request.reply(ResponseCode.SUCCESS, None, {"version": version}, body=body)

    async def update_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        if not request.body:
            return request.reply(ResponseCode.SUCCESS)  # RocketMQ: no body, nothing to change
        try:
            props = parse_properties(bytes(request.body).decode("utf-8"))
        except UnicodeDecodeError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, f"string2Properties error: {exc}")
        log.info("UPDATE_BROKER_CONFIG from %s: %s", conn.remote_address, props)
        try:
            self.runtime.update(props)
        except ValueError as exc:
            return request.reply(ResponseCode.SYSTEM_ERROR, str(exc))
        try:
            await asyncio.to_thread(self.runtime.save, list(props))
        except OSError as exc:
            log.error("cannot write %s: %s", self.runtime.path, exc)
            return request.reply(
                ResponseCode.SYSTEM_ERROR,
                f"applied, but not saved to {self.runtime.path} (lost at restart): {exc}",
            )
        b = self.broker
        if "autoCreateTopicEnable" in props or {"clusterTopicEnable", "brokerTopicEnable"} & props.keys():
            await b.registrar.register_all()  # the NameServers' routes follow the topic table
        return request.reply(ResponseCode.SUCCESS)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    """Add this module's handlers; before the server starts, apply persisted changes and the system topics."""
    broker = register.context
    runtime = RuntimeConfig(broker)
    runtime.load()
    runtime.system_topics()
    p = BrokerConfigProcessor(broker, runtime)
    register.add(RequestCode.GET_BROKER_CONFIG, p.get_config)
    register.add(RequestCode.UPDATE_BROKER_CONFIG, p.update_config)
