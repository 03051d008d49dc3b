"""The RocketMQ remoting protocol: codes, commands, the sans-IO codec and body formats."""

from tidemq.remoting.codec import FrameDecoder, encode
from tidemq.remoting.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.errors import (
    FrameError,
    HeaderError,
    ProtocolError,
    RemotingConnectError,
    RemotingError,
    RemotingSendError,
    RemotingTimeoutError,
)

__all__ = [
    "FrameDecoder",
    "FrameError",
    "HeaderError",
    "LanguageCode",
    "ProtocolError",
    "RemotingCommand",
    "RemotingConnectError",
    "RemotingError",
    "RemotingSendError",
    "RemotingTimeoutError",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "encode",
]
