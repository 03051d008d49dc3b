"""Client credentials for brokers with access control (RocketMQ's SessionCredentials + AclClientRPCHook).

With credentials, every request the client sends carries ``AccessKey`` and a ``Signature`` over
its ext fields and body (see :mod:`tidemq.acl`), the way RocketMQ's Java and C++ clients sign:

    Producer("pg", namesrv=..., credentials=SessionCredentials("RocketMQ", "12345678"))
    Producer("pg", namesrv=..., access_key="RocketMQ", secret_key="12345678")
"""

from __future__ import annotations

from typing import Any

import attrs

from tidemq.acl import sign_request
from tidemq.client.errors import ClientError


@attrs.frozen
class SessionCredentials:
    """An access key and its secret; ``channel`` is sent as ``OnsChannel`` (as the C++ client does)."""

    access_key: str
    secret_key: str = attrs.field(repr=False)  # never in reprs or logs
    channel: str | None = None
    security_token: str | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ClientError("credentials need both an access key and a secret key")

    def sign(self, request: Any) -> Any:
        """Add AccessKey and Signature to ``request`` (the RPC hook); returns it."""
        sign_request(
            request, self.access_key, self.secret_key, channel=self.channel, token=self.security_token
        )
        return request


def make_credentials(
    credentials: SessionCredentials | None, access_key: str | None, secret_key: str | None
) -> SessionCredentials | None:
    """Credentials from either form of the constructor arguments (None when neither is given)."""
    if credentials is not None:
        if access_key or secret_key:
            raise ClientError("give either credentials= or access_key=/secret_key=, not both")
        return credentials
    if access_key or secret_key:
        return SessionCredentials(access_key or "", secret_key or "")
    return None


class SigningRemoting:
    """A transport client whose every outgoing request is signed with ``credentials``."""

    def __init__(self, inner: Any, credentials: SessionCredentials) -> None:
        self._inner = inner
        self.credentials = credentials

    async def invoke(self, address: str, request: Any, timeout: float) -> Any:
        return await self._inner.invoke(address, self.credentials.sign(request), timeout)

    async def invoke_oneway(self, address: str, request: Any) -> None:
        await self._inner.invoke_oneway(address, self.credentials.sign(request))

    async def close(self) -> None:
        await self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
