"""Message filtering contract (role ``filter``; names are expression types)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tidemq.message_types import tags_hash_code

if TYPE_CHECKING:
    from tidemq.store import Dispatcher

EXPRESSION_TAG = "TAG"
EXPRESSION_SQL92 = "SQL92"


@runtime_checkable
class MessageFilter(Protocol):
    """A compiled subscription, asked twice: cheaply on the ConsumeQueue entry, then on the message."""

    def matches_tags_code(self, tags_code: int) -> bool:
        """Decide (or pre-select) from the ConsumeQueue entry alone; ``True`` keeps the message."""

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        """Decide on the decoded properties (exact tag, SQL92 expression...)."""


@runtime_checkable
class EntryPrefilter(Protocol):
    """A filter that can also judge a queue entry by position (the SQL92 filter's bloom bit map,
    like RocketMQ's ConsumeQueueExt): asked after ``matches_tags_code``; False skips the entry without
    reading the record, True means "maybe" (``matches_message`` still decides)."""

    def matches_queue_entry(self, topic: str, queue_id: int, queue_offset: int) -> bool: ...


#: Per filter class: whether it implements :class:`EntryPrefilter` (isinstance on a runtime
#: Protocol costs ~20 us, even for None; a store asks once per pull).
_PREFILTER_CAPABLE: dict[type, bool] = {}


def queue_entry_check(message_filter: MessageFilter | None) -> Callable[[str, int, int], bool] | None:
    """``message_filter.matches_queue_entry`` when it is an :class:`EntryPrefilter`, else None."""
    if message_filter is None:
        return None
    cls = type(message_filter)
    capable = _PREFILTER_CAPABLE.get(cls)
    if capable is None:
        capable = _PREFILTER_CAPABLE[cls] = isinstance(message_filter, EntryPrefilter)
    return message_filter.matches_queue_entry if capable else None  # type: ignore[attr-defined]


@runtime_checkable
class SelectsEverything(Protocol):
    """A filter that may know it matches every message (``*``): the store then reads no properties."""

    matches_all: bool


@runtime_checkable
class SelectsByTag(Protocol):
    """A TAG subscription that says so: a message matches exactly when its TAGS property is one
    of :meth:`selected_tags` (and so ``matches_tags_code`` is "the code is one of their Java
    hashes").  A store may then filter inside its queue walk, in one pass: the entry's code
    first, then the TAGS property read from the record, no record decoded (:func:`tag_selection`).
    """

    def selected_tags(self) -> frozenset[str]:
        """The subscribed tags (not empty: a filter matching everything says ``matches_all``)."""
        ...


_TAG_CAPABLE: dict[type, bool] = {}


@functools.lru_cache(maxsize=1024)
def _selection(tags: frozenset[str]) -> tuple[tuple[int, ...], tuple[bytes, ...]]:
    codes, names = set(), set()
    for tag in tags:
        try:
            codes.add(tags_hash_code(tag))
            names.add(tag.encode())
        except UnicodeEncodeError:  # a lone surrogate: no stored (UTF-8) tag can equal it
            continue
    return tuple(sorted(codes)), tuple(sorted(names))


def tag_selection(message_filter: MessageFilter | None) -> tuple[tuple[int, ...], tuple[bytes, ...]] | None:
    """``(tag codes, UTF-8 tags)`` of a :class:`SelectsByTag` filter, else None: the ``tags``
    argument of :func:`tidemq.message.scan_queue`."""
    if message_filter is None:
        return None
    cls = type(message_filter)
    capable = _TAG_CAPABLE.get(cls)
    if capable is None:
        capable = _TAG_CAPABLE[cls] = isinstance(message_filter, SelectsByTag)
    if not capable:
        return None
    tags = message_filter.selected_tags()  # type: ignore[attr-defined]
    return _selection(frozenset(tags)) if tags else None


@runtime_checkable
class FilterFactory(Protocol):
    """Compiles expressions of one type; :class:`ValueError` for an invalid expression."""

    def compile(self, expression: str) -> MessageFilter: ...


@runtime_checkable
class DispatchingFilterFactory(FilterFactory, Protocol):
    """A filter type that must see every stored message (the SQL92 bloom bit map, RocketMQ's
    CommitLogDispatcherCalcBitMap), and owns what it built for that.

    The broker, as the composition root, attaches :meth:`dispatchers` to its store before the store
    loads (so recovery's re-dispatch feeds them too), as RocketMQ's BrokerController does; the
    factory itself never reaches for the store.  The broker calls :meth:`close` when it stops.
    """

    def dispatchers(self) -> Sequence[Dispatcher]:
        """What the store must dispatch every stored message to (may be empty)."""

    def close(self) -> None:
        """Stop the threads the dispatchers run on."""
