"""A blocking raw-socket RocketMQ remoting peer: sends any bytes, reads frames back."""

from __future__ import annotations

import resource
import socket
import time
from typing import Any

from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode


class RawConn:
    def __init__(self, address: str, timeout: float = 5.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.closed_by_peer = False
        self._ready: list[RemotingCommand] = []  # decoded, not yet returned (several per read)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_cmd(self, cmd: RemotingCommand) -> None:
        self.sock.sendall(encode_bytes(cmd))

    def recv_cmd(self, timeout: float = 5.0) -> RemotingCommand | None:
        """The next command, or ``None`` when the peer closed the connection or nothing came."""
        if self._ready:
            return self._ready.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(256 * 1024)
            except TimeoutError:
                return None
            except OSError:
                self.closed_by_peer = True
                return None
            if not data:
                self.closed_by_peer = True
                return None
            cmds = self.decoder.feed(data)
            if cmds:
                self._ready.extend(cmds[1:])
                return cmds[0]

    def call(self, cmd: RemotingCommand, timeout: float = 5.0) -> RemotingCommand | None:
        self.send_cmd(cmd)
        while True:
            resp = self.recv_cmd(timeout)
            if resp is None or resp.opaque == cmd.opaque:
                return resp

    def closed(self, timeout: float = 5.0) -> bool:
        """Whether the peer closes the connection within ``timeout`` (reading what it sends)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not data:
                return True
        return False

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def runtime_info(address: str, timeout: float = 10.0) -> RemotingCommand | None:
    """A well-formed request on a fresh connection: GET_BROKER_RUNTIME_INFO."""
    conn = RawConn(address, timeout)
    try:
        return conn.call(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), timeout)
    finally:
        conn.close()


def raise_nofile(want: int) -> None:
    """Raise this process's open-file limit to ``want`` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def pull_fields(
    topic: str,
    *,
    group: str,
    queue_id: int = 0,
    offset: int = 0,
    expression: str = "*",
    expression_type: str = "TAG",
    suspend_ms: int = 0,
    max_nums: int = 32,
) -> dict[str, Any]:
    """PULL_MESSAGE header fields with the subscription in the request (PULL_FLAG_SUBSCRIPTION)."""
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": max_nums,
        "sysFlag": 4 | (2 if suspend_ms else 0),  # subscription, and suspend when held
        "commitOffset": 0,
        "suspendTimeoutMillis": suspend_ms,
        "subscription": expression,
        "subVersion": 0,
        "expressionType": expression_type,
    }
