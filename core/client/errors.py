"""Errors raised by tidemq's client."""

from __future__ import annotations

from tidemq.errors import TidemqError


class ClientError(TidemqError):
    """The client could not do what was asked (no route, not started, bad argument...)."""


class NoRouteError(ClientError):
    """The NameServer knows no route for the topic (and auto-creation is not possible)."""


class BrokerError(ClientError):
    """A broker answered a request with an error code."""

    def __init__(self, code: int, remark: str | None, broker: str = "") -> None:
        super().__init__(f"broker {broker or '?'} answered code {code}: {remark or 'no remark'}")
        self.code = code
        self.remark = remark
        self.broker = broker


class SendFailedError(ClientError):
    """Every attempt of a send failed; ``errors`` holds one exception per attempt."""

    def __init__(self, message: str, errors: list[BaseException]) -> None:
        super().__init__(message)
        self.errors = errors


class SendRefusedError(ClientError):
    """A ``tidemq_before_send`` plugin refused the message (ACL, quota...); never retried."""
