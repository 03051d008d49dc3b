"""The small etcd v3 surface the controller needs, over etcd's HTTP/JSON gateway (``/v3/...``).

Leases (grant, one keepalive, revoke), get (a key or a prefix), put, delete, a compare-and-swap
transaction, and a watch that reconnects and resumes from the last revision it delivered.  Keys
and values are bytes (base64 on the wire); etcd's int64 fields arrive as JSON strings.

Every failure becomes one :class:`ControllerError` naming the endpoint(s): a connection or timeout
error moves on to the next endpoint, and only when all of them failed does the call fail.  Nothing
here retries forever or hides that etcd is unreachable: without etcd's quorum no write succeeds,
so no election can happen, and callers keep the role they have (the election decides what a
master does when it cannot renew its lease).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

import attrs
import httpx
import orjson

log = logging.getLogger(__name__)

__all__ = [
    "Compare",
    "ControllerError",
    "Delete",
    "EtcdClient",
    "KeyValue",
    "Put",
    "TxnResult",
    "WatchEvent",
    "prefix_end",
]


class ControllerError(Exception):
    """etcd could not be reached, or refused a request (the message names the endpoint)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # an empty or all-0xff prefix: every key from it on


@attrs.frozen
class KeyValue:
    """One key as etcd stores it (revisions are etcd's cluster-wide counters)."""

    key: bytes
    value: bytes
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")),
            value=_unb64(kv.get("value")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
            lease=int(kv.get("lease", 0)),
        )


@attrs.frozen
class WatchEvent:
    """A change seen by a watch: ``PUT`` (created or updated) or ``DELETE`` (deleted or expired)."""

    type: Literal["PUT", "DELETE"]
    kv: KeyValue


@attrs.frozen
class Compare:
    """One condition of a transaction: ``target`` of ``key`` compared to ``value``.

    ``target`` is ``CREATE`` (create revision, 0 for a missing key), ``MOD`` (mod revision),
    ``VERSION`` or ``VALUE`` (bytes).
    """

    key: bytes
    target: Literal["CREATE", "MOD", "VERSION", "VALUE"]
    value: int | bytes
    result: Literal["EQUAL", "NOT_EQUAL", "GREATER", "LESS"] = "EQUAL"

    def to_json(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "MOD": "mod_revision", "VERSION": "version", "VALUE": "value"}
        value = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {
            "key": _b64(self.key),
            "target": self.target,
            "result": self.result,
            field[self.target]: value,
        }


@attrs.frozen
class Put:
    """Set ``key`` to ``value``, attached to ``lease`` (0: none; the key outlives every client)."""

    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": _b64(self.key), "value": _b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@attrs.frozen
class Delete:
    """Delete ``key`` (with ``prefix``, every key starting with it)."""

    key: bytes
    prefix: bool = False

    def to_json(self) -> dict[str, Any]:
        body = {"key": _b64(self.key)}
        if self.prefix:
            body["range_end"] = _b64(prefix_end(self.key))
        return {"request_delete_range": body}


@attrs.frozen
class TxnResult:
    """Whether every compare held (``succeeded``), and the store revision after the transaction."""

    succeeded: bool
    revision: int


class EtcdClient:
    """An asyncio client for one etcd cluster, given its client URLs (``http://host:port``).

    ``timeout`` bounds each request (connect + answer); a request that times out on one endpoint
    is tried on the next.  One HTTP connection pool for all calls; :meth:`close` releases it.
    """

    def __init__(self, endpoints: Sequence[str], timeout: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd endpoints: give at least one URL such as http://127.0.0.1:2379")
        for url in endpoints:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {url!r}: expected http://host:port")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self.timeout = timeout
        self._current = 0  # the endpoint that answered last: tried first next time
        self._http = httpx.AsyncClient(timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST ``body`` to each endpoint in turn until one answers; etcd's own errors are final."""
        errors = []
        for i in range(len(self.endpoints)):
            index = (self._current + i) % len(self.endpoints)
            url = self.endpoints[index] + path
            try:
                response = await self._http.post(
                    url, content=orjson.dumps(body), timeout=timeout or self.timeout
                )
            except httpx.HTTPError as exc:
                errors.append(f"{self.endpoints[index]}: {type(exc).__name__} {exc}".rstrip())
                continue
            self._current = index
            try:
                answer = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                raise ControllerError(
                    f"etcd {self.endpoints[index]}{path}: HTTP {response.status_code}, not JSON"
                ) from None
            if not isinstance(answer, dict):
                raise ControllerError(
                    f"etcd {self.endpoints[index]}{path}: unexpected answer {answer!r:.200}"
                )
            if "error" in answer or response.status_code != 200:
                message = answer.get("message") or answer.get("error") or f"HTTP {response.status_code}"
                raise ControllerError(f"etcd {self.endpoints[index]}{path}: {message}")
            return answer
        raise ControllerError(f"etcd unreachable ({'; '.join(errors)})")

    # -- leases

    async def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: its id and the TTL etcd granted (etcd raises a TTL below its minimum)."""
        answer = await self._post("/v3/lease/grant", {"TTL": str(ttl)})
        return int(answer["ID"]), int(answer.get("TTL", 0))

    async def keepalive(self, lease: int, timeout: float | None = None) -> int:
        """Renew ``lease`` once: the TTL it has again, 0 when etcd no longer knows it (expired, revoked)."""
        answer = await self._post("/v3/lease/keepalive", {"ID": str(lease)}, timeout)
        result = answer.get("result", {})
        if "error" in answer or not isinstance(result, dict):
            raise ControllerError(f"etcd keepalive of lease {lease}: {answer!r:.200}")
        return int(result.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke ``lease`` and delete its keys; a lease etcd no longer knows is not an error."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except ControllerError as exc:
            if "lease not found" not in str(exc):
                raise

    # -- keys

    async def get(self, key: bytes, prefix: bool = False) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix) and the store revision the answer reflects."""
        body = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        answer = await self._post("/v3/kv/range", body)
        kvs = [KeyValue.from_json(kv) for kv in answer.get("kvs", ())]
        return kvs, int(answer.get("header", {}).get("revision", 0))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Set ``key``; the store revision of the write."""
        answer = await self._post("/v3/kv/put", Put(key, value, lease).to_json()["request_put"])
        return int(answer.get("header", {}).get("revision", 0))

    async def delete(self, key: bytes, prefix: bool = False) -> int:
        """Delete ``key`` (or the prefix); how many keys went."""
        answer = await self._post("/v3/kv/deleterange", Delete(key, prefix).to_json()["request_delete_range"])
        return int(answer.get("deleted", 0))

    async def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Put | Delete],
        failure: Sequence[Put | Delete] = (),
    ) -> TxnResult:
        """If every ``compare`` holds, apply ``success``, otherwise ``failure``: atomically, in one revision."""
        body = {
            "compare": [c.to_json() for c in compare],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure],
        }
        answer = await self._post("/v3/kv/txn", body)
        return TxnResult(
            bool(answer.get("succeeded", False)), int(answer.get("header", {}).get("revision", 0))
        )

    async def watch(
        self,
        key: bytes,
        prefix: bool = False,
        start_revision: int = 0,
        retry_delay: float = 0.5,
        idle_timeout: float = 30.0,
    ) -> AsyncIterator[WatchEvent]:
        """The changes of ``key`` (or the prefix) from ``start_revision`` on (0: from now), forever.

        A broken stream (etcd restarted, endpoint down) is opened again on the next endpoint every
        ``retry_delay`` seconds, resuming after the last revision delivered, so no change is lost
        or repeated; a resume point etcd already compacted away raises :class:`ControllerError`
        (the caller reads the current state again).  A stream silent for ``idle_timeout`` seconds
        is opened again too: after a network cut a half-open connection would otherwise stay
        silent forever.
        """
        request: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            request["range_end"] = _b64(prefix_end(key))
        next_revision = start_revision
        while True:
            if next_revision:
                request["start_revision"] = str(next_revision)
            endpoint = self.endpoints[self._current]
            try:
                timeout = httpx.Timeout(self.timeout, read=idle_timeout)
                body = orjson.dumps({"create_request": request})
                async with self._http.stream(
                    "POST", endpoint + "/v3/watch", content=body, timeout=timeout
                ) as rsp:
                    async for line in rsp.aiter_lines():
                        if not line.strip():
                            continue
                        message = orjson.loads(line)
                        result = message.get("result") or {}
                        if "error" in message:
                            # etcd shutting down ends the stream with an error: open it again.
                            log.debug("etcd watch on %s ended: %s", endpoint, message["error"])
                            break
                        if int(result.get("compact_revision", 0)):
                            raise ControllerError(
                                f"etcd {endpoint}/v3/watch: revision {next_revision} compacted "
                                f"(oldest kept {result['compact_revision']}); read the state again"
                            )
                        for event in result.get("events", ()):
                            kv = KeyValue.from_json(event.get("kv", {}))
                            next_revision = kv.mod_revision + 1
                            yield WatchEvent("DELETE" if event.get("type") == "DELETE" else "PUT", kv)
                        if not next_revision and "header" in result:
                            # Resume after the revision the watch started at, not "now" at reconnect.
                            next_revision = int(result["header"].get("revision", 0)) + 1
            except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
                log.debug("etcd watch on %s broke (%s); reopening", endpoint, exc)
                self._current = (self._current + 1) % len(self.endpoints)
            await asyncio.sleep(retry_delay)
