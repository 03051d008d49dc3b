"""mqadmin's message commands: queryMsgByOffset, printMsg, printMsgByQueue, and the send probes
sendMsgStatus, checkMsgSendRT and clusterRT (RocketMQ 4.9's ``tools/command/{message,broker,cluster}``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click

from tidemq.admin._common import TOOLS_GROUP, _print_message, _run, _table, admin
from tidemq.admin._requests import (
    decode_text,
    master_of,
    msg_text,
    pull,
    queue_range,
    readable,
    send_probe,
    writable_queues,
)
from tidemq.client.admin import AdminClient, AdminError
from tidemq.message import MessageExt
from tidemq.remoting.codes import ResponseCode


# ---------------------------------------------------------------------- messages
@admin.command("queryMsgByOffset")
@click.option("-t", "--topic", required=True)
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", required=True, type=int)
@click.option("-o", "--offset", required=True, type=int, help="Queue offset.")
@_run
@readable
async def query_msg_by_offset(
    client: AdminClient, topic: str, broker_name: str, queue_id: int, offset: int
) -> None:
    """Print the message at one queue offset."""
    route = await client.route(topic)
    addr = await master_of(client, route, broker_name)
    code, _, msgs = await pull(client, addr, topic, queue_id, offset, 1, "*", TOOLS_GROUP)
    if not msgs:
        raise AdminError(f"no message at offset {offset} of queue {queue_id} of {topic} on {broker_name}")
    _print_message(msgs[0])


async def _print_queue_range(
    client: AdminClient,
    addr: str,
    topic: str,
    queue_id: int,
    begin: int,
    end: int,
    sub: str,
    printer: Any,
) -> int:
    """Pull ``[begin, end)`` of one queue 32 messages at a time, passing each to ``printer``."""
    printed = 0
    offset = begin
    label = f"MessageQueue [topic={topic}, queueId={queue_id}]"
    while offset < end:
        code, next_offset, msgs = await pull(
            client, addr, topic, queue_id, offset, min(32, end - offset), sub, TOOLS_GROUP
        )
        for m in msgs:
            if m.queue_offset >= end:
                break
            printer(m)
            printed += 1
        if code == ResponseCode.SUCCESS and next_offset > offset:
            offset = next_offset
            continue
        if code == ResponseCode.PULL_RETRY_IMMEDIATELY and next_offset > offset:  # nothing matched
            click.echo(f"{label} no matched msg. status=NO_MATCHED_MSG, offset={offset}")
            offset = next_offset
            continue
        status = "OFFSET_ILLEGAL" if code == ResponseCode.PULL_OFFSET_MOVED else "NO_NEW_MSG"
        click.echo(f"{label} print msg finished. status={status}, offset={offset}")
        break
    return printed


@admin.command("printMsg")
@click.option("-t", "--topic", required=True)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True)
@click.option(
    "-s", "--subExpression", "sub", default="*", show_default=True, help="Tag expression (TagA || TagB)."
)
@click.option("-b", "--beginTimestamp", "begin", help="ms since the epoch or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-e", "--endTimestamp", "end", help="ms since the epoch or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-d", "--printBody", "print_body", default="true", show_default=True, help="true|false")
@_run
@readable
async def print_msg(
    client: AdminClient,
    topic: str,
    charset: str,
    sub: str,
    begin: str | None,
    end: str | None,
    print_body: str,
) -> None:
    """Print every message of a topic (within a time range), queue by queue."""
    decode_text(b"", charset)
    body = print_body.strip().lower() == "true"
    route = await client.route(topic)
    addrs = route.addresses()
    for mq in route.subscribe_queues():
        addr = addrs.get(mq.broker_name)
        if addr is None:
            continue
        lo, hi = await queue_range(client, addr, topic, mq.queue_id, begin, end)
        click.echo(
            f"minOffset={lo}, maxOffset={hi}, MessageQueue [topic={topic}, brokerName={mq.broker_name}, queueId={mq.queue_id}]"
        )

        def show(m: MessageExt) -> None:
            text = decode_text(m.body, charset) if body else "NOT PRINT BODY"
            click.echo(f"MSGID: {m.uniq_key or m.msg_id} {msg_text(m)} BODY: {text}")

        await _print_queue_range(client, addr, topic, mq.queue_id, lo, hi, sub, show)
        click.echo("--------------------------------------------------------")


@admin.command("printMsgByQueue")
@click.option("-t", "--topic", required=True)
@click.option("-a", "--brokerName", "broker_name", required=True)
@click.option("-i", "--queueId", "queue_id", required=True, type=int)
@click.option("-c", "--charsetName", "charset", default="UTF-8", show_default=True)
@click.option("-s", "--subExpression", "sub", default="*", show_default=True)
@click.option("-b", "--beginTimestamp", "begin", help="ms since the epoch or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-e", "--endTimestamp", "end", help="ms since the epoch or yyyy-MM-dd#HH:mm:ss:SSS.")
@click.option("-p", "--printMsg", "print_msg_flag", default="false", show_default=True, help="true|false")
@click.option("-d", "--printBody", "print_body", default="false", show_default=True, help="true|false")
@click.option("-f", "--calculate", default="false", show_default=True, help="true: count messages per tag.")
@_run
@readable
async def print_msg_by_queue(
    client: AdminClient,
    topic: str,
    broker_name: str,
    queue_id: int,
    charset: str,
    sub: str,
    begin: str | None,
    end: str | None,
    print_msg_flag: str,
    print_body: str,
    calculate: str,
) -> None:
    """Print (or count by tag) the messages of one queue."""
    decode_text(b"", charset)
    show_msg = print_msg_flag.strip().lower() == "true"
    show_body = print_body.strip().lower() == "true"
    by_tag = calculate.strip().lower() == "true"
    route = await client.route(topic)
    addr = await master_of(client, route, broker_name)
    lo, hi = await queue_range(client, addr, topic, queue_id, begin, end)
    tags: dict[str, int] = {}

    def show(m: MessageExt) -> None:
        tags[m.tags or ""] = tags.get(m.tags or "", 0) + 1
        if show_msg:
            text = decode_text(m.body, charset) if show_body else "NOT PRINT BODY"
            click.echo(f"MSGID: {m.uniq_key or m.msg_id} {msg_text(m)} BODY: {text}")

    await _print_queue_range(client, addr, topic, queue_id, lo, hi, sub, show)
    if by_tag:
        for tag, n in sorted(tags.items(), key=lambda kv: (-kv[1], kv[0])):
            click.echo(f"Tag: {tag:<30} Count: {n}")


@admin.command("sendMsgStatus")
@click.option("-b", "--brokerName", "broker_name", required=True)
@click.option("-s", "--messageSize", "size", default=128, show_default=True, type=int)
@click.option("-c", "--count", default=50, show_default=True, type=int)
@_run
@readable
async def send_msg_status(client: AdminClient, broker_name: str, size: int, count: int) -> None:
    """Send ``count`` messages to a broker's own topic (named after the broker) and print each RT."""
    route = await client.route(broker_name)
    queues = writable_queues(route, [broker_name])
    if not queues:
        raise AdminError(f"topic {broker_name!r} has no writable queue on broker {broker_name!r}")
    addr = await master_of(client, route, broker_name)
    await send_probe(client, addr, broker_name, queues[0][1], b"x" * 16)  # warm-up, as mqadmin
    for i in range(count):
        name, qid = queues[i % len(queues)]
        begin = time.perf_counter()
        uniq, offset_id, qoff = await send_probe(client, addr, broker_name, qid, b"x" * size)
        rt = int((time.perf_counter() - begin) * 1000)
        click.echo(
            f"rt={rt}ms, SendResult=SendResult [sendStatus=SEND_OK, msgId={uniq}, offsetMsgId={offset_id}, "
            f"messageQueue=MessageQueue [topic={broker_name}, brokerName={name}, queueId={qid}], queueOffset={qoff}]"
        )


@admin.command("checkMsgSendRT")
@click.option("-t", "--topic", required=True)
@click.option("-a", "--amount", default=100, show_default=True, type=int)
@click.option("-s", "--size", default=128, show_default=True, type=int, help="Message size in bytes.")
@_run
@readable
async def check_msg_send_rt(client: AdminClient, topic: str, amount: int, size: int) -> None:
    """Send ``amount`` messages over a topic's queues in turn; print each RT and the average."""
    route = await client.route(topic)
    queues = writable_queues(route)
    if not queues:
        raise AdminError(f"topic {topic!r} has no writable queue")
    addrs = route.addresses()
    rows = []
    total = 0.0
    for i in range(amount):
        name, qid = queues[i % len(queues)]
        begin = time.perf_counter()
        ok = True
        try:
            await send_probe(client, addrs[name], topic, qid, b"x" * size)
        except AdminError:
            ok = False
        rt = (time.perf_counter() - begin) * 1000
        total += rt
        rows.append([name, qid, str(ok).lower(), f"{rt:.0f}"])
    _table(rows, ["#Broker Name", "#QID", "#Send Result", "#RT"])
    click.echo(f"Avg RT: {total / max(amount, 1):.2f}")


@admin.command("clusterRT")
@click.option("-a", "--amount", default=100, show_default=True, type=int)
@click.option("-s", "--size", default=128, show_default=True, type=int, help="Message size in bytes.")
@click.option("-c", "--cluster", help="Only this cluster (default: all).")
@click.option("-i", "--interval", default=10, show_default=True, type=int, help="Seconds between rounds.")
@click.option(
    "--rounds", default=1, show_default=True, type=int, help="Rounds to run (0: until interrupted)."
)
@_run
@readable
async def cluster_rt(
    client: AdminClient, amount: int, size: int, cluster: str | None, interval: int, rounds: int
) -> None:
    """Send to each broker's own topic and print its average RT and failures, per cluster."""
    done = 0
    while True:
        info = await client.cluster_info()
        clusters = info.get("clusterAddrTable") or {}
        names = [cluster] if cluster else sorted(clusters)
        rows = []
        for cname in names:
            if cname not in clusters:
                raise AdminError(f"cluster [{cname}] not exist")
            for bname in sorted(clusters[cname]):
                ok = failed = 0
                elapsed = 0.0
                try:
                    route = await client.route(bname)
                    queues = writable_queues(route, [bname])
                    addr = await master_of(client, route, bname)
                except AdminError:
                    queues, addr = [], ""
                for i in range(amount if queues else 0):
                    begin = time.perf_counter()
                    try:
                        await send_probe(client, addr, bname, queues[i % len(queues)][1], b"x" * size)
                        ok += 1
                    except AdminError:
                        failed += 1
                    elapsed += (time.perf_counter() - begin) * 1000
                if not queues:
                    failed = amount  # the broker's own topic is missing: every send would fail
                rows.append([cname, bname, f"{elapsed / max(ok, 1):.2f}", ok, failed])
        _table(rows, ["#Cluster Name", "#Broker Name", "#RT", "#successCount", "#failCount"])
        done += 1
        if rounds and done >= rounds:
            return
        await asyncio.sleep(interval)
