"""NameServer request processing (RocketMQ's DefaultRequestProcessor)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from tidemq.address import parse_address
from tidemq.errors import ConfigError, TidemqError
from tidemq.misdirected import UnsupportedRequests
from tidemq.names import check_stored_topic_name
from tidemq.remoting import RemotingCommand, RequestCode, ResponseCode
from tidemq.remoting.errors import BodyError
from tidemq.remoting.protocol import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    DataVersion,
    KVTable,
    RegisterBrokerBody,
    TopicConfigSerializeWrapper,
    TopicRouteData,
    loads,
)
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.namesrv.server import NameServer

#: UPDATE_NAMESRV_CONFIG's remark for kvConfigPath/configStorePath (answered NO_PERMISSION).
PATH_REFUSAL = "Can not update config path"

log = logging.getLogger(__name__)

Processor = Callable[[Any, RemotingCommand], RemotingCommand | Awaitable[RemotingCommand]]


class RequestError(TidemqError):
    """A request is missing a field or carries a bad one: answered with SYSTEM_ERROR and the reason."""


def _field(req: RemotingCommand, name: str) -> str:
    value = req.ext_fields.get(name)
    if value is None:
        raise RequestError(f"the custom field <{name}> is null")
    return value


def _int_field(req: RemotingCommand, name: str, default: int | None = None) -> int:
    raw = req.ext_fields.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RequestError(f"the custom field <{name}> is null")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RequestError(f"the custom field <{name}> = {raw!r} is not an integer") from None


#: The most queues a topic may have on one broker: what the broker's UPDATE_AND_CREATE_TOPIC
#: accepts.  A registration claiming 10^8 made every client build 10^8 queue objects.
MAX_QUEUE_NUMS = 1024
#: PermName bits: 8 priority, 4 read, 2 write, 1 inherit.
MAX_PERM = 15
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def check_queue_numbers(where: str, read: int, write: int, perm: int, sys_flag: int) -> None:
    """RequestError naming ``where`` when a topic's numbers are out of range (negative, huge...)."""
    for name, value in (("readQueueNums", read), ("writeQueueNums", write)):
        if not 0 <= value <= MAX_QUEUE_NUMS:
            raise RequestError(f"{where}: {name} = {value} is out of range (0..{MAX_QUEUE_NUMS})")
    if not 0 <= perm <= MAX_PERM:
        raise RequestError(f"{where}: perm = {perm} is out of range (0..{MAX_PERM})")
    if not 0 <= sys_flag <= INT32_MAX:
        raise RequestError(f"{where}: topicSysFlag = {sys_flag} is out of range (0..{INT32_MAX})")


def _check_registration(
    broker_name: str,
    broker_addr: str,
    broker_id: int,
    ha_addr: str,
    wrapper: TopicConfigSerializeWrapper,
    filters: list[str],
) -> None:
    who = f"register of {broker_name} at {broker_addr} refused"
    for key, value in (
        ("brokerAddr", broker_addr),
        ("haServerAddr", ha_addr),
        *(("filterServerList", f) for f in filters),
    ):
        if value or key == "brokerAddr":
            try:
                parse_address(value, key)
            except ConfigError as exc:
                raise RequestError(f"{who}: {exc}") from None
    if not 0 <= broker_id <= INT64_MAX:
        raise RequestError(f"{who}: brokerId = {broker_id} is out of range (0..{INT64_MAX})")
    version = wrapper.data_version
    if not (0 <= version.counter <= INT64_MAX and 0 <= version.timestamp <= INT64_MAX):
        raise RequestError(f"{who}: dataVersion {version.counter}/{version.timestamp} is out of range")
    for topic, tc in wrapper.topic_config_table.items():
        problem = check_stored_topic_name(topic)
        if problem:  # no broker of ours sends one: refuse the registration, naming it
            raise RequestError(f"{who}: {problem}")
        check_queue_numbers(
            f"{who}: topic {topic}", tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag
        )


def java_crc32(data: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: CRC-32 masked to a positive Java int."""
    return zlib.crc32(data) & 0x7FFFFFFF


class NamesrvProcessor:
    def __init__(self, namesrv: NameServer):
        self.namesrv = namesrv
        self.routes = namesrv.route_info
        self.kv = namesrv.kv_config
        self._unsupported = UnsupportedRequests("NameServer", log)
        self._refusals_logged: set[tuple[str, int]] = set()
        rc = RequestCode
        self._table: dict[int, Processor] = {
            rc.PUT_KV_CONFIG: self.put_kv_config,
            rc.GET_KV_CONFIG: self.get_kv_config,
            rc.DELETE_KV_CONFIG: self.delete_kv_config,
            rc.GET_KVLIST_BY_NAMESPACE: self.get_kv_list_by_namespace,
            rc.QUERY_DATA_VERSION: self.query_data_version,
            rc.REGISTER_BROKER: self.register_broker,
            rc.UNREGISTER_BROKER: self.unregister_broker,
            rc.GET_ROUTEINFO_BY_TOPIC: self.get_route_info_by_topic,
            rc.GET_BROKER_CLUSTER_INFO: self.get_broker_cluster_info,
            rc.WIPE_WRITE_PERM_OF_BROKER: self.wipe_write_perm_of_broker,
            rc.ADD_WRITE_PERM_OF_BROKER: self.add_write_perm_of_broker,
            rc.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_all_topic_list,
            rc.DELETE_TOPIC_IN_NAMESRV: self.delete_topic,
            rc.REGISTER_TOPIC_IN_NAMESRV: self.register_topic,
            rc.GET_TOPICS_BY_CLUSTER: self.get_topics_by_cluster,
            rc.GET_SYSTEM_TOPIC_LIST_FROM_NS: self.get_system_topic_list,
            rc.GET_UNIT_TOPIC_LIST: lambda c, r: self._unit_topics(r, "unit"),
            rc.GET_HAS_UNIT_SUB_TOPIC_LIST: lambda c, r: self._unit_topics(r, "unit_sub"),
            rc.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST: lambda c, r: self._unit_topics(r, "unit_sub_ununit"),
            rc.GET_NAMESRV_CONFIG: self.get_config,
            rc.UPDATE_NAMESRV_CONFIG: self.update_config,
        }

    async def handle(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """The transport handler."""
        proc = self._table.get(req.code)
        if proc is None:
            # Usually a client given the NameServer's port as a broker's: say so, once per peer.
            return self._unsupported.answer(req, str(getattr(conn, "remote_address", "?")))
        auth = self.namesrv.auth
        if auth is not None:
            refused = auth.refusal(req)
            if refused is not None:
                self._refused(conn, req, refused)
                return req.reply(ResponseCode.NO_PERMISSION, remark=refused)
        try:
            result = proc(conn, req)
            if isinstance(result, Awaitable):
                result = await result
            return result
        except (RequestError, BodyError) as exc:
            log.warning(
                "bad request code %s from %s: %s", req.code, getattr(conn, "remote_address", "?"), exc
            )
            return req.reply(ResponseCode.SYSTEM_ERROR, remark=str(exc))

    def _refused(self, conn: Connection, req: RemotingCommand, reason: str) -> None:
        # One WARNING per peer and code, then DEBUG: a peer retrying must not flood the log.
        peer = str(getattr(conn, "remote_address", "?"))
        key = (peer.rpartition(":")[0] or peer, req.code)
        if key in self._refusals_logged or len(self._refusals_logged) > 10_000:
            log.debug("refused request code %s from %s: %s", req.code, peer, reason)
            return
        self._refusals_logged.add(key)
        log.warning("refused request code %s from %s: %s", req.code, peer, reason)

    # ------------------------------------------------------------------ KV config
    def put_kv_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        self.kv.put(_field(req, "namespace"), _field(req, "key"), _field(req, "value"))
        return req.reply()

    def get_kv_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ns, key = _field(req, "namespace"), _field(req, "key")
        value = self.kv.get(ns, key)
        if value is None:
            return req.reply(
                ResponseCode.QUERY_NOT_FOUND, remark=f"No config item, Namespace: {ns} Key: {key}"
            )
        return req.reply(ext_fields={"value": value})

    def delete_kv_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        self.kv.delete(_field(req, "namespace"), _field(req, "key"))
        return req.reply()

    def get_kv_list_by_namespace(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ns = _field(req, "namespace")
        table = self.kv.namespace(ns)
        if table is None:
            return req.reply(ResponseCode.QUERY_NOT_FOUND, remark=f"No config item, Namespace: {ns}")
        return req.reply(body=KVTable(table).encode())

    # ------------------------------------------------------------------ brokers
    def register_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        broker_name = _field(req, "brokerName")
        broker_addr = _field(req, "brokerAddr")
        cluster = _field(req, "clusterName")
        broker_id = _int_field(req, "brokerId")
        ha_addr = req.ext_fields.get("haServerAddr", "")
        body = req.payload()
        crc = _int_field(req, "bodyCrc32", 0)
        if crc and body and java_crc32(body) != crc:
            log.warning("register from %s: body crc32 mismatch", broker_addr)
            return req.reply(ResponseCode.SYSTEM_ERROR, remark="crc32 not match")
        if not body:
            wrapper = TopicConfigSerializeWrapper(data_version=DataVersion(0, 0))
            filters: list[str] = []
        elif req.ext_fields.get("compressed") == "true":
            # Inflated at most to the frame limit: a 1 MiB zlib bomb must not become 1 GiB.
            parsed = RegisterBrokerBody.decode_compressed(body, self.namesrv.settings.max_frame_size)
            wrapper, filters = parsed.topic_config_serialize_wrapper, parsed.filter_server_list
        else:
            data = loads(body)
            if isinstance(data, dict) and "topicConfigTable" in data:  # pre-3.0.11 brokers send the wrapper
                wrapper, filters = TopicConfigSerializeWrapper.from_dict(data), []
            else:
                parsed = RegisterBrokerBody.from_dict(data)
                wrapper, filters = parsed.topic_config_serialize_wrapper, parsed.filter_server_list
        _check_registration(broker_name, broker_addr, broker_id, ha_addr, wrapper, filters)
        result = self.routes.register_broker(
            cluster, broker_addr, broker_name, broker_id, ha_addr, wrapper, filters, connection=conn
        )
        self.namesrv.watch_connection(conn)
        ext = {}
        if result.ha_server_addr:
            ext["haServerAddr"] = result.ha_server_addr
        if result.master_addr:
            ext["masterAddr"] = result.master_addr
        order = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return req.reply(ext_fields=ext, body=KVTable(order).encode() if order else None)

    def unregister_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        self.routes.unregister_broker(
            _field(req, "clusterName"),
            _field(req, "brokerAddr"),
            _field(req, "brokerName"),
            _int_field(req, "brokerId"),
        )
        return req.reply()

    def query_data_version(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        broker_addr = _field(req, "brokerAddr")
        version = DataVersion.decode(req.payload())
        changed = self.routes.is_broker_topic_config_changed(broker_addr, version)
        if not changed:
            self.routes.update_broker_info_update_timestamp(broker_addr)
        known = self.routes.query_broker_topic_config(broker_addr)
        return req.reply(ext_fields={"changed": changed}, body=known.encode() if known else None)

    def wipe_write_perm_of_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        count = self.routes.wipe_write_perm_of_broker(_field(req, "brokerName"))
        return req.reply(ext_fields={"wipeTopicCount": count})

    def add_write_perm_of_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        count = self.routes.add_write_perm_of_broker(_field(req, "brokerName"))
        return req.reply(ext_fields={"addTopicCount": count})

    # ------------------------------------------------------------------ routes and topics
    def get_route_info_by_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topic = _field(req, "topic")
        route = self.routes.pickup_topic_route_data(topic)
        if route is None:
            return req.reply(
                ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {topic}",
            )
        # RocketMQ attaches the order conf only with orderMessageEnable (on by default in tidemq).
        order_conf = (
            self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic) if self.namesrv.order_message_enable else None
        )
        if order_conf:
            route.order_topic_conf = order_conf
        return req.reply(body=route.encode())

    def get_broker_cluster_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=self.routes.get_all_cluster_info().encode())

    def get_all_topic_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=self.routes.get_all_topic_list().encode())

    def delete_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        self.routes.delete_topic(_field(req, "topic"), req.ext_fields.get("clusterName") or None)
        return req.reply()

    def register_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        route = TopicRouteData.decode(req.payload())
        topic = _field(req, "topic")
        problem = check_stored_topic_name(topic)
        if problem:
            raise RequestError(problem)
        for qd in route.queue_datas:
            check_queue_numbers(
                f"topic {topic} on {qd.broker_name}",
                qd.read_queue_nums,
                qd.write_queue_nums,
                qd.perm,
                qd.topic_syn_flag,
            )
        self.routes.register_topic(topic, route.queue_datas)
        return req.reply()

    def get_topics_by_cluster(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=self.routes.get_topics_by_cluster(_field(req, "cluster")).encode())

    def get_system_topic_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=self.routes.get_system_topic_list().encode())

    def _unit_topics(self, req: RemotingCommand, kind: str) -> RemotingCommand:
        return req.reply(body=self.routes.get_unit_topics(kind).encode())

    # ------------------------------------------------------------------ NameServer config
    def get_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=self.namesrv.config_properties().encode())

    def update_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        try:
            text = req.payload().decode()
        except UnicodeDecodeError:
            raise RequestError("config body is not UTF-8") from None
        error = self.namesrv.update_config_properties(text)
        if error == PATH_REFUSAL:
            return req.reply(ResponseCode.NO_PERMISSION, remark=error)  # RocketMQ's answer
        if error:
            return req.reply(ResponseCode.SYSTEM_ERROR, remark=error)
        log.info("NameServer config updated by %s: %s", getattr(conn, "remote_address", "?"), text.strip())
        return req.reply()
