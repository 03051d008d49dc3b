"""A service's :class:`~tidemq.broker.services.Outcome` as a remoting response (shared by the codecs)."""

from __future__ import annotations

from tidemq.broker.services.status import Outcome
from tidemq.remoting.command import RemotingCommand


def answer(request: RemotingCommand, outcome: Outcome) -> RemotingCommand:
    """The response code is the status; the remark and, in controller mode, the epoch go along."""
    if outcome.epoch is not None:
        return request.reply(outcome.status, outcome.remark, {"epoch": str(outcome.epoch)})
    return request.reply(outcome.status, outcome.remark)
