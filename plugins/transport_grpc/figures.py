"""What the gRPC endpoint serves, counted: for the broker's metrics and runtime info.

Every call passes :class:`Counted` (a generic handler around the service's): the calls served
since start, the calls open now, and the client connections that have one open (gRPC's peer
address names the connection).  Calls the ACL refused are counted by the gate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc


async def responses(outcome: Any) -> AsyncIterator[Any]:
    """A streaming handler's responses: it is an async generator, or a coroutine that writes its
    responses with ``context.write`` (both are grpc.aio handlers)."""
    if hasattr(outcome, "__aiter__"):
        try:
            async for response in outcome:
                yield response
        finally:
            await outcome.aclose()  # closed with this one: its cleanup runs now
    else:
        await outcome


class CallFigures:
    """Counters of one endpoint, read on the broker's loop (no lock: the loop is the only writer)."""

    def __init__(self) -> None:
        self.requests = 0
        self.open_calls = 0
        self._peers: dict[str, int] = {}
        #: Set by the server: the ACL gate's refusals (0 without ACL).
        self.refusals: Callable[[], int] = lambda: 0

    def started(self, peer: str) -> None:
        self.requests += 1
        self.open_calls += 1
        self._peers[peer] = self._peers.get(peer, 0) + 1

    def ended(self, peer: str) -> None:
        self.open_calls -= 1
        left = self._peers.get(peer, 1) - 1
        if left > 0:
            self._peers[peer] = left
        else:
            self._peers.pop(peer, None)

    def figures(self) -> dict[str, int]:
        """``connections`` (with a call open), ``calls`` (open), ``requests_total``, ``acl_refusals_total``."""
        return {
            "connections": len(self._peers),
            "calls": self.open_calls,
            "requests_total": self.requests,
            "acl_refusals_total": self.refusals(),
        }


class WrappedMethods(grpc.GenericRpcHandler):
    """A generic handler serving ``inner``'s methods, each wrapped by :meth:`wrap` once: the
    wrapped handlers are kept by method name (the service's methods; past 64 names, as an
    unknown method's, a name is looked up and wrapped again on each call)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self.inner = inner
        self._wrapped: dict[str, grpc.RpcMethodHandler | None] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method in self._wrapped:
            return self._wrapped[method]
        handler = self.inner.service(handler_call_details)
        wrapped = None if handler is None else self.wrap(method, handler)
        if len(self._wrapped) < 64:  # the service's methods; unknown names are not kept
            self._wrapped[method] = wrapped
        return wrapped

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` of ``method`` (``/package.Service/Method``) as this handler serves it."""
        raise NotImplementedError


class Counted(WrappedMethods):
    """A generic handler whose every call is counted in a :class:`CallFigures`."""

    def __init__(self, inner: grpc.GenericRpcHandler, figures: CallFigures) -> None:
        super().__init__(inner)
        self.figures = figures

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        figures = self.figures
        kinds = (handler.request_deserializer, handler.response_serializer)
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def counted_unary(request: Any, context: Any) -> Any:
                peer = context.peer()
                figures.started(peer)
                try:
                    return await unary(request, context)
                finally:
                    figures.ended(peer)

            return grpc.unary_unary_rpc_method_handler(counted_unary, *kinds)
        streaming = handler.unary_stream or handler.stream_stream
        if streaming is None:
            return handler

        async def counted_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            peer = context.peer()
            figures.started(peer)
            try:
                outcome = streaming(request, context)
                if hasattr(outcome, "__aiter__"):  # no generator layer of its own per message
                    try:
                        async for response in outcome:
                            yield response
                    finally:
                        await outcome.aclose()  # closed with this one: its cleanup runs now
                else:
                    await outcome
            finally:
                figures.ended(peer)

        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(counted_stream, *kinds)
        return grpc.stream_stream_rpc_method_handler(counted_stream, *kinds)
