"""mqadmin's subscription-group, broker-config, maintenance and export commands.

updateSubGroup, deleteSubGroup, getConsumerConfig, updateBrokerConfig, getBrokerConfig,
cleanExpiredCQ, deleteExpiredCommitLog, cleanUnusedTopic, exportMetadata, exportConfigs: mqadmin
4.9's names, flags and output.  Where mqadmin prints its help (neither ``-b`` nor ``-c``) or
nothing (getConsumerConfig of an unknown group), these print one error line and exit 1.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import orjson

from tidemq.admin._common import _run, admin
from tidemq.client.admin import AdminClient, AdminError
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.errors import BodyError
from tidemq.remoting.protocol import TopicList, loads

DEFAULT_EXPORT_PATH = "/tmp/rocketmq/export"
#: SubscriptionGroupConfig's fields in Java's declaration order (getConsumerConfig, toString).
GROUP_FIELDS = (
    "groupName",
    "consumeEnable",
    "consumeFromMinEnable",
    "consumeBroadcastEnable",
    "retryQueueNums",
    "retryMaxTimes",
    "brokerId",
    "whichBrokerWhenConsumeSlowly",
    "notifyConsumerIdsChangedEnable",
)
#: Groups mqadmin's getUserSubscriptionGroup leaves out (DefaultMQAdminExtImpl.SYSTEM_GROUP_SET).
SYSTEM_GROUPS = frozenset(
    {
        "DEFAULT_CONSUMER",
        "DEFAULT_PRODUCER",
        "TOOLS_CONSUMER",
        "FILTERSRV_CONSUMER",
        "__MONITOR_CONSUMER",
        "CLIENT_INNER_PRODUCER",
        "SELF_TEST_P_GROUP",
        "SELF_TEST_C_GROUP",
        "CID_ONS-HTTP-PROXY",
        "CID_ONSAPI_PERMISSION",
        "CID_ONSAPI_OWNER",
        "CID_ONSAPI_PULL",
        "CID_RMQ_SYS_TRANS",
    }
)
#: The broker keys exportConfigs keeps (ExportConfigsCommand.needBrokerProprties).
EXPORTED_BROKER_KEYS = (
    "brokerClusterName",
    "brokerId",
    "brokerName",
    "brokerRole",
    "fileReservedTime",
    "filterServerNums",
    "flushDiskType",
    "maxMessageSize",
    "messageDelayLevel",
    "msgTraceTopicName",
    "slaveReadEnable",
    "traceOn",
    "traceTopicEnable",
    "useTLS",
    "autoCreateTopicEnable",
    "autoCreateSubscriptionGroup",
)


# ---------------------------------------------------------------------------- shared
def _java(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _bool(text: str) -> bool:
    """Java's Boolean.parseBoolean, as mqadmin reads its true/false flags."""
    return text.strip().lower() == "true"


def _int(text: str, flag: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise AdminError(f"{flag} must be an integer, got {text!r}") from None


async def _brokers(client: AdminClient) -> list[tuple[str, str, dict[int, str]]]:
    """(cluster, broker name, broker id -> address) of every broker the NameServers know."""
    info = await client.cluster_info()
    cluster_of = {
        name: cluster
        for cluster, names in (info.get("clusterAddrTable") or {}).items()
        for name in names or []
    }
    out = []
    for name, bd in sorted((info.get("brokerAddrTable") or {}).items()):
        addrs = {int(k): str(v) for k, v in (bd.get("brokerAddrs") or {}).items()}
        out.append((cluster_of.get(name, bd.get("cluster", "")), name, addrs))
    return out


async def _cluster_addrs(client: AdminClient, cluster: str | None) -> list[str]:
    """Every broker address (masters and slaves) of ``cluster``, of every cluster when None."""
    brokers = await _brokers(client)
    if cluster and not any(c == cluster for c, _, _ in brokers):
        raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
    return [
        addr for c, _, addrs in brokers if not cluster or c == cluster for _, addr in sorted(addrs.items())
    ]


async def _targets(client: AdminClient, broker_addr: str | None, cluster: str | None) -> list[str]:
    """``-b`` alone, else the masters of ``-c``; one of them is required."""
    if broker_addr:
        return [broker_addr.strip()]
    if cluster:
        masters = await client.masters(cluster.strip())
        if not masters:
            raise AdminError(f"cluster {cluster!r} has no master")
        return sorted(masters.values())
    raise AdminError("give -b (a broker address) or -c (a cluster name)")


def _json_body(body: bytes | None, what: str, addr: str) -> dict[str, Any]:
    try:
        data = loads(body)
    except BodyError as exc:
        raise AdminError(f"{addr} answered {what} with a body that is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AdminError(f"{addr} answered {what} with {type(data).__name__}, not a JSON object")
    return data


def _table_of(data: dict[str, Any], key: str, addr: str) -> dict[str, dict[str, Any]]:
    table = data.get(key) or {}
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise AdminError(f"{addr} answered with a {key} that is not a map of objects")
    return table


async def all_groups(client: AdminClient, addr: str) -> dict[str, Any]:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: the broker's SubscriptionGroupWrapper."""
    resp = await client.call(addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    data = _json_body(resp.body, "GET_ALL_SUBSCRIPTIONGROUP_CONFIG", addr)
    _table_of(data, "subscriptionGroupTable", addr)
    return data


async def all_topics(client: AdminClient, addr: str) -> dict[str, Any]:
    """GET_ALL_TOPIC_CONFIG: the broker's TopicConfigSerializeWrapper."""
    resp = await client.call(addr, RequestCode.GET_ALL_TOPIC_CONFIG)
    data = _json_body(resp.body, "GET_ALL_TOPIC_CONFIG", addr)
    _table_of(data, "topicConfigTable", addr)
    return data


async def system_topics(client: AdminClient, addr: str) -> set[str]:
    resp = await client.call(addr, RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_BROKER)
    try:
        return set(TopicList.decode(resp.body).topic_list)
    except BodyError as exc:
        raise AdminError(f"{addr} answered GET_SYSTEM_TOPIC_LIST_FROM_BROKER with {exc}") from None


async def broker_config(client: AdminClient, addr: str) -> dict[str, str]:
    """GET_BROKER_CONFIG: the broker's properties, in the order it sent them."""
    resp = await client.call(addr, RequestCode.GET_BROKER_CONFIG)
    try:
        text = (resp.body or b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AdminError(f"{addr} answered GET_BROKER_CONFIG with a body that is not text: {exc}") from None
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise AdminError(
                f"{addr} answered GET_BROKER_CONFIG with a line that is not key=value: {line[:80]!r}"
            )
        out[key.strip()] = value.strip()
    return out


def _group_to_string(cfg: dict[str, Any]) -> str:
    """SubscriptionGroupConfig.toString()."""
    return "SubscriptionGroupConfig [" + ", ".join(f"{f}={_java(cfg.get(f))}" for f in GROUP_FIELDS) + "]"


def _write(path: Path, value: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    except OSError as exc:
        raise AdminError(f"cannot write {path}: {exc}") from None


# ---------------------------------------------------------------------------- subscription groups
@admin.command("updateSubGroup")
@click.option("-b", "--brokerAddr", "broker_addr", help="Create the group on this broker.")
@click.option("-c", "--clusterName", "cluster", help="Create the group on every master of this cluster.")
@click.option("-g", "--groupName", "group", required=True, help="Consumer group name.")
@click.option("-s", "--consumeEnable", "consume_enable", help="true/false: the group may pull.")
@click.option("-m", "--consumeFromMinEnable", "from_min", help="true/false (default false).")
@click.option("-d", "--consumeBroadcastEnable", "broadcast", help="true/false (default false).")
@click.option("-q", "--retryQueueNums", "retry_queues", help="Queues of the group's retry topic (default 1).")
@click.option("-r", "--retryMaxTimes", "retry_max", help="Redeliveries before the DLQ (default 16).")
@click.option("-i", "--brokerId", "broker_id", help="Broker id the group consumes from (default 0).")
@click.option(
    "-w", "--whichBrokerWhenConsumeSlowly", "slow_broker", help="Broker id when consuming slowly (default 1)."
)
@click.option("-a", "--notifyConsumerIdsChanged", "notify", help="true/false: tell consumers of rebalances.")
@click.option(
    "-o", "--consumeMessageOrderly", "orderly", help="true/false: POP delivers each queue in order (FIFO)."
)
@_run
async def update_sub_group(
    client: AdminClient,
    broker_addr: str | None,
    cluster: str | None,
    group: str,
    consume_enable: str | None,
    from_min: str | None,
    broadcast: str | None,
    retry_queues: str | None,
    retry_max: str | None,
    broker_id: str | None,
    slow_broker: str | None,
    notify: str | None,
    orderly: str | None,
) -> None:
    """Create a consumer group or change its settings (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)."""
    # mqadmin starts from SubscriptionGroupConfig's defaults but with broadcast and from-min off.
    cfg: dict[str, Any] = {
        "groupName": group.strip(),
        "consumeEnable": True,
        "consumeFromMinEnable": False,
        "consumeBroadcastEnable": False,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    for key, value in (
        ("consumeEnable", consume_enable),
        ("consumeFromMinEnable", from_min),
        ("consumeBroadcastEnable", broadcast),
        ("notifyConsumerIdsChangedEnable", notify),
        ("consumeMessageOrderly", orderly),
    ):
        if value is not None:
            cfg[key] = _bool(value)
    for key, value, flag in (
        ("retryQueueNums", retry_queues, "-q"),
        ("retryMaxTimes", retry_max, "-r"),
        ("brokerId", broker_id, "-i"),
        ("whichBrokerWhenConsumeSlowly", slow_broker, "-w"),
    ):
        if value is not None:
            cfg[key] = _int(value, flag)
    targets = await _targets(client, broker_addr, cluster)
    body = orjson.dumps(cfg)
    for addr in targets:
        await client.call(addr, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        click.echo(f"create subscription group to {addr} success.")
    click.echo(_group_to_string(cfg))


@admin.command("setConsumeMode")
@click.option("-b", "--brokerAddr", "broker_addr", help="Set the mode on this broker.")
@click.option("-c", "--clusterName", "cluster", help="Set the mode on every master of this cluster.")
@click.option("-t", "--topicName", "topic", required=True, help="Topic name.")
@click.option("-g", "--groupName", "group", required=True, help="Consumer group name.")
@click.option("-m", "--mode", "mode", required=True, help="PULL or POP.")
@click.option(
    "-q", "--popShareQueueNum", "share", default="0", help="POP: queues shared per client (0: all)."
)
@_run
async def set_consume_mode(
    client: AdminClient,
    broker_addr: str | None,
    cluster: str | None,
    topic: str,
    group: str,
    mode: str,
    share: str,
) -> None:
    """Set a group's request mode on a topic, PULL or POP (SET_MESSAGE_REQUEST_MODE, RocketMQ 5)."""
    mode = mode.strip().upper()
    if mode not in ("PULL", "POP"):
        raise AdminError(f"-m {mode!r}: choose PULL or POP")
    body = orjson.dumps(
        {
            "topic": topic.strip(),
            "consumerGroup": group.strip(),
            "mode": mode,
            "popShareQueueNum": _int(share, "-q"),
        }
    )
    for addr in await _targets(client, broker_addr, cluster):
        await client.call(addr, RequestCode.SET_MESSAGE_REQUEST_MODE, body=body)
        click.echo(f"set consume mode to {addr} success.")
    click.echo(
        f"topic[{topic.strip()}] group[{group.strip()}] consume mode[{mode}] popShareQueueNum[{share}]"
    )


@admin.command("deleteSubGroup")
@click.option("-b", "--brokerAddr", "broker_addr", help="Delete the group from this broker.")
@click.option(
    "-c",
    "--clusterName",
    "cluster",
    help="Delete from every master of this cluster (and its retry/DLQ topics).",
)
@click.option("-g", "--groupName", "group", required=True, help="Subscription group name.")
@click.option(
    "-r", "--removeOffset", "remove_offset", default="false", help="true: forget the group's offsets too."
)
@_run
async def delete_sub_group(
    client: AdminClient, broker_addr: str | None, cluster: str | None, group: str, remove_offset: str
) -> None:
    """Delete a consumer group's settings (DELETE_SUBSCRIPTIONGROUP)."""
    group = group.strip()
    fields = {"groupName": group, "removeOffset": _bool(remove_offset)}
    targets = await _targets(client, broker_addr, cluster)
    for addr in targets:
        await client.call(addr, RequestCode.DELETE_SUBSCRIPTIONGROUP, fields)
        if broker_addr:
            click.echo(f"delete subscription group [{group}] from broker [{addr}] success.")
        else:
            click.echo(
                f"delete subscription group [{group}] from broker [{addr}] in cluster [{cluster}] success."
            )
    if cluster and not broker_addr:
        # mqadmin also deletes the group's retry and dead-letter topics from the cluster.
        for topic in (f"%RETRY%{group}", f"%DLQ%{group}"):
            for addr in targets:
                await client.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
            click.echo(f"delete topic [{topic}] from cluster [{cluster}] success.")
            for ns in client.namesrv:
                await client.call(ns, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic})
            click.echo(f"delete topic [{topic}] from NameServer success.")


@admin.command("getConsumerConfig")
@click.option("-g", "--groupName", "group", required=True, help="Subscription group name.")
@_run
async def get_consumer_config(client: AdminClient, group: str) -> None:
    """A consumer group's settings on every broker that has it."""
    group = group.strip()
    found = 0
    for cluster, name, addrs in await _brokers(client):
        if not addrs:
            continue
        addr = addrs.get(0) or addrs[min(addrs)]  # BrokerData.selectBrokerAddr: the master if any
        cfg = (await all_groups(client, addr))["subscriptionGroupTable"].get(group)
        if cfg is None:
            continue
        found += 1
        click.echo(f"============================={cluster}:{name}=============================")
        for field in GROUP_FIELDS:
            value = cfg.get(field)
            click.echo(f"{field:<40}=  {'' if value is None else _java(value)}")
    if not found:
        raise AdminError(f"no broker has subscription group {group!r}")


# ---------------------------------------------------------------------------- broker configuration
@admin.command("updateBrokerConfig")
@click.option("-b", "--brokerAddr", "broker_addr", help="Update this broker.")
@click.option("-c", "--clusterName", "cluster", help="Update every master of this cluster.")
@click.option("-k", "--key", required=True, help="Config key (RocketMQ's name, e.g. slaveReadEnable).")
@click.option("-v", "--value", required=True, help="New value.")
@_run
async def update_broker_config(
    client: AdminClient, broker_addr: str | None, cluster: str | None, key: str, value: str
) -> None:
    """Change a broker option on running brokers (UPDATE_BROKER_CONFIG); kept across restarts."""
    body = f"{key.strip()}={value.strip()}\n".encode()
    failed = []
    for addr in await _targets(client, broker_addr, cluster):
        try:
            await client.call(addr, RequestCode.UPDATE_BROKER_CONFIG, body=body)
        except AdminError as exc:
            if broker_addr:
                raise
            click.echo(f"update broker config failed, {addr}: {exc}", err=True)  # mqadmin goes on
            failed.append(addr)
            continue
        click.echo(f"update broker config success, {addr}")
    if failed:
        raise AdminError(f"the config of {', '.join(failed)} was not updated")


async def _print_config(client: AdminClient, title: str, addr: str) -> None:
    props = await broker_config(client, addr)
    click.echo(title)
    if not props:
        click.echo(f"Broker[{addr}] has no config property!")
        return
    for key, value in props.items():
        click.echo(f"{key:<50}=  {value}")
    click.echo("")


@admin.command("getBrokerConfig")
@click.option("-b", "--brokerAddr", "broker_addr", help="Get this broker's config.")
@click.option("-c", "--clusterName", "cluster", help="Get the config of every broker of this cluster.")
@_run
async def get_broker_config(client: AdminClient, broker_addr: str | None, cluster: str | None) -> None:
    """A broker's configuration (GET_BROKER_CONFIG)."""
    if broker_addr:
        await _print_config(client, f"============{broker_addr.strip()}============", broker_addr.strip())
        return
    if not cluster:
        raise AdminError("give -b (a broker address) or -c (a cluster name)")
    brokers = [b for b in await _brokers(client) if b[0] == cluster.strip()]
    if not brokers:
        raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
    for _, _, addrs in brokers:
        master = addrs.get(0)
        if master is None:
            continue
        await _print_config(client, f"============Master: {master}============", master)
        for broker_id, slave in sorted(addrs.items()):
            if broker_id != 0:
                await _print_config(
                    client, f"============My Master: {master}=====Slave: {slave}============", slave
                )


# ---------------------------------------------------------------------------- maintenance
async def _maintain(client: AdminClient, code: int, broker_addr: str | None, cluster: str | None) -> None:
    """mqadmin's cleanExpiredCQ & co: one broker, or every broker of a cluster (all clusters)."""
    addrs = (
        [broker_addr.strip()] if broker_addr else await _cluster_addrs(client, cluster and cluster.strip())
    )
    ok = bool(addrs)
    for addr in addrs:
        try:
            await client.call(addr, code)
        except AdminError as exc:
            click.echo(f"failed: {exc}", err=True)  # mqadmin goes on with the next broker
            ok = False
    click.echo("success" if ok else "false")
    if not addrs:
        raise AdminError("no broker is registered with the NameServer")
    if not ok:
        raise AdminError("not every broker succeeded")


@admin.command("cleanExpiredCQ")
@click.option("-b", "--brokerAddr", "broker_addr", help="Broker address.")
@click.option("-c", "--cluster", "cluster", help="Cluster name (default: every cluster).")
@_run
async def clean_expired_cq(client: AdminClient, broker_addr: str | None, cluster: str | None) -> None:
    """Drop consume queues whose messages were all deleted (CLEAN_EXPIRED_CONSUMEQUEUE)."""
    await _maintain(client, RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE, broker_addr, cluster)


@admin.command("deleteExpiredCommitLog")
@click.option("-b", "--brokerAddr", "broker_addr", help="Broker address.")
@click.option("-c", "--cluster", "cluster", help="Cluster name (default: every cluster).")
@_run
async def delete_expired_commit_log(
    client: AdminClient, broker_addr: str | None, cluster: str | None
) -> None:
    """Delete expired commit-log files now, whatever the hour (DELETE_EXPIRED_COMMITLOG)."""
    await _maintain(client, RequestCode.DELETE_EXPIRED_COMMITLOG, broker_addr, cluster)


@admin.command("cleanUnusedTopic")
@click.option("-b", "--brokerAddr", "broker_addr", help="Broker address.")
@click.option("-c", "--cluster", "cluster", help="Cluster name (default: every cluster).")
@_run
async def clean_unused_topic(client: AdminClient, broker_addr: str | None, cluster: str | None) -> None:
    """Drop the stored queues of topics the brokers no longer have (CLEAN_UNUSED_TOPIC)."""
    await _maintain(client, RequestCode.CLEAN_UNUSED_TOPIC, broker_addr, cluster)


# ---------------------------------------------------------------------------- export
async def _user_topics(client: AdminClient, addr: str, special: bool) -> dict[str, Any]:
    """DefaultMQAdminExt.getUserTopicConfig: the topic table without system (and retry/DLQ) topics."""
    wrapper = await all_topics(client, addr)
    system = await system_topics(client, addr)
    wrapper["topicConfigTable"] = {
        name: cfg
        for name, cfg in wrapper["topicConfigTable"].items()
        if name not in system and (special or not name.startswith(("%RETRY%", "%DLQ%")))
    }
    return wrapper


async def _user_groups(client: AdminClient, addr: str) -> dict[str, Any]:
    """DefaultMQAdminExt.getUserSubscriptionGroup: the group table without system groups."""
    wrapper = await all_groups(client, addr)
    wrapper["subscriptionGroupTable"] = {
        name: cfg
        for name, cfg in wrapper["subscriptionGroupTable"].items()
        if not name.startswith("CID_RMQ_SYS_") and name not in SYSTEM_GROUPS
    }
    return wrapper


@admin.command("exportMetadata")
@click.option(
    "-c", "--clusterName", "cluster", help="Export the topics and groups of this cluster's masters."
)
@click.option("-b", "--brokerAddr", "broker_addr", help="Export one broker's topics (-t) or groups (-g).")
@click.option(
    "-f", "--filePath", "file_path", default=DEFAULT_EXPORT_PATH, show_default=True, help="Directory."
)
@click.option("-t", "--topic", "topics_only", is_flag=True, help="Only the topics (topic.json).")
@click.option(
    "-g", "--subscriptionGroup", "groups_only", is_flag=True, help="Only the groups (subscriptionGroup.json)."
)
@click.option("-s", "--specialTopic", "special", is_flag=True, help="Keep retry and DLQ topics.")
@_run
async def export_metadata(
    client: AdminClient,
    cluster: str | None,
    broker_addr: str | None,
    file_path: str,
    topics_only: bool,
    groups_only: bool,
    special: bool,
) -> None:
    """Write topics and groups to metadata.json (topic.json, subscriptionGroup.json)."""
    directory = Path(file_path.strip())
    if broker_addr:
        addr = broker_addr.strip()
        if topics_only:
            path = directory / "topic.json"
            _write(path, await _user_topics(client, addr, special))
        elif groups_only:
            path = directory / "subscriptionGroup.json"
            _write(path, await _user_groups(client, addr))
        else:
            raise AdminError("with -b, give -t (topics) or -g (subscription groups)")
        click.echo(f"export {path} success")
        return
    if not cluster:
        raise AdminError("give -c (a cluster name) or -b (a broker address)")
    topics: dict[str, dict[str, Any]] = {}
    groups: dict[str, dict[str, Any]] = {}
    for addr in await _targets(client, None, cluster):
        # Summed over the masters, as mqadmin does: the cluster's queue counts.
        for name, cfg in (await _user_topics(client, addr, special))["topicConfigTable"].items():
            seen = topics.get(name)
            if seen is not None:
                cfg["writeQueueNums"] = int(cfg.get("writeQueueNums", 0)) + int(seen.get("writeQueueNums", 0))
                cfg["readQueueNums"] = int(cfg.get("readQueueNums", 0)) + int(seen.get("readQueueNums", 0))
            topics[name] = cfg
        for name, cfg in (await _user_groups(client, addr))["subscriptionGroupTable"].items():
            seen = groups.get(name)
            if seen is not None:
                cfg["retryQueueNums"] = int(cfg.get("retryQueueNums", 0)) + int(seen.get("retryQueueNums", 0))
            groups[name] = cfg
    result: dict[str, Any] = {}
    if topics_only:
        result["topicConfigTable"] = topics
        path = directory / "topic.json"
    elif groups_only:
        result["subscriptionGroupTable"] = groups
        path = directory / "subscriptionGroup.json"
    else:
        result["topicConfigTable"] = topics
        result["subscriptionGroupTable"] = groups
        path = directory / "metadata.json"
    result["exportTime"] = int(time.time() * 1000)
    _write(path, result)
    click.echo(f"export {path} success")


@admin.command("exportConfigs")
@click.option("-c", "--clusterName", "cluster", required=True, help="Cluster to export.")
@click.option(
    "-f", "--filePath", "file_path", default=DEFAULT_EXPORT_PATH, show_default=True, help="Directory."
)
@_run
async def export_configs(client: AdminClient, cluster: str, file_path: str) -> None:
    """Write the cluster's size and its masters' main options to configs.json."""
    brokers = [b for b in await _brokers(client) if b[0] == cluster.strip()]
    if not brokers:
        raise AdminError(f"cluster {cluster!r} is unknown to the NameServer")
    configs: dict[str, dict[str, str]] = {}
    masters = slaves = 0
    for _, _, addrs in brokers:
        master = addrs.get(0)
        if master is None:
            continue
        masters += 1
        slaves += len(addrs) - 1
        props = await broker_config(client, master)
        missing = [k for k in EXPORTED_BROKER_KEYS if k not in props]
        if missing:
            raise AdminError(f"{master} answered GET_BROKER_CONFIG without {', '.join(missing)}")
        configs[props["brokerName"]] = {k: props[k] for k in EXPORTED_BROKER_KEYS}
    result = {
        "brokerConfigs": configs,
        "clusterScale": {
            "namesrvSize": len(client.namesrv),
            "masterBrokerSize": masters,
            "slaveBrokerSize": slaves,
        },
    }
    path = Path(file_path.strip()) / "configs.json"
    _write(path, result)
    click.echo(f"export {path} success")
