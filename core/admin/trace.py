"""mqadmin's ``queryMsgTraceById``: a message's trace (send, consumers, end-transaction), read
from the trace topic (RocketMQ's ``tools/command/message/QueryMsgTraceByIdSubCommand``)."""

from __future__ import annotations

import click

from tidemq.admin._common import _run, admin
from tidemq.client.admin import AdminClient, AdminError
from tidemq.trace.format import DEFAULT_TRACE_TOPIC
from tidemq.trace.view import DEFAULT_MAX_NUM, format_trace, query_trace


@admin.command("queryMsgTraceById")
@click.option("-i", "--msgId", "msg_id", required=True, help="Message id (the producer's unique id).")
@click.option(
    "-t",
    "--traceTopic",
    "trace_topic",
    default=DEFAULT_TRACE_TOPIC,
    show_default=True,
    help="The trace topic.",
)
@click.option(
    "-b", "--beginTimestamp", "begin", type=int, default=0, help="Begin timestamp (ms). [default: 0]"
)
@click.option("-e", "--endTimestamp", "end", type=int, help="End timestamp (ms). [default: no end]")
@click.option(
    "-c",
    "--maxNum",
    "max_num",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_NUM,
    show_default=True,
    help="Most trace messages one broker returns.",
)
@_run
async def query_msg_trace_by_id(
    client: AdminClient, msg_id: str, trace_topic: str, begin: int, end: int | None, max_num: int
) -> None:
    """Print a message's trace: who sent it and how long it took, each consumer group's consumes."""
    msg_id, trace_topic = msg_id.strip(), trace_topic.strip()
    if not msg_id:
        raise AdminError("-i/--msgId is empty")
    trace = await query_trace(client, msg_id, trace_topic, begin, end, max_num)
    if not trace.found:
        raise AdminError(
            f"no trace of message {msg_id} in trace topic {trace_topic!r} "
            "(traces are kept under the producer's message id, not the broker's offset id)"
        )
    for line in format_trace(trace):
        click.echo(line)
