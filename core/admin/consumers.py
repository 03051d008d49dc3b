"""mqadmin's consumer-side commands: offsets reset and clone, consumer status and running info.

consumerConnection, consumerStatus, getConsumerStatus, cloneGroupOffset, resetOffsetByTime, skipAccumulatedMessage,
and allocateMQ, printing what mqadmin 4.9 prints.  The request helpers here are also used
by consumerProgress and the resend options of queryMsgById / queryMsgByUniqueKey.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import orjson

from tidemq import mqjson
from tidemq.admin._common import _run, admin
from tidemq.client.admin import AdminClient, AdminError, NoRouteError, _code_name
from tidemq.client.diagnostics import version_desc
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

#: mqadmin waits timeoutMillis * 3 for answers a broker relays from a client.
RELAY_TIMEOUT_S = 15.0
RETRY_PREFIX = "%RETRY%"


# ---------------------------------------------------------------------- requests
async def invoke(
    client: AdminClient,
    addr: str,
    code: int,
    fields: dict[str, Any] | None = None,
    *,
    ok: tuple[int, ...] = (0,),
    timeout: float | None = None,
    language: str | None = None,
) -> RemotingCommand:
    """AdminClient.call with a timeout and a request language of its own."""
    req = RemotingCommand.request(code, fields or {})
    if language:
        req.language = language
    if client.credentials is not None:
        client.credentials.sign(req)
    try:
        resp = await client.remoting.invoke(addr, req, timeout or client.timeout)
    except Exception as exc:
        raise AdminError(
            f"{addr} did not answer {RequestCode(code).name}: {exc or type(exc).__name__}"
        ) from exc
    if resp.code not in ok:
        raise AdminError(
            f"{addr} answered {RequestCode(code).name} with code {_code_name(resp.code)}: {resp.remark or ''}"
        )
    return resp


def parse_body(resp: RemotingCommand, what: str) -> dict[str, Any]:
    """A JSON or fastjson body as a dict; anything else is an AdminError naming the request."""
    try:
        value = mqjson.loads(resp.body or b"{}")
    except mqjson.MQJsonError as exc:
        raise AdminError(f"cannot read the {what} answer: {exc}") from None
    if not isinstance(value, dict):
        raise AdminError(f"cannot read the {what} answer: not a JSON object")
    return value


def mq_table(value: Any, what: str) -> dict[MessageQueue, Any]:
    """A MessageQueue-keyed table, map form (RocketMQ) or list form (older tidemq brokers)."""
    try:
        return mqjson.mq_map(value)
    except mqjson.MQJsonError as exc:
        raise AdminError(f"cannot read the {what} answer: {exc}") from None


async def group_brokers(client: AdminClient, group: str) -> list[str]:
    """The brokers that know ``group``: those of its retry topic's route, else every master."""
    try:
        addrs = (await client.route(RETRY_PREFIX + group)).addresses()
    except NoRouteError:
        addrs = await client.masters()
    return [addrs[name] for name in sorted(addrs)]


async def consumer_connection(client: AdminClient, group: str, broker: str | None = None) -> dict[str, Any]:
    """GET_CONSUMER_CONNECTION_LIST of ``group`` from ``broker`` or the first broker that knows it."""
    last: AdminError | None = None
    for addr in [broker] if broker else await group_brokers(client, group):
        try:
            resp = await client.call(addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
        except AdminError as exc:
            last = exc
            continue
        return parse_body(resp, "GET_CONSUMER_CONNECTION_LIST")
    raise AdminError(
        f"consumer group {group!r} is not online: {last}" if last else f"no broker knows {group!r}"
    )


async def running_info(
    client: AdminClient, group: str, client_id: str, jstack: bool = False
) -> dict[str, Any]:
    """GET_CONSUMER_RUNNING_INFO of one client, relayed by a broker of the group."""
    fields = {"consumerGroup": group, "clientId": client_id, "jstackEnable": jstack}
    last: AdminError | None = None
    for addr in await group_brokers(client, group):
        try:
            resp = await invoke(
                client, addr, RequestCode.GET_CONSUMER_RUNNING_INFO, fields, timeout=RELAY_TIMEOUT_S
            )
        except AdminError as exc:
            last = exc
            continue
        return parse_body(resp, "GET_CONSUMER_RUNNING_INFO")
    raise last or AdminError(f"no broker knows consumer group {group!r}")


def human_ms(ms: Any) -> str:
    """UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS in local time."""
    ms = int(ms or 0)
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms / 1000)) + f"{ms % 1000:03d}"


def _java(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def process_queue_text(pq: dict[str, Any]) -> str:
    """ProcessQueueInfo.toString."""
    fields = [
        ("commitOffset", pq.get("commitOffset")),
        ("cachedMsgMinOffset", pq.get("cachedMsgMinOffset")),
        ("cachedMsgMaxOffset", pq.get("cachedMsgMaxOffset")),
        ("cachedMsgCount", pq.get("cachedMsgCount")),
        ("cachedMsgSizeInMiB", pq.get("cachedMsgSizeInMiB")),
        ("transactionMsgMinOffset", pq.get("transactionMsgMinOffset")),
        ("transactionMsgMaxOffset", pq.get("transactionMsgMaxOffset")),
        ("transactionMsgCount", pq.get("transactionMsgCount")),
        ("locked", pq.get("locked")),
        ("tryUnlockTimes", pq.get("tryUnlockTimes")),
        ("lastLockTimestamp", human_ms(pq.get("lastLockTimestamp"))),
        ("droped", pq.get("droped")),
        ("lastPullTimestamp", human_ms(pq.get("lastPullTimestamp"))),
        ("lastConsumeTimestamp", human_ms(pq.get("lastConsumeTimestamp"))),
    ]
    return "ProcessQueueInfo [" + ", ".join(f"{k}={_java(v)}" for k, v in fields) + "]"


def format_running_info(info: dict[str, Any]) -> str:
    """ConsumerRunningInfo.formatString: properties, subscriptions, offsets, queues, RT/TPS, jstack."""
    out = ["#Consumer Properties#\n"]
    for key, value in sorted((info.get("properties") or {}).items()):
        out.append(f"{key:<40}: {value}\n")
    out.append("\n\n#Consumer Subscription#\n")
    for i, sub in enumerate(info.get("subscriptionSet") or [], 1):
        out.append(
            f"{i:03d} Topic: {sub.get('topic', ''):<40} ClassFilter: {_java(bool(sub.get('classFilterMode'))):<8} "
            f"SubExpression: {sub.get('subString', '')}\n"
        )
    mqs = sorted(mq_table(info.get("mqTable"), "GET_CONSUMER_RUNNING_INFO").items())
    out.append("\n\n#Consumer Offset#\n")
    out.append(f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#Consumer Offset':<20}\n")
    for mq, pq in mqs:
        out.append(
            f"{mq.topic:<32}  {mq.broker_name:<32}  {mq.queue_id:<4}  {int(pq.get('commitOffset', -1)):<20}\n"
        )
    out.append("\n\n#Consumer MQ Detail#\n")
    out.append(f"{'#Topic':<64}  {'#Broker Name':<32}  {'#QID':<4}  {'#ProcessQueueInfo':<20}\n")
    for mq, pq in mqs:
        out.append(f"{mq.topic:<64}  {mq.broker_name:<32}  {mq.queue_id:<4}  {process_queue_text(pq)}\n")
    out.append("\n\n#Consumer RT&TPS#\n")
    out.append(
        f"{'#Topic':<64}  {'#Pull RT':>14} {'#Pull TPS':>14} {'#Consume RT':>14} {'#ConsumeOK TPS':>14} "
        f"{'#ConsumeFailed TPS':>18} {'#ConsumeFailedMsgsInHour':>25}\n"
    )
    for topic, st in sorted((info.get("statusTable") or {}).items()):
        out.append(
            f"{topic:<32}  {float(st.get('pullRT', 0)):14.2f} {float(st.get('pullTPS', 0)):14.2f} "
            f"{float(st.get('consumeRT', 0)):14.2f} {float(st.get('consumeOKTPS', 0)):14.2f} "
            f"{float(st.get('consumeFailedTPS', 0)):18.2f} {int(st.get('consumeFailedMsgs', 0)):25d}\n"
        )
    if info.get("jstack") is not None:
        out.append("\n\n#Consumer jstack#\n")
        out.append(str(info["jstack"]))
    return "".join(out)


def analyze_process_queues(client_id: str, info: dict[str, Any]) -> str:
    """ConsumerRunningInfo.analyzeProcessQueue: push-consumer queues that look stuck."""
    props = info.get("properties") or {}
    if props.get("PROP_CONSUME_TYPE") != "CONSUME_PASSIVELY":
        return ""
    orderly = str(props.get("PROP_CONSUMEORDERLY", "")).lower() == "true"
    now = int(time.time() * 1000)
    out = []
    for mq, pq in sorted(mq_table(info.get("mqTable"), "GET_CONSUMER_RUNNING_INFO").items()):
        name = f"MessageQueue [topic={mq.topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"
        if orderly:
            if not pq.get("locked"):
                out.append(
                    f"{client_id} {name} can't lock for a while, {now - int(pq.get('lastLockTimestamp', 0))}ms\n"
                )
            elif pq.get("droped") and int(pq.get("tryUnlockTimes", 0)) > 0:
                out.append(f"{client_id} {name} unlock {pq.get('tryUnlockTimes')} times, still failed\n")
        else:
            diff = now - int(pq.get("lastConsumeTimestamp", 0))
            if diff > 60_000 and int(pq.get("cachedMsgCount", 0)) > 0:
                out.append(f"{client_id} {name} can't consume for a while, maybe blocked, {diff}ms\n")
    return "".join(out)


def same_subscription(infos: dict[str, dict[str, Any]]) -> bool:
    """ConsumerRunningInfo.analyzeSubscription: push consumers up for 2 minutes agree on subscriptions."""
    first = next(iter(infos.values()))
    props = first.get("properties") or {}
    push = props.get("PROP_CONSUME_TYPE") == "CONSUME_PASSIVELY"
    started = int(props.get("PROP_CONSUMER_START_TIMESTAMP") or 0)
    if not (push and time.time() * 1000 - started > 120_000):
        return True

    def subs(info: dict[str, Any]) -> list[tuple[str, str]]:
        return sorted(
            (str(s.get("topic")), str(s.get("subString"))) for s in info.get("subscriptionSet") or []
        )

    expected = subs(first)
    return bool(expected) and all(subs(i) == expected for i in infos.values())


def direct_result_text(result: dict[str, Any]) -> str:
    """ConsumeMessageDirectlyResult.toString."""
    return (
        f"ConsumeMessageDirectlyResult [order={_java(bool(result.get('order')))}, "
        f"autoCommit={_java(bool(result.get('autoCommit', True)))}, consumeResult={_java(result.get('consumeResult'))}, "
        f"remark={_java(result.get('remark'))}, spentTimeMills={int(result.get('spentTimeMills') or 0)}]"
    )


async def consume_directly(
    client: AdminClient, store_addr: str, group: str, client_id: str, offset_msg_id: str
) -> dict[str, Any]:
    """CONSUME_MESSAGE_DIRECTLY through the broker that stored the message."""
    fields = {"consumerGroup": group, "clientId": client_id, "msgId": offset_msg_id}
    resp = await invoke(
        client, store_addr, RequestCode.CONSUME_MESSAGE_DIRECTLY, fields, timeout=RELAY_TIMEOUT_S
    )
    return parse_body(resp, "CONSUME_MESSAGE_DIRECTLY")


async def consume_stats(
    client: AdminClient, addr: str, group: str, topic: str | None = None
) -> dict[str, Any]:
    """GET_CONSUME_STATS: ``offsetTable`` (MessageQueue -> OffsetWrapper) and ``consumeTps``;
    a broker that knows nothing of the group gives an empty table."""
    fields = {"consumerGroup": group, **({"topic": topic} if topic else {})}
    resp = await client.call(addr, RequestCode.GET_CONSUME_STATS, fields, ok=(0, ResponseCode.SYSTEM_ERROR))
    if resp.code != ResponseCode.SUCCESS:
        return {"offsetTable": {}, "consumeTps": 0.0}
    body = parse_body(resp, "GET_CONSUME_STATS")
    return {
        "offsetTable": mq_table(body.get("offsetTable"), "GET_CONSUME_STATS"),
        "consumeTps": float(body.get("consumeTps") or 0.0),
    }


# ---------------------------------------------------------------------- commands
@admin.command("consumerConnection")
@click.option("-g", "--consumerGroup", "group", required=True, help="Consumer group.")
@click.option("-b", "--brokerAddr", "broker", help="Ask this broker (host:port).")
@_run
async def consumer_connection_cmd(client: AdminClient, group: str, broker: str | None) -> None:
    """Query consumer's socket connection, client version and subscription."""
    cc = await consumer_connection(client, group, broker)
    click.echo(f"{'#ClientId':<36} {'#ClientAddr':<22} {'#Language':<10} #Version")
    for conn in sorted(cc.get("connectionSet") or [], key=lambda c: str(c.get("clientId"))):
        click.echo(
            f"{conn.get('clientId', ''):<36} {conn.get('clientAddr', ''):<22} {conn.get('language', ''):<10} "
            f"{version_desc(int(conn.get('version') or 0))}"
        )
    click.echo("\nBelow is subscription:")
    click.echo(f"{'#Topic':<20} #SubExpression")
    for topic, sd in sorted((cc.get("subscriptionTable") or {}).items()):
        click.echo(f"{sd.get('topic', topic):<20} {sd.get('subString', '')}")
    click.echo("")
    click.echo(f"ConsumeType: {cc.get('consumeType')}")
    click.echo(f"MessageModel: {cc.get('messageModel')}")
    click.echo(f"ConsumeFromWhere: {cc.get('consumeFromWhere')}")


@admin.command("consumerStatus")
@click.option("-g", "--consumerGroup", "group", required=True, help="Consumer group.")
@click.option("-i", "--clientId", "client_id", help="Only this client: print its running info.")
@click.option("-b", "--brokerAddr", "broker", help="Ask this broker for the connections (host:port).")
@click.option("-s", "--jstack", is_flag=True, help="Include every thread's stack of the consumer process.")
@_run
async def consumer_status_cmd(
    client: AdminClient, group: str, client_id: str | None, broker: str | None, jstack: bool
) -> None:
    """Query consumer's internal data structure (ConsumerRunningInfo), one client or all.

    Without -i, each client's info is also written to the file <now>/<clientId>, as mqadmin does."""
    if client_id:
        click.echo(format_running_info(await running_info(client, group, client_id, jstack)), nl=False)
        return
    cc = await consumer_connection(client, group, broker)
    now = int(time.time() * 1000)
    click.echo(f"{'#Index':<10} {'#ClientId':<40} {'#Version':<20} #ConsumerRunningInfoFile")
    infos: dict[str, dict[str, Any]] = {}
    for i, conn in enumerate(sorted(cc.get("connectionSet") or [], key=lambda c: str(c.get("clientId"))), 1):
        cid = str(conn.get("clientId"))
        try:
            info = await running_info(client, group, cid, jstack)
        except AdminError as exc:
            click.echo(f"{i:<10} {cid:<40} {'':<20} error: {exc}")
            continue
        infos[cid] = info
        path = Path(str(now)) / cid
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(format_running_info(info))
        click.echo(f"{i:<10} {cid:<40} {version_desc(int(conn.get('version') or 0)):<20} {path}")
    if not infos:
        return
    if same_subscription(infos):
        click.echo("\n\nSame subscription in the same group of consumer")
        click.echo("\n\nRebalance OK")
        for cid, info in sorted(infos.items()):
            click.echo(analyze_process_queues(cid, info), nl=False)
    else:
        click.echo("\n\nWARN: Different subscription in the same group of consumer!!!")


@admin.command("getConsumerStatus")
@click.option("-g", "--group", required=True, help="Consumer group.")
@click.option("-t", "--topic", required=True, help="Topic.")
@click.option("-i", "--originClientId", "client_id", default="", help="Only this client.")
@_run
async def get_consumer_status_cmd(client: AdminClient, group: str, topic: str, client_id: str) -> None:
    """Get consumer status from client: the offsets each client of the group holds for the topic
    (INVOKE_BROKER_TO_GET_CONSUMER_STATUS to the topic's first broker, which asks its clients)."""
    table = await consumer_status_table(client, group, topic, client_id)
    click.echo(f"get consumer status from client. group={group}, topic={topic}, originClientId={client_id}")
    click.echo(f"{'#clientId':<50}  {'#brokerName':<15}  {'#queueId':<15}  {'#offset':<20}")
    for cid, offsets in table.items():
        for mq, offset in offsets.items():
            click.echo(f"{cid:<50}  {mq.broker_name:<15}  {mq.queue_id:<15}  {offset:<20}")


async def consumer_status_table(
    client: AdminClient, group: str, topic: str, client_id: str = ""
) -> dict[str, dict[MessageQueue, int]]:
    """client id -> the offsets it reported (mqadmin's ``getConsumeStatus``: the route's first broker)."""
    route = await client.route(topic)
    addrs = route.addresses()
    if not addrs:
        return {}
    addr = addrs[sorted(addrs)[0]]
    fields = {"topic": topic, "group": group, "clientAddr": client_id}
    resp = await invoke(
        client, addr, RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS, fields, timeout=RELAY_TIMEOUT_S
    )
    body = mqjson.loads(resp.body or b"{}")
    return {
        str(cid): {mq: int(off) for mq, off in mqjson.mq_map(offsets).items()}
        for cid, offsets in (body.get("consumerTable") or {}).items()
    }


@admin.command("cloneGroupOffset")
@click.option("-s", "--srcGroup", "src", required=True, help="Source consumer group.")
@click.option("-d", "--destGroup", "dest", required=True, help="Destination consumer group.")
@click.option("-t", "--topic", required=True, help="Topic.")
@click.option("-o", "--offline", default="false", help="The group or the topic is offline [true|false].")
@_run
async def clone_group_offset_cmd(client: AdminClient, src: str, dest: str, topic: str, offline: str) -> None:
    """Clone offset from other group (CLONE_GROUP_OFFSET on each broker of the topic)."""
    route = await client.route(topic)
    fields = {
        "srcGroup": src,
        "destGroup": dest,
        "topic": topic,
        "offline": offline.strip().lower() == "true",
    }
    for _name, addr in sorted(route.addresses().items()):
        await client.call(addr, RequestCode.CLONE_GROUP_OFFSET, fields)
    click.echo(f"clone group offset success. srcGroup[{src}], destGroup=[{dest}], topic[{topic}]")


def parse_timestamp(text: str) -> int:
    """``now`` (-1), epoch milliseconds, or yyyy-MM-dd#HH:mm:ss:SSS in local time."""
    text = text.strip()
    if text == "now":
        return -1
    try:
        return int(text)
    except ValueError:
        pass
    try:
        dt = datetime.strptime(text, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise AdminError(
            f"timestamp {text!r} is not 'now', milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(dt.timestamp() * 1000)


def _force(text: str | None) -> bool:
    return True if text is None else text.strip().lower() == "true"


async def reset_by_broker(
    client: AdminClient, topic: str, group: str, timestamp: int, force: bool, cpp: bool = False
) -> dict[MessageQueue, int] | None:
    """INVOKE_BROKER_TO_RESET_OFFSET on each broker of ``topic``; None when the group is not online."""
    route = await client.route(topic)
    fields = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
    table: dict[MessageQueue, int] = {}
    for _name, addr in sorted(route.addresses().items()):
        resp = await invoke(
            client,
            addr,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
            fields,
            ok=(0, ResponseCode.CONSUMER_NOT_ONLINE),
            language="CPP" if cpp else None,
        )
        if resp.code == ResponseCode.CONSUMER_NOT_ONLINE:
            return None
        body = parse_body(resp, "INVOKE_BROKER_TO_RESET_OFFSET")
        table.update(
            {
                mq: int(v)
                for mq, v in mq_table(body.get("offsetTable"), "INVOKE_BROKER_TO_RESET_OFFSET").items()
            }
        )
    return table


async def reset_offline(
    client: AdminClient, group: str, topic: str, timestamp: int, force: bool
) -> list[list[Any]]:
    """resetOffsetByTimestampOld: commit offsets by time directly (the group is not online).

    Rows: broker name, queue id, broker offset, consumer offset, offset by time, offset now."""
    route = await client.route(topic)
    addrs = route.addresses()
    read_queues = {q.broker_name: q.read_queue_nums for q in route.queue_datas}
    rows: list[list[Any]] = []
    for name, addr in sorted(addrs.items()):
        stats = (await consume_stats(client, addr, group))["offsetTable"]
        queues = {
            mq: (int(w["brokerOffset"]), int(w["consumerOffset"]))
            for mq, w in stats.items()
            if mq.topic == topic
        }
        if not queues:  # never consumed here: from each queue's start
            resp = await client.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
            topic_stats = mq_table(
                parse_body(resp, "GET_TOPIC_STATS_INFO").get("offsetTable"), "GET_TOPIC_STATS_INFO"
            )
            for qid in range(read_queues.get(name, 0)):
                ts = topic_stats.get(MessageQueue(topic, name, qid)) or {}
                queues[MessageQueue(topic, name, qid)] = (
                    int(ts.get("maxOffset", 0)),
                    int(ts.get("minOffset", 0)),
                )
        for mq, (broker_off, consumer_off) in sorted(queues.items()):
            q = {"topic": topic, "queueId": mq.queue_id}
            if timestamp == -1:
                resp = await client.call(addr, RequestCode.GET_MAX_OFFSET, q)
            else:
                resp = await client.call(
                    addr, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {**q, "timestamp": timestamp}
                )
            target = int(resp.ext_fields.get("offset", 0))
            now = consumer_off
            if force or target <= consumer_off:
                now = target
                fields = {"consumerGroup": group, **q, "commitOffset": target}
                await client.call(addr, RequestCode.UPDATE_CONSUMER_OFFSET, fields)
            rows.append([mq.broker_name, mq.queue_id, broker_off, consumer_off, target, now])
    return rows


def _print_rollback(rows: list[list[Any]]) -> None:
    heads = [
        "#brokerName",
        "#queueId",
        "#brokerOffset",
        "#consumerOffset",
        "#timestampOffset",
        "#rollbackOffset",
    ]
    click.echo("  ".join(f"{h:<20}" for h in heads).rstrip())
    for r in rows:
        click.echo("  ".join(f"{str(v)[:32]:<20}" for v in r).rstrip())


def _print_offsets(table: dict[MessageQueue, int]) -> None:
    click.echo(f"{'#brokerName':<40}  {'#queueId':<40}  {'#offset':<40}".rstrip())
    for mq, offset in sorted(table.items()):
        click.echo(f"{mq.broker_name[:32]:<40}  {mq.queue_id:<40}  {offset:<40}".rstrip())


@admin.command("resetOffsetByTime")
@click.option("-g", "--group", required=True, help="Consumer group.")
@click.option("-t", "--topic", required=True, help="Topic.")
@click.option("-s", "--timestamp", "when", required=True, help="now | milliseconds | yyyy-MM-dd#HH:mm:ss:SSS")
@click.option("-f", "--force", default=None, help="Also move offsets forward [true|false] (default true).")
@click.option("-c", "--cplus", is_flag=True, help="Ask as a C++ admin (clients get the list-form body).")
@_run
async def reset_offset_by_time_cmd(
    client: AdminClient, group: str, topic: str, when: str, force: str | None, cplus: bool
) -> None:
    """Reset consumer offset by timestamp (without client restart)."""
    timestamp = parse_timestamp(when)
    forced = _force(force)
    table = await reset_by_broker(client, topic, group, timestamp, forced, cplus)
    if table is None:  # nobody online to tell: commit the offsets ourselves
        rows = await reset_offline(client, group, topic, timestamp, forced)
        click.echo(
            f"rollback consumer offset by specified consumerGroup[{group}], topic[{topic}], force[{_java(forced)}], "
            f"timestamp(string)[{when}], timestamp(long)[{timestamp}]"
        )
        _print_rollback(rows)
        return
    click.echo(
        f"rollback consumer offset by specified group[{group}], topic[{topic}], force[{_java(forced)}], "
        f"timestamp(string)[{when}], timestamp(long)[{timestamp}]"
    )
    _print_offsets(table)


@admin.command("skipAccumulatedMessage")
@click.option("-g", "--group", required=True, help="Consumer group.")
@click.option("-t", "--topic", required=True, help="Topic.")
@click.option("-f", "--force", default=None, help="[true|false] (default true).")
@_run
async def skip_accumulated_cmd(client: AdminClient, group: str, topic: str, force: str | None) -> None:
    """Skip all messages that are accumulated (not consumed) currently."""
    forced = _force(force)
    table = await reset_by_broker(client, topic, group, -1, forced)
    if table is None:
        _print_rollback(await reset_offline(client, group, topic, -1, forced))
        return
    _print_offsets(table)


@admin.command("allocateMQ")
@click.option("-t", "--topic", required=True, help="Topic.")
@click.option("-i", "--ipList", "ips", required=True, help="Consumer ids, comma separated.")
@_run
async def allocate_mq_cmd(client: AdminClient, topic: str, ips: str) -> None:
    """Allocate MQ: how AllocateMessageQueueAveragely spreads the topic's queues over these consumers."""
    from tidemq.plugins import get_plugin_manager

    ids = ips.strip().split(",")
    queues = sorted((await client.route(topic)).subscribe_queues())
    strategy = get_plugin_manager().create("allocate", "averagely")
    result = {cid: [mqjson.mq_to_json(mq) for mq in strategy.allocate("aa", cid, queues, ids)] for cid in ids}
    click.echo(orjson.dumps({"result": result}).decode())
