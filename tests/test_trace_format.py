"""tidemq.trace.format: RocketMQ's trace record text (TraceDataEncoder), both ways."""

from __future__ import annotations

import logging

import pytest

from tidemq.trace import (
    CONTENT_SPLITOR,
    FIELD_SPLITOR,
    MessageType,
    TraceBean,
    TraceContext,
    TraceType,
    decode_trace_data,
    encode_context,
    trace_keys,
)

C, F = CONTENT_SPLITOR, FIELD_SPLITOR


def pub() -> TraceContext:
    return TraceContext(
        TraceType.PUB,
        time_stamp=1700000000123,
        region_id="DefaultRegion",
        group_name="pg",
        cost_time=7,
        is_success=True,
        beans=[
            TraceBean(
                topic="T",
                msg_id="7F00000100002A9F0000000000000001",
                offset_msg_id="7F00000100002A9F00000000000000A0",
                tags="tagA",
                keys="k1 k2",
                store_host="127.0.0.1:10911",
                body_length=5,
                msg_type=MessageType.NORMAL,
            )
        ],
    )


def test_separators_are_java_chars_1_and_2() -> None:
    assert (C, F) == ("\x01", "\x02")


def test_pub_text_is_the_java_field_order() -> None:
    expected = (
        "Pub" + C + "1700000000123" + C + "DefaultRegion" + C + "pg" + C + "T" + C
        + "7F00000100002A9F0000000000000001" + C + "tagA" + C + "k1 k2" + C
        + "127.0.0.1:10911" + C + "5" + C + "7" + C + "0" + C
        + "7F00000100002A9F00000000000000A0" + C + "true" + F
    )  # fmt: skip
    assert encode_context(pub()) == expected


def test_sub_before_and_after_text_one_record_per_bean() -> None:
    beans = [TraceBean(msg_id="M1", retry_times=2, keys="k"), TraceBean(msg_id="M2")]
    before = TraceContext(
        TraceType.SUB_BEFORE, time_stamp=5, region_id="R", group_name="cg", request_id="req",
        beans=beans,
    )  # fmt: skip
    assert encode_context(before) == (
        "SubBefore" + C + "5" + C + "R" + C + "cg" + C + "req" + C + "M1" + C + "2" + C + "k" + F
        + "SubBefore" + C + "5" + C + "R" + C + "cg" + C + "req" + C + "M2" + C + "0" + C + "" + F
    )  # fmt: skip
    after = TraceContext(
        TraceType.SUB_AFTER, time_stamp=9, request_id="req", cost_time=3, is_success=False,
        context_code=1, group_name="cg", beans=beans,
    )  # fmt: skip
    assert encode_context(after) == (
        # RocketMQ 4.9 ends a SubAfter with the time and the consumer group (mqadmin groups by it).
        "SubAfter" + C + "req" + C + "M1" + C + "3" + C + "false" + C + "k" + C + "1" + C + "9" + C + "cg" + F
        + "SubAfter" + C + "req" + C + "M2" + C + "3" + C + "false" + C + "" + C + "1" + C + "9" + C + "cg" + F
    )  # fmt: skip


def test_end_transaction_text() -> None:
    ctx = TraceContext(
        TraceType.END_TRANSACTION,
        time_stamp=11,
        region_id="R",
        group_name="tg",
        beans=[
            TraceBean(
                topic="T", msg_id="M", tags="t", keys="k", store_host="h:1",
                msg_type=MessageType.TRANS_HALF, transaction_id="tx1",
                transaction_state="COMMIT_MESSAGE", from_transaction_check=True,
            )
        ],
    )  # fmt: skip
    assert encode_context(ctx) == (
        "EndTransaction" + C + "11" + C + "R" + C + "tg" + C + "T" + C + "M" + C + "t" + C + "k"
        + C + "h:1" + C + "1" + C + "tx1" + C + "COMMIT_MESSAGE" + C + "true" + F
    )  # fmt: skip


def test_round_trip_every_type() -> None:
    p = pub()
    sb = TraceContext(
        TraceType.SUB_BEFORE, time_stamp=5, region_id="R", group_name="cg", request_id="q",
        beans=[TraceBean(msg_id="M1", retry_times=3, keys="")],
    )  # fmt: skip
    sa = TraceContext(
        TraceType.SUB_AFTER, time_stamp=6, request_id="q", cost_time=4, is_success=False,
        context_code=2, group_name="cg", beans=[TraceBean(msg_id="M1", keys="kk")],
    )  # fmt: skip
    et = TraceContext(
        TraceType.END_TRANSACTION, time_stamp=7, region_id="R", group_name="tg",
        beans=[TraceBean(topic="T", msg_id="M", store_host="h:1", msg_type=MessageType.TRANS_HALF,
                         transaction_id="x", transaction_state="ROLLBACK_MESSAGE")],
    )  # fmt: skip
    text = "".join(encode_context(c) for c in (p, sb, sa, et))
    assert decode_trace_data(text) == [p, sb, sa, et]


def test_decode_reads_records_without_trailing_empty_fields() -> None:
    # Java's split drops trailing empty strings: a SubBefore without keys has 7 fields.
    (ctx,) = decode_trace_data("SubBefore" + C + "5" + C + "R" + C + "cg" + C + "q" + C + "M" + C + "1")
    assert ctx.beans[0].msg_id == "M" and ctx.beans[0].retry_times == 1
    # An old Pub record (13 fields: no offset msg id) and a newer one (15: client host).
    old = C.join(["Pub", "1", "R", "g", "T", "M", "", "", "h", "3", "2", "0", "false"])
    new = C.join(["Pub", "1", "R", "g", "T", "M", "", "", "h", "3", "2", "0", "O", "true", "ch"])
    a, b = decode_trace_data(old + F + new + F)
    assert (a.is_success, a.beans[0].offset_msg_id) == (False, "")
    assert (b.is_success, b.beans[0].offset_msg_id, b.beans[0].client_host) == (True, "O", "ch")


@pytest.mark.parametrize(
    "junk",
    [
        "Pub" + C + "1" + C + "R",  # too few fields
        "Nope" + C + "1" + C + "2",  # unknown type
        "Pub" + C + "x" * 13,  # junk
        C.join(["Pub", "notanumber", "R", "g", "T", "M", "", "", "h", "3", "2", "0", "O", "true"]),
        C.join(["Pub", "1", "R", "g", "T", "M", "", "", "h", "3", "2", "99", "O", "true"]),
        "\x00\xff garbage \u2603",
    ],
)
def test_malformed_records_are_skipped_not_raised(junk: str, caplog: pytest.LogCaptureFixture) -> None:
    good = encode_context(pub())
    with caplog.at_level(logging.WARNING, logger="tidemq.trace.format"):
        assert decode_trace_data(junk + F + good) == [pub()]
    assert "malformed trace record" in caplog.text


def test_empty_text_and_keys() -> None:
    assert decode_trace_data("") == []
    assert encode_context(TraceContext(TraceType.PUB)) == ""
    # As RocketMQ 4.9: the traced keys are split on spaces, each its own index key.
    assert trace_keys(pub()) == ["7F00000100002A9F0000000000000001", "k1", "k2"]
