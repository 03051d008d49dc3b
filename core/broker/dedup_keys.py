"""The duplicate window's settings and keys (issue 37): what identifies a resend, per topic.

A message's key is its ``UNIQ_KEY`` property (RocketMQ 5: ``message_id``), or with
``dedup_key = "content"`` a digest of its content (:func:`content_key`); a topic's window and key
kind come from its attributes (``dedup.window.seconds``, ``dedup.key``), else the ``[broker]``
keys (:func:`parse_window`, :func:`parse_key_kind`).  Also the per-key and per-send byte figures
the window's memory bound counts.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from tidemq.broker.dedup_table import COMPILED
from tidemq.broker.headers import RETRY_GROUP_TOPIC_PREFIX
from tidemq.message import Prop

log = logging.getLogger("tidemq.broker.dedup")

__all__ = [
    "KEY_ATTRIBUTE",
    "MAX_KEY_LENGTH",
    "PER_KEY_BYTES",
    "PER_SEND_BYTES",
    "TOPIC_ATTRIBUTE",
    "UNIQ_KEY",
    "content_key",
    "not_windowed",
    "parse_key_kind",
    "parse_window",
    "topic_attribute",
]


def content_key(flag: int, body: bytes | memoryview, properties: Mapping[str, str]) -> str:
    """A message's content key (``dedup_key = "content"``): a digest of its body, flag and
    properties but the per-attempt ones, the same for every attempt of one send."""
    h = hashlib.blake2b(body, digest_size=16)
    h.update(b"\0%d" % flag)
    for name in sorted(properties):
        if name not in CONTENT_SKIPPED:
            h.update(b"\0%s\1%s" % (name.encode(), properties[name].encode()))
    return h.hexdigest()


UNIQ_KEY = Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX
#: The topic attribute that overrides ``dedup_window_s`` for one topic (seconds; 0: off).
TOPIC_ATTRIBUTE = "dedup.window.seconds"
#: The topic attribute that overrides ``dedup_key`` for one topic (``uniq_key`` or ``content``).
KEY_ATTRIBUTE = "dedup.key"
#: Properties a content key leaves out: the per-attempt UNIQ_KEY, and what the broker adds or
#: changes on the way to the commit log (cluster, parking, a capped delay level).
CONTENT_SKIPPED = frozenset(
    (
        Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
        Prop.CLUSTER,
        Prop.REAL_TOPIC,
        Prop.REAL_QUEUE_ID,
        Prop.DELAY_TIME_LEVEL,
        "TIMER_OUT_MS",
    )
)
#: Longer keys are not kept (the message is stored normally): RocketMQ's are 32 hex digits, a
#: RocketMQ 5 ``message_id`` 34; 10 KiB keys must not let a client fill the window's bytes.
MAX_KEY_LENGTH = 128
#: Memory one key costs, and one send, as measured with tracemalloc and RSS (tests/test_dedup.py
#: checks the estimate is neither below nor more than a quarter above what a window of keys that
#: do not count up holds).  Compiled: a key's four to eight 8-byte slots (the table's load is kept
#: at most 1/4: see ``_dedup_table._LOAD``), its 16-byte ring entry and 4-byte segment mask (up
#: to twice that: the ring's power-of-two slack), its 8-byte hash in its table's key ring and its
#: 4-byte offset delta of the answer (the message ids are kept as numbers): the worst case, keys
#: that do not count up (keys counting up share a slot and a ring entry by 8: ~24 bytes a key,
#: dedupruns_*.json, which the estimate does not know: it holds them at a quarter of the cap); a
#: send: its :class:`Sent` record, 176 bytes, and the allocator's share (192: 500 000 single sends
#: take 250 bytes of RSS each, keys included).  Before session 12 a send counted 280: its hash
#: array's header too, which session 11 (dedupmem) removed; single sends then filled a 128 MiB
#: cap at 87 MB of RSS.  A key's characters are not kept.  The Python reference keeps a dict
#: entry and a hash object per key, an array per send and the answer's ids as text (tracemalloc:
#: ~106 bytes a key, ~350 a send).
PER_KEY_BYTES = 104 if COMPILED else 130
PER_SEND_BYTES = 192 if COMPILED else 400
#: Topics whose sends are never deduplicated: a consumer's retries are redeliveries on purpose
#: (the fallback send-back of a 4.x client re-sends the same UNIQ_KEY on each attempt).
NOT_WINDOWED_PREFIXES = (RETRY_GROUP_TOPIC_PREFIX, "%DLQ%")


def not_windowed(topic: str) -> bool:
    """Whether ``topic`` is never deduplicated (a retry or dead-letter topic)."""
    return topic.startswith(NOT_WINDOWED_PREFIXES)


def topic_attribute(attributes: Mapping[str, object], name: str) -> object | None:
    """Attribute ``name`` of a topic (stored bare or with updateTopic's ``+``)."""
    value = attributes.get(name)
    return attributes.get("+" + name) if value is None else value


def parse_key_kind(value: object, default: bool, topic: str) -> bool:
    """A ``dedup.key`` attribute's value (``uniq_key`` or ``content``) as "keyed on content"."""
    kind = str(value).strip().lower()
    if kind in ("uniq_key", "content"):
        return kind == "content"
    log.warning(
        "topic %s: %s=%r is not uniq_key or content; keeping the default", topic, KEY_ATTRIBUTE, value
    )
    return default


def parse_window(value: object, default: float, topic: str) -> float:
    """A ``dedup.window.seconds`` attribute's value; a bad one is logged and the default kept."""
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86_400:
        log.warning(
            "topic %s: %s=%r is not 0..86400 seconds; using %g", topic, TOPIC_ATTRIBUTE, value, default
        )
        return default
    return seconds
