"""JSON bodies of the NameServer/broker protocol, as RocketMQ 4.x (fastjson) writes them.

Each model has ``to_dict``/``from_dict`` (the JSON object with RocketMQ's camelCase keys) and
``encode``/``decode`` (bytes).  Decoding accepts fastjson's habit of writing integer map keys
unquoted (``{0:"127.0.0.1:10911"}``); encoding always writes standard JSON, which fastjson and
the C++ client both read.
"""

from __future__ import annotations

import struct
import time
import zlib
from typing import Any

import attrs
import orjson

from tidemq.compression import DEFAULT_INFLATE_LIMIT, inflate_zlib
from tidemq.errors import CorruptDataError
from tidemq.jsonfile import quote_bare_int_keys
from tidemq.perm import PERM_INHERIT, PERM_PRIORITY, PERM_READ, PERM_WRITE  # re-exported (__all__)
from tidemq.remoting.errors import BodyError

MASTER_ID = 0
#: KV namespace whose entries (topic -> "brokerName:queueNums;...") mark orderly topics.
NAMESPACE_ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"


def loads(data: bytes | bytearray | memoryview | str | None) -> Any:
    """Parse a JSON body (tolerating fastjson's unquoted integer keys); BodyError if it is not JSON."""
    if data is None or len(data) == 0:
        raise BodyError("expected a JSON body, got none")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as first:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        fixed = quote_bare_int_keys(raw)
        if fixed != raw:
            try:
                return orjson.loads(fixed)
            except orjson.JSONDecodeError:
                pass
        raise BodyError(f"body is not valid JSON: {first}") from None


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


def _obj(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BodyError(f"{what} should be a JSON object, got {type(data).__name__}")
    return data


def _int(d: dict[str, Any], key: str, default: int, what: str) -> int:
    v = d.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    raise BodyError(f"{what}.{key} should be an integer, got {v!r}")


def _str(d: dict[str, Any], key: str, default: str | None, what: str) -> Any:
    v = d.get(key, default)
    if v is None or isinstance(v, str):
        return v
    raise BodyError(f"{what}.{key} should be a string, got {v!r}")


class _Body:
    """encode/decode on top of to_dict/from_dict."""

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Any) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def encode(self) -> bytes:
        return dumps(self.to_dict())

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview | str | None) -> Any:
        return cls.from_dict(loads(data))


@attrs.define
class DataVersion(_Body):
    """Version stamp of a broker's topic table; the NameServer re-reads topics when it changes."""

    timestamp: int = attrs.field(factory=lambda: int(time.time() * 1000))
    counter: int = 0

    def next_version(self) -> DataVersion:
        return DataVersion(timestamp=int(time.time() * 1000), counter=self.counter + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"timestamp": self.timestamp, "counter": self.counter}

    @classmethod
    def from_dict(cls, data: Any) -> DataVersion:
        d = _obj(data, "dataVersion")
        return cls(
            timestamp=_int(d, "timestamp", 0, "dataVersion"), counter=_int(d, "counter", 0, "dataVersion")
        )


def _attributes(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BodyError(f"topicConfig.attributes should be a map of strings, got {value!r:.200}")
    return dict(value)


@attrs.define
class TopicConfig(_Body):
    """One topic on a broker (RocketMQ's TopicConfig): the broker's table and registration bodies."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    #: RocketMQ 5's topic attributes (``message.type``...: tidemq.topic_attributes); written only
    #: when there are some, so 4.x readers see the same JSON as before.
    attributes: dict[str, str] = attrs.field(factory=dict)

    @property
    def queue_count(self) -> int:
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> TopicConfig:
        d = _obj(data, "topicConfig")
        name = _str(d, "topicName", None, "topicConfig")
        if not name:
            raise BodyError("topicConfig.topicName is missing")
        return cls(
            topic_name=name,
            read_queue_nums=_int(d, "readQueueNums", 16, "topicConfig"),
            write_queue_nums=_int(d, "writeQueueNums", 16, "topicConfig"),
            perm=_int(d, "perm", PERM_READ | PERM_WRITE, "topicConfig"),
            topic_filter_type=_str(d, "topicFilterType", "SINGLE_TAG", "topicConfig") or "SINGLE_TAG",
            topic_sys_flag=_int(d, "topicSysFlag", 0, "topicConfig"),
            order=bool(d.get("order", False)),
            attributes=_attributes(d.get("attributes")),
        )

    def encode_line(self) -> str:
        """RocketMQ's compact ``TopicConfig.encode()`` form used by compressed registrations."""
        line = f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} {self.perm} {self.topic_filter_type}"
        if self.attributes:  # RocketMQ 5 appends them as a JSON map (4.x decoders read 5 fields)
            line += " " + dumps(self.attributes).decode()
        return line

    @classmethod
    def decode_line(cls, line: str) -> TopicConfig:
        fields = line.split(" ")
        if len(fields) < 5:
            raise BodyError(f"compressed topic config {line[:80]!r} has fewer than 5 fields")
        try:
            cfg = cls(fields[0], int(fields[1]), int(fields[2]), int(fields[3]), fields[4])
        except ValueError:
            raise BodyError(f"compressed topic config {line[:80]!r} has a non-integer field") from None
        if len(fields) >= 6:
            try:  # as RocketMQ: attributes that do not parse (a ' ' in them) are left out
                cfg.attributes = _attributes(loads(fields[5]))
            except (BodyError, ValueError):
                pass
        return cfg


@attrs.define
class TopicConfigSerializeWrapper(_Body):
    topic_config_table: dict[str, TopicConfig] = attrs.field(factory=dict)
    data_version: DataVersion = attrs.field(factory=DataVersion)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topicConfigTable": {name: tc.to_dict() for name, tc in self.topic_config_table.items()},
            "dataVersion": self.data_version.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> TopicConfigSerializeWrapper:
        d = _obj(data, "topicConfigSerializeWrapper")
        table = d.get("topicConfigTable") or {}
        _obj(table, "topicConfigTable")
        configs = {}
        for name, raw in table.items():
            tc = TopicConfig.from_dict(raw) if isinstance(raw, dict) and raw.get("topicName") else None
            if tc is None:  # fastjson may omit topicName inside the map; the key names it
                raw = dict(_obj(raw, "topicConfig"), topicName=name)
                tc = TopicConfig.from_dict(raw)
            configs[name] = tc
        dv = d.get("dataVersion")
        return cls(configs, DataVersion.from_dict(dv) if dv is not None else DataVersion(0, 0))


@attrs.define
class RegisterBrokerBody(_Body):
    """REGISTER_BROKER's body: the broker's topic table and its filter servers."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = attrs.field(
        factory=TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = attrs.field(factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topicConfigSerializeWrapper": self.topic_config_serialize_wrapper.to_dict(),
            "filterServerList": list(self.filter_server_list),
        }

    @classmethod
    def from_dict(cls, data: Any) -> RegisterBrokerBody:
        d = _obj(data, "registerBrokerBody")
        wrapper = d.get("topicConfigSerializeWrapper")
        filters = d.get("filterServerList") or []
        if not isinstance(filters, list) or not all(isinstance(f, str) for f in filters):
            raise BodyError("registerBrokerBody.filterServerList should be a list of strings")
        return cls(
            TopicConfigSerializeWrapper.from_dict(wrapper)
            if wrapper is not None
            else TopicConfigSerializeWrapper(),
            list(filters),
        )

    def encode_compressed(self) -> bytes:
        """RocketMQ's ``compressed=true`` form: deflated length-prefixed records."""
        out = []
        dv = self.topic_config_serialize_wrapper.data_version.encode()
        out += [struct.pack(">i", len(dv)), dv]
        table = self.topic_config_serialize_wrapper.topic_config_table
        out.append(struct.pack(">i", len(table)))
        for tc in table.values():
            line = tc.encode_line().encode()
            out += [struct.pack(">i", len(line)), line]
        fs = dumps(self.filter_server_list)
        out += [struct.pack(">i", len(fs)), fs]
        return zlib.compress(b"".join(out), 9)

    @classmethod
    def decode_compressed(cls, data: bytes, limit: int = DEFAULT_INFLATE_LIMIT) -> RegisterBrokerBody:
        """Decode RocketMQ's ``compressed=true`` body; it may inflate to at most ``limit`` bytes."""
        try:
            raw = inflate_zlib(data, limit)
        except CorruptDataError as exc:
            raise BodyError(f"compressed register body refused: {exc}") from None
        pos = 0

        def take() -> bytes:
            nonlocal pos
            if pos + 4 > len(raw):
                raise BodyError("compressed register body is truncated")
            (n,) = struct.unpack_from(">i", raw, pos)
            pos += 4
            if n < 0 or pos + n > len(raw):
                raise BodyError(f"compressed register body record length {n} is out of range")
            chunk = raw[pos : pos + n]
            pos += n
            return chunk

        dv = DataVersion.decode(take())
        if pos + 4 > len(raw):
            raise BodyError("compressed register body is truncated")
        (count,) = struct.unpack_from(">i", raw, pos)
        pos += 4
        if count < 0:
            raise BodyError(f"compressed register body topic count {count} is negative")
        table: dict[str, TopicConfig] = {}
        for _ in range(count):
            try:
                tc = TopicConfig.decode_line(take().decode())
            except UnicodeDecodeError:
                raise BodyError("compressed topic config is not UTF-8") from None
            table[tc.topic_name] = tc
        filters: list[str] = []
        if pos < len(raw):
            parsed = loads(take())
            if isinstance(parsed, list):
                filters = [str(f) for f in parsed]
        return cls(TopicConfigSerializeWrapper(table, dv), filters)


@attrs.define
class QueueData(_Body):
    """One broker's queues of a topic: a row of the NameServer's topic table, edited in place.

    Clients read routes into the frozen :class:`tidemq.client.route.QueueData` instead.
    """

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_syn_flag: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSynFlag": self.topic_syn_flag,
        }

    @classmethod
    def from_dict(cls, data: Any) -> QueueData:
        d = _obj(data, "queueData")
        return cls(
            broker_name=_str(d, "brokerName", "", "queueData"),
            read_queue_nums=_int(d, "readQueueNums", 0, "queueData"),
            write_queue_nums=_int(d, "writeQueueNums", 0, "queueData"),
            perm=_int(d, "perm", 0, "queueData"),
            topic_syn_flag=_int(d, "topicSynFlag", _int(d, "topicSysFlag", 0, "queueData"), "queueData"),
        )


@attrs.define
class BrokerData(_Body):
    """A broker group's addresses: a row of the NameServer's broker table, edited in place.

    Clients read routes into the frozen :class:`tidemq.client.route.BrokerData` instead.
    """

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict)  # broker id (0 = master) -> "ip:port"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {str(k): v for k, v in sorted(self.broker_addrs.items())},
        }

    @classmethod
    def from_dict(cls, data: Any) -> BrokerData:
        d = _obj(data, "brokerData")
        addrs = _obj(d.get("brokerAddrs") or {}, "brokerData.brokerAddrs")
        try:
            parsed = {int(k): str(v) for k, v in addrs.items()}
        except ValueError:
            raise BodyError("brokerData.brokerAddrs keys should be broker ids") from None
        return cls(
            cluster=_str(d, "cluster", "", "brokerData") or "",
            broker_name=_str(d, "brokerName", "", "brokerData") or "",
            broker_addrs=parsed,
        )

    def select_broker_addr(self) -> str | None:
        """The master's address, else any slave's."""
        if MASTER_ID in self.broker_addrs:
            return self.broker_addrs[MASTER_ID]
        return next(iter(self.broker_addrs.values()), None)

    def copy(self) -> BrokerData:
        return BrokerData(self.cluster, self.broker_name, dict(self.broker_addrs))


@attrs.define
class TopicRouteData(_Body):
    """GET_ROUTEINFO_BY_TOPIC's body."""

    queue_datas: list[QueueData] = attrs.field(factory=list)
    broker_datas: list[BrokerData] = attrs.field(factory=list)
    filter_server_table: dict[str, list[str]] = attrs.field(factory=dict)
    order_topic_conf: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.order_topic_conf is not None:
            d["orderTopicConf"] = self.order_topic_conf
        d["queueDatas"] = [q.to_dict() for q in self.queue_datas]
        d["brokerDatas"] = [b.to_dict() for b in self.broker_datas]
        d["filterServerTable"] = {k: list(v) for k, v in self.filter_server_table.items()}
        return d

    @classmethod
    def from_dict(cls, data: Any) -> TopicRouteData:
        d = _obj(data, "topicRouteData")
        qds = d.get("queueDatas") or []
        bds = d.get("brokerDatas") or []
        if not isinstance(qds, list) or not isinstance(bds, list):
            raise BodyError("topicRouteData.queueDatas/brokerDatas should be lists")
        fst = _obj(d.get("filterServerTable") or {}, "topicRouteData.filterServerTable")
        return cls(
            queue_datas=[QueueData.from_dict(q) for q in qds],
            broker_datas=[BrokerData.from_dict(b) for b in bds],
            filter_server_table={str(k): list(v or []) for k, v in fst.items()},
            order_topic_conf=_str(d, "orderTopicConf", None, "topicRouteData"),
        )


@attrs.define
class ClusterInfo(_Body):
    """GET_BROKER_CLUSTER_INFO's body."""

    broker_addr_table: dict[str, BrokerData] = attrs.field(factory=dict)
    cluster_addr_table: dict[str, set[str]] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {name: bd.to_dict() for name, bd in self.broker_addr_table.items()},
            "clusterAddrTable": {c: sorted(names) for c, names in self.cluster_addr_table.items()},
        }

    @classmethod
    def from_dict(cls, data: Any) -> ClusterInfo:
        d = _obj(data, "clusterInfo")
        bat = _obj(d.get("brokerAddrTable") or {}, "clusterInfo.brokerAddrTable")
        cat = _obj(d.get("clusterAddrTable") or {}, "clusterInfo.clusterAddrTable")
        return cls(
            broker_addr_table={str(k): BrokerData.from_dict(v) for k, v in bat.items()},
            cluster_addr_table={str(k): set(v or []) for k, v in cat.items()},
        )


@attrs.define
class TopicList(_Body):
    topic_list: set[str] = attrs.field(factory=set)
    broker_addr: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"topicList": sorted(self.topic_list)}
        if self.broker_addr is not None:
            d["brokerAddr"] = self.broker_addr
        return d

    @classmethod
    def from_dict(cls, data: Any) -> TopicList:
        d = _obj(data, "topicList")
        topics = d.get("topicList") or []
        if not isinstance(topics, list):
            raise BodyError("topicList.topicList should be a list")
        return cls(set(map(str, topics)), _str(d, "brokerAddr", None, "topicList"))


@attrs.define
class KVTable(_Body):
    table: dict[str, str] = attrs.field(factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"table": dict(self.table)}

    @classmethod
    def from_dict(cls, data: Any) -> KVTable:
        d = _obj(data, "kvTable")
        t = _obj(d.get("table") or {}, "kvTable.table")
        return cls({str(k): str(v) for k, v in t.items()})


__all__ = [
    "MASTER_ID",
    "NAMESPACE_ORDER_TOPIC_CONFIG",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "BrokerData",
    "ClusterInfo",
    "DataVersion",
    "KVTable",
    "QueueData",
    "RegisterBrokerBody",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicList",
    "TopicRouteData",
    "dumps",
    "loads",
]
