"""The mmap store's request lane (issue 38): the compiled prepare step of SEND_MESSAGE, SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE.

Offered through :meth:`MmapMessageStore.send_lane` (:class:`tidemq.store.RequestLanes`) when the
compiled :mod:`tidemq._native._send_lane` is built and not switched off (``TIDEMQ_NO_EXTENSIONS=1``,
or ``[store.mmap] request_lanes = false``); the broker then serves plain runs of those sends with
it and everything else with the Python handler, which stays the reference.
"""

from __future__ import annotations

from collections.abc import Callable

from tidemq.extensions import compiled_twin
from tidemq.store import SendLane

MODULE = "tidemq._native._send_lane"


class CompiledSendLane:
    """:class:`tidemq.store.SendLane` over the compiled module's ``prepare_sends``."""

    __slots__ = ("description", "prepare_sends")

    def __init__(self, prepare_sends: Callable[..., object]) -> None:
        self.description = f"SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE (compiled: {MODULE})"
        self.prepare_sends = prepare_sends


def compiled_send_lane() -> SendLane | None:
    """The compiled lane, or None when it is not built or switched off."""
    module = compiled_twin(MODULE)
    if module is None:
        return None
    lane: SendLane = CompiledSendLane(module.prepare_sends)  # type: ignore[assignment]
    return lane


def describe() -> str:
    """One line for ``tidemq --version``: which lanes the mmap store offers in this build."""
    lane = compiled_send_lane()
    if lane is None:
        from tidemq.extensions import twins

        reason = next((t.reason for t in twins() if t.module == MODULE), "not built")
        return f"none (the Python handlers serve every request: {reason})"
    return f"{lane.description}, offered by the mmap store ([store.mmap] request_lanes)"
