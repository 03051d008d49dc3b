"""The first mqadmin commands: topics, routes, cluster list, consumer progress, messages."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click
import orjson

from tidemq.admin import stats as stats_cmds
from tidemq.admin import timer as timer_cmds
from tidemq.admin._common import (
    PRODUCER_GROUP,
    TOOLS_GROUP,
    _fmt_ts,
    _print_message,
    _run,
    _table,
    admin,
)
from tidemq.client.admin import AdminClient, AdminError, NoRouteError, topic_fields
from tidemq.client.route import loads_lenient
from tidemq.message import MessageExt, Prop, decode_message_id, iter_messages, properties_to_string
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.topic_attributes import TopicAttributeError, parse_modification


@admin.command("updateTopic")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option(
    "-b", "--brokerAddr", "--broker-addr", "broker_addr", help="Create on this broker only (host:port)."
)
@click.option(
    "-c",
    "--clusterName",
    "--cluster",
    "cluster",
    help="Create on every master of this cluster (default: every master).",
)
@click.option(
    "-r",
    "--readQueueNums",
    "--read-queues",
    "read_queues",
    default=8,
    show_default=True,
    type=int,
    help="Read queues per broker.",
)
@click.option(
    "-w",
    "--writeQueueNums",
    "--write-queues",
    "write_queues",
    default=8,
    show_default=True,
    type=int,
    help="Write queues per broker.",
)
@click.option("-p", "--perm", default=6, show_default=True, type=int, help="2 write, 4 read, 6 read+write.")
@click.option(
    "-o",
    "--order",
    "order_flag",
    help="true: an ordered topic; also writes its ORDER_TOPIC_CONFIG order conf "
    "(brokerName:writeQueueNums;...) to the NameServers.",
)
@click.option("-u", "--unit", "unit_flag", help="true: a unit topic (topicSysFlag |= 1).")
@click.option("-s", "--hasUnitSub", "unit_sub_flag", help="true: has unit subscriptions (topicSysFlag |= 2).")
@click.option(
    "-a",
    "--attributes",
    "attributes",
    default="",
    help="RocketMQ 5 topic attributes: +key=value adds or changes, -key removes, comma-separated "
    "(+message.type=FIFO; types NORMAL, FIFO, DELAY, TRANSACTION, MIXED).",
)
@_run
async def update_topic(
    client: AdminClient,
    topic: str,
    broker_addr: str | None,
    cluster: str | None,
    read_queues: int,
    write_queues: int,
    perm: int,
    order_flag: str | None,
    unit_flag: str | None,
    unit_sub_flag: str | None,
    attributes: str,
) -> None:
    """Create a topic or change its queues, permission and attributes."""
    from tidemq.admin.namesrv import (
        broker_name_of,
        cluster_broker_names,
        get_kv_config,
        java_bool,
        merge_order_conf,
        put_kv_config,
        topic_config_string,
    )
    from tidemq.remoting.protocol import NAMESPACE_ORDER_TOPIC_CONFIG

    order = java_bool(order_flag)  # mqadmin's -o true|false (Boolean.parseBoolean)
    # TopicSysFlag.buildSysFlag: bit 0 unit, bit 1 has-unit-sub.
    sys_flag = (1 if java_bool(unit_flag) else 0) | (2 if java_bool(unit_sub_flag) else 0)
    masters = {} if broker_addr else await client.masters(cluster)
    targets = [broker_addr] if broker_addr else list(masters.values())
    if not targets:
        raise AdminError("no broker master is registered with the NameServer")
    try:  # as mqadmin: a malformed -a is refused before anything is sent
        modification = parse_modification(attributes)
    except TopicAttributeError as exc:
        raise AdminError(f"-a {attributes!r}: {exc}") from None
    fields = topic_fields(topic, read_queues, write_queues, perm, sys_flag, order, attributes)
    for addr in targets:
        await client.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        click.echo(f"create topic to {addr} success.")
    if order:
        # As mqadmin: one broker merges its part into the conf, a cluster writes the whole conf.
        if broker_addr:
            entry = f"{await broker_name_of(client, broker_addr)}:{write_queues}"
            old = await get_kv_config(client, NAMESPACE_ORDER_TOPIC_CONFIG, topic)
            conf = merge_order_conf(old, entry)
            scope = "broker"
        else:
            names = await cluster_broker_names(client, cluster) if cluster else sorted(masters)
            conf = ";".join(f"{name}:{write_queues}" for name in names)
            scope = "cluster"
        await put_kv_config(client, NAMESPACE_ORDER_TOPIC_CONFIG, topic, conf)
        click.echo(f"set {scope} orderConf. isOrder=true, orderConf=[{conf}]")
    click.echo(topic_config_string(topic, read_queues, write_queues, perm, sys_flag, order, modification))


@admin.command("deleteTopic")
@click.option("-t", "--topic", required=True)
@click.option("-c", "--cluster", help="Delete from this cluster's masters (default: every master).")
@_run
async def delete_topic(client: AdminClient, topic: str, cluster: str | None) -> None:
    """Delete a topic from the brokers and the NameServers."""
    for name, addr in (await client.masters(cluster)).items():
        await client.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        click.echo(f"delete topic [{topic}] from broker {name} ({addr}) success.")
    for ns in client.namesrv:
        await client.call(ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
        click.echo(f"delete topic [{topic}] from NameServer {ns} success.")


@admin.command("topicList")
@click.option(
    "-c",
    "--clusterModel",
    "cluster_model",
    is_flag=True,
    help="Also each topic's cluster and consumer groups.",
)
@_run
@stats_cmds.readable
async def topic_list(client: AdminClient, cluster_model: bool) -> None:
    """List every topic the NameServer knows (-c: with its cluster and consumer groups)."""
    resp = await client.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = sorted(str(t) for t in loads_lenient(resp.body or b"{}").get("topicList") or [])
    if not cluster_model:
        for topic in topics:
            click.echo(topic)
        return
    info = await client.cluster_info()
    cluster_of = {
        str(name): str(bd.get("cluster", "")) for name, bd in (info.get("brokerAddrTable") or {}).items()
    }
    rows: list[list[str]] = []
    for topic in topics:
        if topic.startswith(("%RETRY%", "%DLQ%")):
            continue
        cluster, groups = "", set()
        try:
            route = await client.route(topic)
            names = sorted(route.addresses())
            cluster = cluster_of.get(names[0], "") if names else ""
            for addr in route.addresses().values():
                groups.update(await stats_cmds.consumers_of(client, addr, topic))
        except AdminError:
            pass  # as mqadmin: a topic it cannot inspect is listed without cluster and groups
        for group in sorted(groups) or [""]:
            rows.append([cluster, topic, group])
    _table(rows, ["#Cluster Name", "#Topic", "#Consumer Group"])


@admin.command("topicRoute")
@click.option("-t", "--topic", required=True)
@_run
async def topic_route(client: AdminClient, topic: str) -> None:
    """Print a topic's route (queues per broker, broker addresses) as JSON."""
    route = await client.route(topic)
    data = {
        "queueDatas": [
            {
                "brokerName": q.broker_name,
                "readQueueNums": q.read_queue_nums,
                "writeQueueNums": q.write_queue_nums,
                "perm": q.perm,
            }
            for q in route.queue_datas
        ],
        "brokerDatas": [
            {
                "cluster": b.cluster,
                "brokerName": b.broker_name,
                "brokerAddrs": {str(k): v for k, v in b.broker_addrs.items()},
            }
            for b in route.broker_datas
        ],
    }
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


@admin.command("topicStatus")
@click.option("-t", "--topic", required=True)
@_run
@stats_cmds.readable
async def topic_status(client: AdminClient, topic: str) -> None:
    """Min/max offsets and last store time of each queue of a topic."""
    route = await client.route(topic)
    rows = []
    for addr in sorted(route.addresses().values()):
        resp = await client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
        body = stats_cmds.json_body(resp.body, "GET_TOPIC_STATS_INFO")
        for r in stats_cmds.mq_rows(body.get("offsetTable"), "GET_TOPIC_STATS_INFO"):
            rows.append(
                [
                    r["brokerName"],
                    r["queueId"],
                    r.get("minOffset", 0),
                    r.get("maxOffset", 0),
                    _fmt_ts(int(r.get("lastUpdateTimestamp") or 0)),
                ]
            )
    _table(rows, ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"])
    scheduled = await timer_cmds.scheduled_of(client, sorted(route.addresses().values()), topic)
    if scheduled:  # timer messages of the topic waiting in the wheel (RocketMQ 5's GET_TIMER_METRICS)
        click.echo(f"#Scheduled (timer messages waiting): {scheduled}")


@admin.command("clusterList")
@click.option("-m", "--moreStats", "more", is_flag=True, help="Messages in and out yesterday and today.")
@click.option("-i", "--interval", type=int, help="Print again every this many seconds, until interrupted.")
@_run
@stats_cmds.readable
async def cluster_list(client: AdminClient, more: bool, interval: int | None) -> None:
    """Clusters and their brokers: version, TPS, disk use (-m: message totals per day)."""
    while True:
        if more:
            await _cluster_more_stats(client)
        else:
            await _cluster_base_info(client)
        if interval is None:
            return
        await asyncio.sleep(max(interval, 1))


async def _cluster_brokers(client: AdminClient) -> list[tuple[str, str, int, str]]:
    """(cluster, broker name, broker id, address) of every registered broker, sorted."""
    info = await client.cluster_info()
    brokers = info.get("brokerAddrTable") or {}
    out = []
    for cluster, names in sorted((info.get("clusterAddrTable") or {}).items()):
        for name in sorted(names):
            addrs = (brokers.get(name) or {}).get("brokerAddrs") or {}
            for bid, addr in sorted((int(k), str(v)) for k, v in addrs.items()):
                out.append((str(cluster), str(name), bid, addr))
    return out


async def _cluster_base_info(client: AdminClient) -> None:
    rows = []
    for cluster, name, bid, addr in await _cluster_brokers(client):
        version, in_tps, out_tps, pc_wait, hours, space = "", "", "", "", "", ""
        try:
            t = await stats_cmds.runtime_info(client, addr)
        except AdminError:
            t = {}  # as mqadmin: a broker that does not answer keeps its row, with blanks
        if t:
            earliest = _num(t.get("earliestMessageTimeStamp"))
            version = t.get("brokerVersionDesc", "")
            in_tps = _load(t, "putTps", "send")
            out_tps = _load(t, "getTransferedTps", "pull")
            pc_wait = t.get("pageCacheLockTimeMills", "")
            hours = f"{(time.time() * 1000 - earliest) / 3_600_000 if earliest > 0 else 0.0:.2f}"
            space = f"{_num(t.get('commitLogDiskRatio')):.4f}"
        rows.append([cluster, name, bid, addr, version, in_tps, out_tps, pc_wait, hours, space])
    _table(
        rows,
        [
            "#Cluster Name",
            "#Broker Name",
            "#BID",
            "#Addr",
            "#Version",
            "#InTPS(LOAD)",
            "#OutTPS(LOAD)",
            "#PCWait(ms)",
            "#Hour",
            "#SPACE",
        ],
    )


async def _cluster_more_stats(client: AdminClient) -> None:
    rows: list[list[Any]] = []
    for cluster, name, bid, addr in await _cluster_brokers(client):
        if bid != 0:
            continue  # as mqadmin: the masters' figures
        try:
            t = await stats_cmds.runtime_info(client, addr)
            n = {k: int(t.get(k) or 0) for k in _DAY_KEYS}
        except (AdminError, ValueError):
            rows.append([cluster, name, "-", "-", "-", "-"])
            continue
        rows.append(
            [
                cluster,
                name,
                n["msgPutTotalTodayMorning"] - n["msgPutTotalYesterdayMorning"],
                n["msgGetTotalTodayMorning"] - n["msgGetTotalYesterdayMorning"],
                n["msgPutTotalTodayNow"] - n["msgPutTotalTodayMorning"],
                n["msgGetTotalTodayNow"] - n["msgGetTotalTodayMorning"],
            ]
        )
    _table(
        rows,
        ["#Cluster Name", "#Broker Name", "#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"],
    )


_DAY_KEYS = [
    f"msg{d}Total{w}" for d in ("Put", "Get") for w in ("YesterdayMorning", "TodayMorning", "TodayNow")
]


def _num(value: str | None) -> float:
    """A runtime-info number; 0 when absent or unreadable (mqadmin prints 0 then too)."""
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _load(table: dict[str, str], key: str, pool: str) -> str:
    """mqadmin's ``TPS(queue size,head wait ms)``: the 10-second figure of a ``"t10 t60 t600"`` rate."""
    parts = (table.get(key) or "").split()
    tps = _num(parts[0]) if parts else 0.0
    size = table.get(f"{pool}ThreadPoolQueueSize", "0")
    wait = table.get(f"{pool}ThreadPoolQueueHeadWaitTimeMills", "0")
    return f"{tps:.2f}({size},{wait}ms)"


@admin.command("consumerProgress")
@click.option("-g", "--group", help="Consumer group (default: every group, one line each).")
@click.option("-t", "--topic", help="Only this topic.")
@click.option(
    "-s", "--showClientIP", "show_ip", default="false", help="Show each queue's client IP [true|false]."
)
@_run
async def consumer_progress(client: AdminClient, group: str | None, topic: str | None, show_ip: str) -> None:
    """Committed offset and lag of a consumer group per queue, or a summary of every group."""
    from tidemq.admin import consumers as c

    if not group:
        await _all_groups_progress(client)
        return
    if topic:
        addrs = list((await client.route(topic)).addresses().values())
    else:
        addrs = await c.group_brokers(client, group)
    table: dict[MessageQueue, Any] = {}
    tps = 0.0
    for addr in addrs:
        stats = await c.consume_stats(client, addr, group, topic)
        table.update(stats["offsetTable"])
        tps += stats["consumeTps"]
    if not table:
        raise AdminError(f"no broker knows consumer group {group!r}")
    owners: dict[MessageQueue, str] = {}
    ips = show_ip.strip().lower() == "true"
    if ips:
        try:
            cc = await c.consumer_connection(client, group)
            for conn in cc.get("connectionSet") or []:
                cid = str(conn.get("clientId"))
                info = await c.running_info(client, group, cid)
                for mq in c.mq_table(info.get("mqTable"), "GET_CONSUMER_RUNNING_INFO"):
                    owners[mq] = cid.split("@")[0]
        except AdminError:
            pass  # offline group: every queue shows N/A, as mqadmin
    rows = []
    total = 0
    for mq, w in sorted(table.items()):
        broker_off, consumer_off = int(w["brokerOffset"]), int(w["consumerOffset"])
        diff = broker_off - max(consumer_off, 0)
        total += diff
        last = int(w.get("lastTimestamp") or 0)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last / 1000)) if last else "N/A"
        row = [mq.topic, mq.broker_name, mq.queue_id, broker_off, consumer_off]
        rows.append([*row, owners.get(mq, "N/A"), diff, when] if ips else [*row, diff, when])
    head = ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset"]
    _table(rows, [*head, "#Client IP", "#Diff", "#LastTime"] if ips else [*head, "#Diff", "#LastTime"])
    click.echo(f"\nConsume TPS: {tps:.2f}")
    click.echo(f"Diff Total: {total}")


async def _all_groups_progress(client: AdminClient) -> None:
    """mqadmin consumerProgress without -g: every group that has a retry topic, one line each."""
    from tidemq.admin import consumers as c
    from tidemq.client.diagnostics import version_desc

    resp = await client.namesrv_call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    topics = loads_lenient(resp.body or b"{}").get("topicList") or []
    rows = []
    for group in sorted(t[len(c.RETRY_PREFIX) :] for t in topics if t.startswith(c.RETRY_PREFIX)):
        tps, diff = 0.0, 0
        count, version, ctype, model = 0, "OFFLINE", "", ""
        try:
            for addr in await c.group_brokers(client, group):
                stats = await c.consume_stats(client, addr, group)
                tps += stats["consumeTps"]
                diff += sum(
                    int(w["brokerOffset"]) - max(int(w["consumerOffset"]), 0)
                    for w in stats["offsetTable"].values()
                )
        except AdminError:
            pass
        try:
            cc = await c.consumer_connection(client, group)
            conns = cc.get("connectionSet") or []
            count = len(conns)
            if conns:
                version = version_desc(min(int(x.get("version") or 0) for x in conns))
            ctype = {"CONSUME_ACTIVELY": "PULL", "CONSUME_PASSIVELY": "PUSH"}.get(
                str(cc.get("consumeType")), ""
            )
            model = str(cc.get("messageModel") or "")
        except AdminError:
            pass
        rows.append([group, count, version, ctype, model, int(tps), diff])
    _table(rows, ["#Group", "#Count", "#Version", "#Type", "#Model", "#TPS", "#Diff Total"])


async def _query(client: AdminClient, topic: str, key: str, unique: bool) -> list[MessageExt]:
    """Messages of ``topic`` with ``key`` (a unique id when ``unique``), from every broker."""
    return await client.query_messages(topic, key, unique)


@admin.command("queryMsgByKey")
@click.option("-t", "--topic", required=True)
@click.option("-k", "--key", "msg_key", required=True)
@_run
async def query_msg_by_key(client: AdminClient, topic: str, msg_key: str) -> None:
    """Find messages by one of their keys (through the brokers' key index)."""
    msgs = await _query(client, topic, msg_key, unique=False)
    if not msgs:
        raise AdminError(f"no message of topic {topic!r} has the key {msg_key!r}")
    _table(
        [
            [m.uniq_key or m.msg_id, m.msg_id, m.queue_id, m.queue_offset, _fmt_ts(m.store_timestamp)]
            for m in msgs
        ],
        ["#Message ID", "#Offset ID", "#QID", "#Offset", "#Store Time"],
    )


async def _broker_addresses(client: AdminClient) -> set[str]:
    """Registered broker addresses, also as IP:port (an offset id holds the store host's IP)."""
    import socket

    known = set(await client.broker_addresses())
    for addr in list(known):
        host, _, port = addr.rpartition(":")
        try:
            known.add(f"{socket.gethostbyname(host.strip('[]'))}:{port}")
        except OSError:
            pass
    return known


@admin.command("queryMsgById")
@click.option("-i", "--msg-id", required=True, help="Offset message id, or a unique id with -t.")
@click.option("-t", "--topic", help="Topic, needed to look up a producer's unique message id.")
@click.option(
    "-g", "--consumerGroup", "group", help="With -d: have this group's client consume the message again."
)
@click.option("-d", "--clientId", "client_id", help="With -g: the consumer's client id.")
@_run
async def query_msg_by_id(
    client: AdminClient, msg_id: str, topic: str | None, group: str | None, client_id: str | None
) -> None:
    """Print one message, found by its offset id (or its unique id and topic); with -g and -d, send
    it to that consumer instead (CONSUME_MESSAGE_DIRECTLY) and print what the consumer answered."""
    msgs = await _find_by_id(client, msg_id, topic)
    if group and client_id:
        await _resend(client, msgs[0], group, client_id)
        return
    for m in msgs:
        _print_message(m)


@admin.command("queryMsgByUniqueKey")
@click.option("-i", "--msgId", "msg_id", required=True, help="The producer's (unique) message id.")
@click.option("-t", "--topic", required=True)
@click.option(
    "-g", "--consumerGroup", "group", help="With -d: have this group's client consume the message again."
)
@click.option("-d", "--clientId", "client_id", help="With -g: the consumer's client id.")
@click.option(
    "-a", "--showAll", "show_all", is_flag=True, help="Print every message with this id, not only the first."
)
@_run
async def query_msg_by_unique_key(
    client: AdminClient, msg_id: str, topic: str, group: str | None, client_id: str | None, show_all: bool
) -> None:
    """Print a message found by its unique id (through the key index), or resend it with -g -d."""
    msgs = [m for m in await _query(client, topic, msg_id, unique=True) if m.uniq_key == msg_id]
    if not msgs:
        raise AdminError(f"no message of topic {topic!r} has the unique id {msg_id}")
    if group and client_id:
        await _resend(client, msgs[0], group, client_id)
        return
    for m in msgs if show_all else msgs[:1]:
        _print_message(m)


async def _resend(client: AdminClient, msg: MessageExt, group: str, client_id: str) -> None:
    """CONSUME_MESSAGE_DIRECTLY via the broker that stored ``msg``; prints the consumer's result."""
    from tidemq.admin import consumers as c

    store = f"{msg.store_host[0]}:{msg.store_host[1]}"
    result = await c.consume_directly(client, store, group, client_id, msg.msg_id)
    click.echo(c.direct_result_text(result))


async def _find_by_id(client: AdminClient, msg_id: str, topic: str | None) -> list[MessageExt]:
    """The messages with offset id ``msg_id``, or unique id with ``topic``; AdminError when none."""
    msgs: list[MessageExt] = []
    # Producer (unique) ids and offset ids can both be 16 bytes of hex: with a topic, ask the
    # key index first, then read the id as an offset id (RocketMQ's viewMessage does the same).
    if topic:
        msgs = [m for m in await _query(client, topic, msg_id, unique=True) if m.uniq_key == msg_id]
    if not msgs:
        try:
            (host, port), offset = decode_message_id(msg_id)
        except ValueError:
            if not topic:
                raise AdminError(
                    f"{msg_id!r} is not an offset message id; give -t TOPIC to look up a unique id"
                ) from None
        else:
            # Only ask a broker the cluster has: a producer's id read as an offset id names some
            # other machine (the official client's even a byte-swapped IP), and whatever answers
            # there is no broker.
            addr = f"{host}:{port}" if 0 < port < 65536 else ""
            if addr and addr in await _broker_addresses(client):
                resp = await client.call(addr, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
                msgs = list(iter_messages(resp.payload()))
            elif not topic:
                raise AdminError(
                    f"{msg_id} is not an offset message id of this cluster (read as one it names "
                    f"{addr or f'port {port}'}, which is no broker the NameServer knows); a producer's "
                    f"message id (the msg_id a send prints) needs its topic: "
                    f"tidemq admin queryMsgById -i {msg_id} -t TOPIC"
                )
    if not msgs:
        raise AdminError(f"message {msg_id} not found")
    return msgs


@admin.command("sendMessage")
@click.option("-t", "--topic", required=True)
@click.option("-p", "--body", required=True, help="Message body (UTF-8).")
@click.option("-k", "--keys", default="", help="Keys, separated by spaces.")
@click.option("-c", "--tags", default="", help="Tag.")
@click.option("-b", "--broker-name", help="Send to this broker.")
@click.option("-i", "--queue-id", type=int, help="Send to this queue.")
@_run
async def send_message(
    client: AdminClient,
    topic: str,
    body: str,
    keys: str,
    tags: str,
    broker_name: str | None,
    queue_id: int | None,
) -> None:
    """Send one message (auto-creates the topic when the brokers allow it)."""
    from tidemq.client.message import new_message_id

    try:
        route = await client.route(topic)
    except NoRouteError:
        try:
            route = await client.route("TBW102")  # the template brokers create new topics from
        except NoRouteError:
            # No broker offers the template: every broker runs with auto_create_topic = false.
            raise AdminError(
                f"topic {topic!r} does not exist and the brokers do not create topics on first send "
                f"([broker] auto_create_topic = false): create it with `tidemq admin updateTopic -t {topic}`"
            ) from None
    queues = route.publish_queues(topic, 4)
    if broker_name:
        queues = [q for q in queues if q.broker_name == broker_name]
    if queue_id is not None:
        queues = [q for q in queues if q.queue_id == queue_id]
    if not queues:
        raise AdminError(f"no writable queue of topic {topic!r} matches")
    mq = queues[int(time.time() * 1000) % len(queues)]
    props = {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: new_message_id(), Prop.WAIT_STORE_MSG_OK: "true"}
    if keys:
        props[Prop.KEYS] = keys
    if tags:
        props[Prop.TAGS] = tags
    fields = {
        "a": PRODUCER_GROUP,
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": mq.queue_id,
        "f": 0,
        "g": int(time.time() * 1000),
        "h": 0,
        "i": properties_to_string(props),
        "j": 0,
        "k": False,
    }
    addr = route.addresses()[mq.broker_name]
    resp = await client.call(addr, RequestCode.SEND_MESSAGE_V2, fields, body.encode())
    _table(
        [
            [
                mq.broker_name,
                mq.queue_id,
                "SEND_OK",
                props[Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX],
                resp.ext_fields.get("msgId", ""),
            ]
        ],
        ["#Broker Name", "#QID", "#Send Result", "#MsgId", "#OffsetId"],
    )


@admin.command("consumeMessage")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", help="Only this broker's queues.")
@click.option("-i", "--queueId", "queue_id", type=int, help="Only this queue (needs -b).")
@click.option("-o", "--offset", type=int, help="Start at this queue offset (needs -b and -i).")
@click.option("-g", "--consumerGroup", "group", default=TOOLS_GROUP, show_default=True)
@click.option("-s", "--beginTimestamp", "begin", help="From this store time: ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-e", "--endTimestamp", "end", help="Until this store time: ms or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option(
    "-c", "--MessageNumber", "count", default=128, show_default=True, type=int, help="Stop after this many."
)
@click.option(
    "--tags", "--sub", "expression", default="*", show_default=True, help="Tag expression (TagA || TagB)."
)
@_run
@stats_cmds.readable
async def consume_message(
    client: AdminClient,
    topic: str,
    broker_name: str | None,
    queue_id: int | None,
    offset: int | None,
    group: str,
    begin: str | None,
    end: str | None,
    count: int,
    expression: str,
) -> None:
    """Print messages of a topic from the oldest (or from -s / -o) on; commits nothing."""
    if queue_id is not None and not broker_name:
        raise AdminError("-i QUEUE_ID needs -b BROKER_NAME")
    if offset is not None and queue_id is None:
        raise AdminError("-o OFFSET needs -b BROKER_NAME and -i QUEUE_ID")
    route = await client.route(topic)
    addrs = route.addresses()
    queues = [
        mq
        for mq in route.subscribe_queues()
        if (not broker_name or mq.broker_name == broker_name)
        and (queue_id is None or mq.queue_id == queue_id)
    ]
    if not queues:
        raise AdminError(f"no readable queue of topic {topic!r} matches")
    printed = 0
    for mq in queues:
        addr = addrs.get(mq.broker_name)
        if addr is None or printed >= count:
            continue
        lo, hi = await stats_cmds.queue_range(client, addr, topic, mq.queue_id, begin, end)
        if offset is not None:
            lo = max(lo, offset)
        while printed < count and lo < hi:
            code, next_offset, msgs = await stats_cmds.pull(
                client, addr, topic, mq.queue_id, lo, min(32, count - printed), expression, group
            )
            for m in msgs:
                if m.queue_offset >= hi or printed >= count:
                    break
                click.echo(
                    f"{mq.broker_name} q{m.queue_id}@{m.queue_offset} id={m.uniq_key or m.msg_id} "
                    f"tags={m.tags or ''} keys={' '.join(m.keys)} body={m.body.decode('utf-8', 'replace')}"
                )
                printed += 1
            if next_offset <= lo or code not in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY):
                break
            lo = next_offset
    click.echo(f"{printed} message(s)")
