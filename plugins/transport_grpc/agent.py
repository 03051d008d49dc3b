"""Who a v5 client is, as the broker's registries show it: RocketMQ's ``LanguageCode`` and
``MQVersion`` of its user agent.

A client says it twice: in its Settings (``user_agent``: a ``Language`` enum value and a version
string) and in every call's metadata (``x-mq-language: PYTHON``, ``x-mq-client-version: 5.1.2``,
``x-mq-protocol: GRPC_V2``).  The Settings win; the metadata serves a client whose Settings carry
no user agent.  Both the in-broker endpoint and ``tidemq proxy`` register clients with these.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import attrs

from tidemq.client import version_desc
from tidemq.remoting.command import DEFAULT_VERSION

#: apache.rocketmq.v2.Language names that RocketMQ's LanguageCode spells otherwise (the rest:
#: the same name, or OTHER when LanguageCode has none).
_LANGUAGES = {"DOT_NET": "DOTNET", "GOLANG": "GO"}
_LANGUAGE_CODES = frozenset(
    {"JAVA", "CPP", "DOTNET", "PYTHON", "GO", "PHP", "RUST", "NODE_JS", "RUBY", "ERLANG", "DELPHI"}
)


def language_code(name: str) -> str:
    """RocketMQ's LanguageCode of a v5 ``Language`` name (``OTHER`` when it has none)."""
    code = _LANGUAGES.get(name.strip().upper(), name.strip().upper())
    return code if code in _LANGUAGE_CODES else "OTHER"


@functools.lru_cache(maxsize=64)
def version_code(version: str) -> int:
    """RocketMQ's MQVersion ordinal of a client's version (``5.1.2`` -> V5_1_2's); tidemq's own
    when it names none."""
    wanted = "V" + version.strip().upper().replace(".", "_").replace("-", "_")
    for ordinal in range(2000):
        name = version_desc(ordinal)
        if name == wanted:
            return ordinal
        if name == version_desc(ordinal + 1):  # past the table's end
            break
    return DEFAULT_VERSION


@attrs.frozen
class ClientAgent:
    """A client's language (RocketMQ's LanguageCode name) and version (MQVersion ordinal)."""

    language: str = "OTHER"
    version: int = DEFAULT_VERSION


def agent_of(settings: Any = None, metadata: Iterable[tuple[str, Any]] | None = None) -> ClientAgent:
    """The client's agent from its Settings' ``user_agent``, else from a call's metadata."""
    language, version = "", ""
    if settings is not None and settings.HasField("user_agent"):
        agent = settings.user_agent
        named = agent.DESCRIPTOR.fields_by_name["language"].enum_type.values_by_number.get(agent.language)
        if named is not None and agent.language:
            language = named.name
        version = agent.version
    if not language or not version:
        for key, value in metadata or ():
            if key == "x-mq-language" and not language:
                language = str(value)
            elif key == "x-mq-client-version" and not version:
                version = str(value)
    return ClientAgent(
        language_code(language) if language else "OTHER",
        version_code(version) if version else DEFAULT_VERSION,
    )
