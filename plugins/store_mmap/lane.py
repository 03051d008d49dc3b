"""The mmap store's request lane (issue 38): the compiled prepare step of SEND_MESSAGE, SEND_MESSAGE_V2 and
SEND_BATCH_MESSAGE.

Offered through :meth:`MmapMessageStore.send_lane` (:class:`tidemq.store.RequestLanes`) when the
compiled :mod:`tidemq._native._send_lane` is built and not switched off (``TIDEMQ_NO_EXTENSIONS=1``,
or ``[store.mmap] request_lanes = false``); the broker then serves plain runs of those sends with
it and everything else with the Python handler, which stays the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import cast

from tidemq.extensions import compiled_twin
from tidemq.store import SendFrameLane, SendLane

MODULE = "tidemq._native._send_lane"
#: The lane's wire ends: frames read and answers written without a command per request.
FRAME_MODULE = "tidemq._native._frame_lane"


class CompiledSendLane:
    """:class:`tidemq.store.SendLane` over the compiled module's ``prepare_sends``."""

    __slots__ = ("description", "prepare_sends")

    def __init__(self, prepare_sends: Callable[..., object]) -> None:
        self.description = f"SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE (compiled: {MODULE})"
        self.prepare_sends = prepare_sends


class CompiledSendFrameLane:
    """:class:`tidemq.store.SendFrameLane`: the compiled prepare step and the compiled wire ends."""

    __slots__ = (
        "answer_frames",
        "command_of",
        "description",
        "prepare_frames",
        "prepare_sends",
        "take_frames",
    )

    def __init__(self, module: ModuleType, frames: ModuleType) -> None:
        self.description = (
            f"SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE (compiled: {MODULE}; "
            f"frames in, answers out: {FRAME_MODULE})"
        )
        self.prepare_sends = module.prepare_sends
        self.prepare_frames = module.prepare_frames
        self.take_frames = frames.take_frames
        self.answer_frames = frames.answer_frames
        self.command_of = frames.command_of


def compiled_send_lane() -> SendLane | None:
    """The compiled lane (with its wire ends when built), or None when it is not built or switched off."""
    module = compiled_twin(MODULE)
    if module is None:
        return None
    frames = compiled_twin(FRAME_MODULE)
    if frames is not None and hasattr(module, "prepare_frames"):
        return cast(SendLane, CompiledSendFrameLane(module, frames))
    return cast(SendLane, CompiledSendLane(module.prepare_sends))


def describe() -> str:
    """One line for ``tidemq --version``: which lanes the mmap store offers in this build."""
    lane = compiled_send_lane()
    if lane is None:
        from tidemq.extensions import twins

        reason = next((t.reason for t in twins() if t.module == MODULE), "not built")
        return f"none (the Python handlers serve every request: {reason})"
    reads = (
        "; reads served from their bytes where the transport offers them ([transport.tcp] read_lane)"
        if isinstance(lane, SendFrameLane)
        else ""
    )
    return f"{lane.description}, offered by the mmap store ([store.mmap] request_lanes){reads}"
