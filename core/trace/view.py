"""Reading traces back: RocketMQ's ``TraceView`` and the per-message track an operator reads.

A trace message on the trace topic carries records about many messages; :func:`views_of` keeps
the records about one message id (as ``TraceView.decodeFromTraceTransData``: the record's first
bean must carry that id) and takes the client host from the trace message's born host, because
the records themselves carry none.  :func:`build_trace` turns the views of every trace message
found into a :class:`MessageTrace`: the Pub record(s), one line per consume attempt per consumer
group (a SubBefore and the SubAfter of the same request id), and the EndTransaction records.
:func:`query_trace` asks the brokers for the trace messages (QUERY_MESSAGE by key = the id on the
trace topic, as mqadmin's ``queryMsgTraceById``) and :func:`format_trace` prints what mqadmin
prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import attrs

from tidemq.client.admin import AdminClient, AdminError, NoRouteError
from tidemq.message import MessageExt, iter_messages
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.trace.format import DEFAULT_TRACE_TOPIC, TraceType, decode_trace_data

__all__ = [
    "DEFAULT_MAX_NUM",
    "STATUS_FAILED",
    "STATUS_PENDING",
    "STATUS_SUCCESS",
    "ConsumeView",
    "MessageTrace",
    "NoTraceTopicError",
    "TraceView",
    "build_trace",
    "format_trace",
    "query_trace",
    "views_of",
]

STATUS_SUCCESS = "success"
STATUS_FAILED = "failed"
#: A consume attempt with a SubBefore and no SubAfter yet: still running, or the consumer
#: stopped before it recorded the end (RocketMQ's mqadmin does not show these at all).
STATUS_PENDING = "pending"
#: mqadmin's default -c (and the broker's cap on one QUERY_MESSAGE answer).
DEFAULT_MAX_NUM = 64
#: mqadmin's default -e: Long.MAX_VALUE.
_END_OF_TIME = (1 << 63) - 1
#: The last millisecond of year 9999: a later (or negative) time in a record is not a time.
_LATEST_MS = 253_402_300_799_999


class NoTraceTopicError(AdminError):
    """The trace topic does not exist (no broker was started with ``trace_topic_enable``)."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"trace topic {topic!r} does not exist (brokers create it with trace_topic_enable; "
            "-t names another)"
        )
        self.topic = topic


@attrs.frozen
class TraceView:
    """One trace record about one message (RocketMQ's ``TraceView``, with the fields mqadmin
    leaves out: request id, retry times, transaction state)."""

    trace_type: TraceType
    msg_id: str
    group_name: str
    time_stamp: int
    cost_time: int
    status: str
    #: The host that wrote the trace (the trace message's born host, without the port).
    client_host: str
    topic: str = ""
    tags: str = ""
    keys: str = ""
    store_host: str = ""
    offset_msg_id: str = ""
    request_id: str = ""
    retry_times: int = 0
    transaction_id: str = ""
    transaction_state: str = ""
    from_transaction_check: bool = False


@attrs.frozen
class ConsumeView:
    """One consume attempt of the message by a consumer group."""

    group_name: str
    client_host: str
    #: When it ended (the SubAfter's time), or began when that is all there is.
    time_stamp: int
    cost_time: int
    status: str
    retry_times: int = 0
    request_id: str = ""


@attrs.frozen
class MessageTrace:
    """Everything the trace topic knows about one message id."""

    msg_id: str
    trace_topic: str
    pubs: list[TraceView]
    #: (consumer group, its consume attempts oldest first), groups sorted by name.
    consumers: list[tuple[str, list[ConsumeView]]]
    end_transactions: list[TraceView]

    @property
    def found(self) -> bool:
        return bool(self.pubs or self.consumers or self.end_transactions)


def views_of(msg_id: str, message: MessageExt) -> list[TraceView]:
    """The records of one trace message about ``msg_id`` (``TraceView.decodeFromTraceTransData``)."""
    text = message.body.decode("utf-8", "replace") if message.body else ""
    host = message.born_host[0] if message.born_host else ""
    out: list[TraceView] = []
    for ctx in decode_trace_data(text):
        if not ctx.beans or ctx.beans[0].msg_id != msg_id:
            continue
        bean = ctx.beans[0]
        out.append(
            TraceView(
                trace_type=ctx.trace_type,
                msg_id=bean.msg_id,
                group_name=ctx.group_name,
                # Hostile or broken text must not break the printing of dates.
                time_stamp=ctx.time_stamp if 0 <= ctx.time_stamp <= _LATEST_MS else 0,
                cost_time=ctx.cost_time,
                status=STATUS_SUCCESS if ctx.is_success else STATUS_FAILED,
                client_host=bean.client_host or host,
                topic=bean.topic,
                tags=bean.tags,
                keys=bean.keys,
                store_host=bean.store_host,
                offset_msg_id=bean.offset_msg_id,
                request_id=ctx.request_id,
                retry_times=bean.retry_times,
                transaction_id=bean.transaction_id,
                transaction_state=bean.transaction_state,
                from_transaction_check=bean.from_transaction_check,
            )
        )
    return out


def _unique(views: Iterable[TraceView]) -> list[TraceView]:
    # A trace message the trace producer re-sent (after a timeout) is stored twice: show it once.
    seen: set[TraceView] = set()
    out = []
    for v in views:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def build_trace(
    msg_id: str, messages: Iterable[MessageExt], trace_topic: str = DEFAULT_TRACE_TOPIC
) -> MessageTrace:
    """The track of ``msg_id`` from the trace messages found for it (in any order)."""
    views = _unique(v for m in messages for v in views_of(msg_id, m))
    by_type: dict[TraceType, list[TraceView]] = {t: [] for t in TraceType}
    for v in views:
        by_type[v.trace_type].append(v)
    befores: dict[str, TraceView] = {}
    for v in by_type[TraceType.SUB_BEFORE]:
        befores.setdefault(v.request_id, v)
    attempts: list[ConsumeView] = []
    paired: set[str] = set()
    for after in by_type[TraceType.SUB_AFTER]:
        before = befores.get(after.request_id) if after.request_id else None
        if before is not None:
            paired.add(after.request_id)
        attempts.append(
            ConsumeView(
                # A SubAfter older than 4.9 carries neither group nor time: its SubBefore does.
                group_name=after.group_name or (before.group_name if before else ""),
                client_host=after.client_host or (before.client_host if before else ""),
                time_stamp=after.time_stamp or (before.time_stamp if before else 0),
                cost_time=after.cost_time,
                status=after.status,
                retry_times=before.retry_times if before else 0,
                request_id=after.request_id,
            )
        )
    for rid, before in befores.items():
        if rid not in paired:
            attempts.append(
                ConsumeView(
                    group_name=before.group_name,
                    client_host=before.client_host,
                    time_stamp=before.time_stamp,
                    cost_time=0,
                    status=STATUS_PENDING,
                    retry_times=before.retry_times,
                    request_id=rid,
                )
            )
    groups: dict[str, list[ConsumeView]] = {}
    for a in attempts:
        groups.setdefault(a.group_name, []).append(a)
    return MessageTrace(
        msg_id=msg_id,
        trace_topic=trace_topic,
        pubs=sorted(by_type[TraceType.PUB], key=lambda v: v.time_stamp),
        consumers=[(g, sorted(groups[g], key=lambda a: a.time_stamp)) for g in sorted(groups)],
        end_transactions=sorted(by_type[TraceType.END_TRANSACTION], key=lambda v: v.time_stamp),
    )


async def query_trace(
    client: AdminClient,
    msg_id: str,
    trace_topic: str = DEFAULT_TRACE_TOPIC,
    begin_ms: int = 0,
    end_ms: int | None = None,
    max_num: int = DEFAULT_MAX_NUM,
) -> MessageTrace:
    """QUERY_MESSAGE by key ``msg_id`` on every broker of ``trace_topic``, then :func:`build_trace`.

    ``end_ms`` None: no end (mqadmin's Long.MAX_VALUE).  Raises :class:`NoTraceTopicError` when
    the trace topic does not exist.
    """
    try:
        route = await client.route(trace_topic)
    except NoRouteError:
        raise NoTraceTopicError(trace_topic) from None
    fields = {
        "topic": trace_topic,
        "key": msg_id,
        "maxNum": max_num,
        "beginTimestamp": begin_ms,
        "endTimestamp": _END_OF_TIME if end_ms is None else end_ms,
    }
    found: list[MessageExt] = []
    for addr in sorted(route.addresses().values()):
        resp = await client.call(
            addr, RequestCode.QUERY_MESSAGE, fields, ok=(0, ResponseCode.QUERY_NOT_FOUND)
        )
        if resp.code == ResponseCode.SUCCESS:
            found.extend(iter_messages(resp.payload()))
    return build_trace(msg_id, found, trace_topic)


def _when(ms: int) -> str:
    # mqadmin: DateFormatUtils.format(ts, "yyyy-MM-dd HH:mm:ss"), local time.
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms > 0 else "-"


def _row(*cols: str) -> str:
    # mqadmin's "%-10s %-20s %-20s %-20s %-10s %-10s"; columns after the sixth are tidemq's own.
    widths = (10, 20, 20, 20, 10, 10)
    head = " ".join(c.ljust(w) for c, w in zip(cols, widths, strict=False))
    return " ".join([head, *cols[len(widths) :]]).rstrip()


def format_trace(trace: MessageTrace) -> list[str]:
    """The lines ``mqadmin queryMsgTraceById`` prints: a Pub table, then one table per consumer
    group.  tidemq adds the store host (the broker) after a Pub's status, consume attempts with
    no SubAfter yet (status ``pending``), and the EndTransaction records."""
    lines: list[str] = []
    for pub in trace.pubs:
        lines.append(_row("#Type", "#ProducerGroup", "#ClientHost", "#SendTime", "#CostTimes", "#Status", "#StoreHost"))  # fmt: skip
        lines.append(
            _row(
                "Pub",
                pub.group_name,
                pub.client_host,
                _when(pub.time_stamp),
                f"{pub.cost_time}ms",
                pub.status,
                pub.store_host,
            )
        )
        lines.append("")
    for tx in trace.end_transactions:
        lines.append(_row("#Type", "#ProducerGroup", "#ClientHost", "#Time", "#FromCheck", "#State"))
        lines.append(
            _row(
                "EndTx",
                tx.group_name,
                tx.client_host,
                _when(tx.time_stamp),
                "true" if tx.from_transaction_check else "false",
                tx.transaction_state,
            )
        )
        lines.append("")
    for _group, attempts in trace.consumers:
        lines.append(_row("#Type", "#ConsumerGroup", "#ClientHost", "#ConsumerTime", "#CostTimes", "#Status"))
        for a in attempts:
            cost = "-" if a.status == STATUS_PENDING else f"{a.cost_time}ms"
            lines.append(_row("Sub", a.group_name, a.client_host, _when(a.time_stamp), cost, a.status))
        lines.append("")
    return lines
