"""The timer properties a producer sets, read and checked as RocketMQ 5's HookUtils does.

``TIMER_DELIVER_MS`` is an absolute epoch time in ms, ``TIMER_DELAY_SEC`` / ``TIMER_DELAY_MS`` a
delay from the moment the broker takes the message.  Where tidemq is stricter than RocketMQ (which
reads the first of the three it finds and treats a negative delay as "now"), it refuses: two timer
properties at once, negative values, and values that do not fit a signed 64-bit ms time.
"""

from __future__ import annotations

from tidemq.remoting.codes import ResponseCode

TIMER_TOPIC = "rmq_sys_wheel_timer"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: Set on the parked message: when it is due (epoch ms); the consumer sees it too.
TIMER_OUT_MS = "TIMER_OUT_MS"
#: RocketMQ's recall/delete marker: a message carrying it cancels the timer message it names.
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
TIMER_PROPERTIES = (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)

_MAX_MS = (1 << 63) - 1


class TimerRefused(Exception):
    """A send whose timer the broker will not take: ``code`` and the one-line remark to answer."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def has_timer(properties: dict[str, str]) -> bool:
    return TIMER_DELIVER_MS in properties or TIMER_DELAY_SEC in properties or TIMER_DELAY_MS in properties


def deliver_ms_of(properties: dict[str, str], now_ms: int, max_delay_sec: int) -> int:
    """When the message is due (epoch ms), or :class:`TimerRefused` (MESSAGE_ILLEGAL) saying why."""
    given = [name for name in TIMER_PROPERTIES if name in properties]
    if len(given) > 1:
        raise TimerRefused(
            ResponseCode.MESSAGE_ILLEGAL,
            f"timer message illegal: {' and '.join(given)} set together; set one of them",
        )
    name = given[0]
    text = properties[name]
    try:
        value = int(text.strip())
    except ValueError:
        raise TimerRefused(
            ResponseCode.MESSAGE_ILLEGAL, f"timer message illegal: {name}={text[:40]!r} is not a whole number"
        ) from None
    if value < 0:
        raise TimerRefused(ResponseCode.MESSAGE_ILLEGAL, f"timer message illegal: {name}={value} is negative")
    if name == TIMER_DELAY_SEC:
        deliver = now_ms + value * 1000 if value <= _MAX_MS // 1000 else _MAX_MS + 1
    elif name == TIMER_DELAY_MS:
        deliver = now_ms + value
    else:
        deliver = value
    if deliver > _MAX_MS:
        raise TimerRefused(ResponseCode.MESSAGE_ILLEGAL, f"timer message illegal: {name}={value} overflows")
    if deliver - now_ms > max_delay_sec * 1000:
        raise TimerRefused(
            ResponseCode.MESSAGE_ILLEGAL,
            f"timer message illegal, the delay time should not be bigger than the max delay "
            f"{max_delay_sec * 1000}ms (timerMaxDelaySec); {name}={value}",
        )
    return deliver
