"""RemotingCommand: one request or response of the RocketMQ remoting protocol."""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from tidemq.remoting.codes import FLAG_ONEWAY, FLAG_RESPONSE, ResponseCode, SerializeType

#: The protocol version tidemq announces (a RocketMQ 4.x ``MQVersion`` ordinal); peers only log it.
DEFAULT_VERSION = 399
#: Opaques are Java ints on the wire: keep them positive 31-bit.
_OPAQUE_MASK = 0x7FFFFFFF
_opaque_counter = itertools.count(1)


def next_opaque() -> int:
    """A fresh process-wide request id (positive, wraps at 2**31)."""
    return next(_opaque_counter) & _OPAQUE_MASK


@attrs.define(slots=True)
class RemotingCommand:
    """A request or response.

    ``ext_fields`` values are strings on the wire (RocketMQ sends numbers as strings); the payload
    is ``body`` followed by ``body_parts``, which the transport writes without joining (pull
    responses pass the store's record buffers there).
    """

    code: int
    language: str = "PYTHON"
    version: int = DEFAULT_VERSION
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict)
    body: bytes | None = None
    body_parts: tuple[bytes | memoryview, ...] = ()
    serialize_type: SerializeType = SerializeType.JSON

    # ------------------------------------------------------------------ constructors
    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: dict[str, Any] | None = None,
        body: bytes | None = None,
        *,
        serialize_type: SerializeType = SerializeType.JSON,
    ) -> RemotingCommand:
        """A new request with a fresh opaque; non-string ext field values are stringified."""
        return cls(
            code=int(code),
            opaque=next_opaque(),
            ext_fields=stringify_fields(ext_fields) if ext_fields else {},
            body=body,
            serialize_type=serialize_type,
        )

    def reply(
        self,
        code: int = ResponseCode.SUCCESS,
        remark: str | None = None,
        ext_fields: dict[str, Any] | None = None,
        body: bytes | None = None,
        *,
        body_parts: tuple[bytes | memoryview, ...] = (),
    ) -> RemotingCommand:
        """The response to this request: same opaque and serialize type, response flag set."""
        # Positional: one per send, and attrs' __init__ binds positions faster than keywords.
        return RemotingCommand(
            int(code),
            "PYTHON",
            DEFAULT_VERSION,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            stringify_fields(ext_fields) if ext_fields else {},
            body,
            body_parts,
            self.serialize_type,
        )

    def reply_with(self, code: int, remark: str | None, ext_fields: dict[str, str]) -> RemotingCommand:
        """:meth:`reply` for a hot path whose ``ext_fields`` is a new dict of strings: it becomes
        the response's own, unchecked and uncopied (one per send)."""
        return RemotingCommand(
            int(code),
            "PYTHON",
            DEFAULT_VERSION,
            self.opaque,
            FLAG_RESPONSE,
            remark,
            ext_fields,
            None,
            (),
            self.serialize_type,
        )

    # ------------------------------------------------------------------ flags
    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def mark_oneway(self) -> RemotingCommand:
        self.flag |= FLAG_ONEWAY
        return self

    def mark_response(self) -> RemotingCommand:
        self.flag |= FLAG_RESPONSE
        return self

    # ------------------------------------------------------------------ payload helpers
    @property
    def body_size(self) -> int:
        """Bytes of payload on the wire (body plus body_parts)."""
        n = len(self.body) if self.body else 0
        for part in self.body_parts:
            n += len(part)
        return n

    def payload(self) -> bytes:
        """The whole payload as one bytes object (joins body_parts; for small bodies/tests)."""
        if not self.body_parts:
            return self.body or b""
        return b"".join([self.body or b"", *self.body_parts])

    def ext(self, name: str, default: str | None = None) -> str | None:
        return self.ext_fields.get(name, default)

    def ext_int(self, name: str, default: int | None = None) -> int | None:
        """An ext field parsed as int; ``default`` when missing or empty.

        Raises ValueError (with the field name) when present but not an integer.
        """
        raw = self.ext_fields.get(name)
        if raw is None or raw == "":
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"ext field {name}={raw!r} is not an integer") from None

    def __repr__(self) -> str:
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        return (
            f"RemotingCommand({kind} code={self.code} opaque={self.opaque} flag={self.flag} "
            f"remark={self.remark!r} ext={self.ext_fields!r} body={self.body_size}B)"
        )


def stringify(value: Any) -> str:
    """A header value as RocketMQ puts it on the wire (Java ``String.valueOf``)."""
    if type(value) is str:
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    return str(value)


def stringify_fields(fields: dict[str, Any]) -> dict[str, str]:
    """Ext fields with every value a string; ``None`` values are dropped (Java skips nulls).

    Always a new dict.  Fields that are all strings already (what processors build) are copied as
    they are: the check costs less than converting each value.
    """
    for k, v in fields.items():
        if type(v) is not str or type(k) is not str:
            # stringify() inline, as a loop: no call per value and no comprehension frame (3.11
            # makes one per call); a response's fields, once per pull answer.
            out: dict[str, str] = {}
            for key, value in fields.items():
                if value is None:
                    continue
                out[str(key)] = (
                    value
                    if type(value) is str
                    else "true"
                    if value is True
                    else "false"
                    if value is False
                    else str(value)
                )
            return out
    return dict(fields)


__all__ = ["DEFAULT_VERSION", "RemotingCommand", "next_opaque", "stringify", "stringify_fields"]
