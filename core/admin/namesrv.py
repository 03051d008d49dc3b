"""mqadmin's NameServer commands: KV and order config, NameServer config, broker write permission, topic clusters.

updateKvConfig, deleteKvConfig, updateOrderConf, getNamesrvConfig, updateNamesrvConfig,
wipeWritePerm, addWritePerm, topicClusterList and updateTopicPerm.  Writes go to every NameServer
of ``-n`` (NameServers do not replicate each other), as mqadmin's do; reads ask them in turn.
"""

from __future__ import annotations

from typing import Any

import click

from tidemq.admin._common import _run, admin
from tidemq.client.admin import AdminClient, AdminError, NoRouteError, topic_fields
from tidemq.client.route import loads_lenient
from tidemq.perm import PERM_READ, PERM_WRITE, is_inherited, is_readable, is_writeable
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.protocol import NAMESPACE_ORDER_TOPIC_CONFIG

# ---------------------------------------------------------------------------- requests


async def put_kv_config(client: AdminClient, namespace: str, key: str, value: str) -> None:
    """PUT_KV_CONFIG on every NameServer (MQClientAPIImpl.putKVConfigValue); the last refusal is raised."""
    fields = {"namespace": namespace, "key": key, "value": value}
    await _every_namesrv(client, RequestCode.PUT_KV_CONFIG, fields)


async def delete_kv_config(client: AdminClient, namespace: str, key: str) -> None:
    """DELETE_KV_CONFIG on every NameServer."""
    await _every_namesrv(client, RequestCode.DELETE_KV_CONFIG, {"namespace": namespace, "key": key})


async def _every_namesrv(
    client: AdminClient, code: int, fields: dict[str, Any], body: bytes | None = None
) -> None:
    error: AdminError | None = None
    for addr in client.namesrv:
        try:
            await client.call(addr, code, fields, body)
        except AdminError as exc:  # the others still get the change, as in mqadmin
            error = exc
    if error is not None:
        raise error


async def get_kv_config(client: AdminClient, namespace: str, key: str) -> str | None:
    """GET_KV_CONFIG from the first NameServer that answers; None when it has no such key."""
    resp = await client.namesrv_call(
        RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}, ok=(0, ResponseCode.QUERY_NOT_FOUND)
    )
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return (resp.ext_fields or {}).get("value")


def merge_order_conf(old: str | None, entry: str) -> str:
    """DefaultMQAdminExtImpl.createOrUpdateOrderConf for one broker: ``entry`` (``broker:n``) replaces
    that broker's part of ``old`` (``a:n;b:m``), the other brokers' parts stay."""
    parts: dict[str, str] = {}
    for item in (old or "").split(";"):
        if item.strip():
            parts[item.split(":")[0]] = item
    parts[entry.split(":")[0]] = entry
    return ";".join(parts.values())


async def broker_name_of(client: AdminClient, addr: str) -> str:
    """The name of the broker at ``addr`` (CommandUtil.fetchBrokerNameByAddr)."""
    info = await client.cluster_info()
    for name, data in (info.get("brokerAddrTable") or {}).items():
        if addr in ((data or {}).get("brokerAddrs") or {}).values():
            return str(name)
    raise AdminError(f"no broker at {addr} is registered with the NameServer")


async def cluster_broker_names(client: AdminClient, cluster: str) -> list[str]:
    """The broker names of a cluster (CommandUtil.fetchBrokerNameByClusterName)."""
    info = await client.cluster_info()
    names = (info.get("clusterAddrTable") or {}).get(cluster)
    if not names:
        raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
    return sorted(str(n) for n in names)


async def raw_route(client: AdminClient, topic: str) -> dict[str, Any]:
    """GET_ROUTEINFO_BY_TOPIC's body as a dict (topicSynFlag and orderTopicConf included)."""
    resp = await client.namesrv_call(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, ok=(0, ResponseCode.TOPIC_NOT_EXIST)
    )
    if resp.code == ResponseCode.TOPIC_NOT_EXIST or not resp.body:
        raise NoRouteError(f"no route for topic {topic!r}: {resp.remark or 'the topic does not exist'}")
    try:
        data = loads_lenient(resp.body)
    except ValueError as exc:
        raise AdminError(
            f"the NameServer answered GET_ROUTEINFO_BY_TOPIC with a body that is not JSON: {exc}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("queueDatas") or [], list):
        raise AdminError("the NameServer answered GET_ROUTEINFO_BY_TOPIC with an unreadable route")
    return data


def _num(queue: dict[str, Any], key: str, default: int = 0) -> int:
    try:
        return int(queue.get(key, default))
    except (TypeError, ValueError):
        raise AdminError(f"the route holds {key} = {queue.get(key)!r}, not a number") from None


def perm_to_string(perm: int) -> str:
    """PermName.perm2String: ``RW-``, ``R--``, ``-W-``, with ``X`` for inherit."""
    return (
        ("R" if is_readable(perm) else "-")
        + ("W" if is_writeable(perm) else "-")
        + ("X" if is_inherited(perm) else "-")
    )


def topic_config_string(
    topic: str,
    read_queues: int,
    write_queues: int,
    perm: int,
    sys_flag: int = 0,
    order: bool = False,
    attributes: dict[str, str] | None = None,
) -> str:
    """TopicConfig.toString, as mqadmin prints it (RocketMQ 5's attributes when there are some)."""
    attrs = (
        ", attributes={" + ", ".join(f"{k}={v}" for k, v in attributes.items()) + "}" if attributes else ""
    )
    return (
        f"TopicConfig [topicName={topic}, readQueueNums={read_queues}, writeQueueNums={write_queues}, "
        f"perm={perm_to_string(perm)}, topicFilterType=SINGLE_TAG, topicSysFlag={sys_flag}, "
        f"order={'true' if order else 'false'}{attrs}]"
    )


def java_bool(value: str | None) -> bool:
    """Boolean.parseBoolean: only ``true`` (any case) is true."""
    return (value or "").strip().lower() == "true"


# ---------------------------------------------------------------------------- KV config
@admin.command("updateKvConfig")
@click.option("-s", "--namespace", required=True, help="The namespace.")
@click.option("-k", "--key", required=True, help="The key.")
@click.option("-v", "--value", required=True, help="The value.")
@_run
async def update_kv_config(client: AdminClient, namespace: str, key: str, value: str) -> None:
    """Create or update a KV config entry on every NameServer."""
    await put_kv_config(client, namespace.strip(), key.strip(), value.strip())
    click.echo("create or update kv config to namespace success.")


@admin.command("deleteKvConfig")
@click.option("-s", "--namespace", required=True, help="The namespace.")
@click.option("-k", "--key", required=True, help="The key.")
@_run
async def delete_kv_config_cmd(client: AdminClient, namespace: str, key: str) -> None:
    """Delete a KV config entry from every NameServer."""
    await delete_kv_config(client, namespace.strip(), key.strip())
    click.echo("delete kv config from namespace success.")


@admin.command("updateOrderConf")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-v", "--orderConf", "order_conf", help="Order conf for put: brokerName1:num;brokerName2:num.")
@click.option(
    "-m", "--method", required=True, type=click.Choice(["put", "get", "delete"]), help="put, get or delete."
)
@_run
async def update_order_conf(client: AdminClient, topic: str, order_conf: str | None, method: str) -> None:
    """Create, show or delete a topic's global-order conf (KV namespace ORDER_TOPIC_CONFIG)."""
    topic = topic.strip()
    if method == "get":
        conf = await get_kv_config(client, NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        if conf is None:
            raise AdminError(f"no orderConf for topic {topic} (KV namespace {NAMESPACE_ORDER_TOPIC_CONFIG})")
        click.echo(f"get orderConf success. topic=[{topic}], orderConf=[{conf}]")
    elif method == "put":
        conf = (order_conf or "").strip()
        if not conf:
            raise click.UsageError("please set orderConf with option -v.")
        for part in conf.split(";"):
            name, sep, count = part.partition(":")
            if not name.strip() or not sep or not count.strip().isdigit():
                raise click.UsageError(f"orderConf part {part!r} is not brokerName:queueNums")
        await put_kv_config(client, NAMESPACE_ORDER_TOPIC_CONFIG, topic, conf)
        click.echo(f"update orderConf success. topic=[{topic}], orderConf=[{conf}]")
    else:
        await delete_kv_config(client, NAMESPACE_ORDER_TOPIC_CONFIG, topic)
        click.echo(f"delete orderConf success. topic=[{topic}]")


# ---------------------------------------------------------------------------- NameServer config
@admin.command("getNamesrvConfig")
@_run
async def get_namesrv_config(client: AdminClient) -> None:
    """Print every NameServer's configuration."""
    for addr in client.namesrv:
        resp = await client.call(addr, RequestCode.GET_NAMESRV_CONFIG)
        try:
            text = resp.payload().decode("utf-8")
        except UnicodeDecodeError:
            raise AdminError(f"{addr} answered GET_NAMESRV_CONFIG with a body that is not UTF-8") from None
        click.echo(f"============{addr}============")
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if sep and not line.lstrip().startswith("#"):
                click.echo(f"{key:<50}=  {value}")


@admin.command("updateNamesrvConfig")
@click.option("-k", "--key", required=True, help="Config key (tidemq's or RocketMQ's name).")
@click.option("-v", "--value", required=True, help="Config value.")
@_run
async def update_namesrv_config(client: AdminClient, key: str, value: str) -> None:
    """Change a NameServer setting at run time on every NameServer of -n."""
    key, value = key.strip(), value.strip()
    await _every_namesrv(client, RequestCode.UPDATE_NAMESRV_CONFIG, {}, f"{key}={value}\n".encode())
    click.echo(f"update name server config success![{', '.join(client.namesrv)}]")
    click.echo(f"{key} : {value}")


# ---------------------------------------------------------------------------- write permission
async def _write_perm(client: AdminClient, broker_name: str, wipe: bool) -> None:
    code = RequestCode.WIPE_WRITE_PERM_OF_BROKER if wipe else RequestCode.ADD_WRITE_PERM_OF_BROKER
    verb, count_field = ("wipe", "wipeTopicCount") if wipe else ("add", "addTopicCount")
    failed: list[str] = []
    for addr in client.namesrv:
        try:
            resp = await client.call(addr, code, {"brokerName": broker_name})
            count = int((resp.ext_fields or {}).get(count_field, 0))
        except (AdminError, ValueError) as exc:
            click.echo(f"{verb} write perm of broker[{broker_name}] in name server[{addr}] Failed")
            failed.append(f"{addr}: {exc}")
            continue
        click.echo(f"{verb} write perm of broker[{broker_name}] in name server[{addr}] OK, {count}")
    if failed:
        raise AdminError(f"{verb} write perm failed on {len(failed)} NameServer(s): {'; '.join(failed)}")


@admin.command("wipeWritePerm")
@click.option("-b", "--brokerName", "broker_name", required=True, help="Broker name.")
@_run
async def wipe_write_perm(client: AdminClient, broker_name: str) -> None:
    """Take a broker out of writes: clear the write permission of its topics on every NameServer."""
    await _write_perm(client, broker_name.strip(), wipe=True)


@admin.command("addWritePerm")
@click.option("-b", "--brokerName", "broker_name", required=True, help="Broker name.")
@_run
async def add_write_perm(client: AdminClient, broker_name: str) -> None:
    """Give a broker's topics read and write permission again on every NameServer."""
    await _write_perm(client, broker_name.strip(), wipe=False)


# ---------------------------------------------------------------------------- topics
@admin.command("topicClusterList")
@click.option("-t", "--topic", required=True, help="Topic name.")
@_run
async def topic_cluster_list(client: AdminClient, topic: str) -> None:
    """Print the clusters whose brokers serve the topic."""
    route = await client.route(topic.strip())
    names = {b.broker_name for b in route.broker_datas}
    info = await client.cluster_info()
    for cluster, brokers in sorted((info.get("clusterAddrTable") or {}).items()):
        if names & set(brokers or []):
            click.echo(cluster)


@admin.command("updateTopicPerm")
@click.option("-b", "--brokerAddr", "broker_addr", help="Update on this master (host:port).")
@click.option("-c", "--clusterName", "cluster", help="Update on every master of this cluster.")
@click.option("-t", "--topic", required=True, help="Topic name.")
@click.option("-p", "--perm", required=True, type=int, help="2 write, 4 read, 6 read+write.")
@_run
async def update_topic_perm(
    client: AdminClient, broker_addr: str | None, cluster: str | None, topic: str, perm: int
) -> None:
    """Change a topic's permission, keeping its queue counts."""
    if perm not in (PERM_WRITE, PERM_READ, PERM_READ | PERM_WRITE):
        raise click.BadParameter(f"{perm} is not 2 (W), 4 (R) or 6 (RW)", param_hint="'-p'")
    if not broker_addr and not cluster:
        raise click.UsageError("give -b/--brokerAddr or -c/--clusterName")
    topic = topic.strip()
    route = await raw_route(client, topic)
    queues = [q for q in route.get("queueDatas") or [] if isinstance(q, dict)]
    if not queues:
        raise AdminError(f"the route of topic {topic} has no queues")
    first = queues[0]
    read_queues, write_queues = _num(first, "readQueueNums"), _num(first, "writeQueueNums")
    sys_flag, old_perm = _num(first, "topicSynFlag"), _num(first, "perm")
    # mqadmin sends order=false; the route's orderTopicConf says whether the topic is ordered.
    order = bool(route.get("orderTopicConf"))
    fields = topic_fields(topic, read_queues, write_queues, perm, sys_flag, order)
    shown = topic_config_string(topic, read_queues, write_queues, perm, sys_flag, order)
    if broker_addr:
        broker_addr = broker_addr.strip()
        name = None
        for data in route.get("brokerDatas") or []:
            if not isinstance(data, dict) or not isinstance(data.get("brokerAddrs"), dict):
                continue
            addrs = {str(k): v for k, v in data["brokerAddrs"].items()}
            if addrs.get("0") == broker_addr:
                name = data.get("brokerName")
        if name is None:
            raise AdminError(f"updateTopicPerm error broker not exit or broker is not master!: {broker_addr}")
        mine = next((q for q in queues if q.get("brokerName") == name), first)
        old_perm = _num(mine, "perm", 0)
        fields["readQueueNums"] = _num(mine, "readQueueNums", read_queues)
        fields["writeQueueNums"] = _num(mine, "writeQueueNums", write_queues)
        if perm == old_perm:
            click.echo("new perm equals to the old one!")
            return
        await client.call(broker_addr, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
        click.echo(f"update topic perm from {old_perm} to {perm} in {broker_addr} success.")
        click.echo(
            topic_config_string(
                topic, int(fields["readQueueNums"]), int(fields["writeQueueNums"]), perm, sys_flag, order
            )
            + "."
        )
        return
    assert cluster is not None
    masters = await client.masters(cluster.strip())
    for name, addr in sorted(masters.items()):
        # Each master keeps its own queue counts (mqadmin sends the first broker's to all).
        mine = next((q for q in queues if q.get("brokerName") == name), first)
        counts = {
            "readQueueNums": _num(mine, "readQueueNums", 0),
            "writeQueueNums": _num(mine, "writeQueueNums", 0),
        }
        await client.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {**fields, **counts})
        click.echo(f"update topic perm from {_num(mine, 'perm', old_perm)} to {perm} in {addr} success.")
    click.echo(shown)
