"""Requests that reached the wrong kind of server, answered and logged so the operator sees why.

The usual cause is a client whose NameServer address is a broker's port (``set_namesrv_addr
("127.0.0.1:10911")``): it asks the broker for routes (GET_ROUTEINFO_BY_TOPIC, 105), retries, and
used to get a bare "request type 105 not supported" per try.  Now the answer says which server
it reached and where the request goes, and the server logs that once per peer, not per request.
"""

from __future__ import annotations

import logging

from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

__all__ = ["BROKER_REQUESTS", "NAMESRV_REQUESTS", "UnsupportedRequests"]

_rc = RequestCode
#: Requests only a NameServer serves.
NAMESRV_REQUESTS = frozenset(
    {
        _rc.REGISTER_BROKER,
        _rc.UNREGISTER_BROKER,
        _rc.GET_ROUTEINFO_BY_TOPIC,
        _rc.GET_BROKER_CLUSTER_INFO,
        _rc.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
        _rc.PUT_KV_CONFIG,
        _rc.GET_KV_CONFIG,
        _rc.DELETE_KV_CONFIG,
        _rc.GET_KVLIST_BY_NAMESPACE,
        _rc.WIPE_WRITE_PERM_OF_BROKER,
        _rc.GET_TOPICS_BY_CLUSTER,
        _rc.UPDATE_NAMESRV_CONFIG,
        _rc.GET_NAMESRV_CONFIG,
    }
)
#: Requests a client sends to brokers only (the common ones: a NameServer address used as a broker's).
BROKER_REQUESTS = frozenset(
    {
        _rc.SEND_MESSAGE,
        _rc.SEND_MESSAGE_V2,
        _rc.SEND_BATCH_MESSAGE,
        _rc.PULL_MESSAGE,
        _rc.HEART_BEAT,
        _rc.QUERY_MESSAGE,
        _rc.VIEW_MESSAGE_BY_ID,
        _rc.UPDATE_AND_CREATE_TOPIC,
    }
)

#: Distinct (peer host, code) pairs remembered for log-once; past it, nothing more is logged
#: (a peer cycling through codes must not grow memory or the log).
_MAX_REMEMBERED = 1024


def _name(code: int) -> str:
    try:
        return f"{RequestCode(code).name} ({code})"
    except ValueError:
        return f"request code {code}"


class UnsupportedRequests:
    """Answers codes a server does not serve; logs each (peer host, code) once.

    ``server`` is ``"broker"`` or ``"NameServer"``; ``address`` is where it listens (for the log).
    """

    def __init__(self, server: str, logger: logging.Logger) -> None:
        self.server = server
        self._log = logger
        self._seen: set[tuple[str, int]] = set()

    def remark(self, code: int) -> str:
        """The answer's remark: what was asked, of which server, and where it goes."""
        what = _name(code)
        if self.server == "broker" and code in NAMESRV_REQUESTS:
            return (
                f"this is a tidemq broker, not a NameServer: {what} goes to a NameServer; "
                "set the client's NameServer address to the NameServer's port (tidemq standalone: 9876), "
                "not the broker's"
            )
        if self.server == "NameServer" and code in BROKER_REQUESTS:
            return (
                f"this is a tidemq NameServer, not a broker: {what} goes to a broker; give the client "
                "this address as its NameServer address and it finds the brokers itself"
            )
        return f"{what} is not supported by the tidemq {self.server}"

    def answer(self, request: RemotingCommand, remote: str, listen: str = "") -> RemotingCommand:
        """The REQUEST_CODE_NOT_SUPPORTED answer to ``request``; the first per peer is logged."""
        remark = self.remark(request.code)
        host = remote.rsplit(":", 1)[0]
        key = (host, request.code)
        if key not in self._seen and len(self._seen) < _MAX_REMEMBERED:
            self._seen.add(key)
            misdirected = (self.server == "broker" and request.code in NAMESRV_REQUESTS) or (
                self.server == "NameServer" and request.code in BROKER_REQUESTS
            )
            at = f" on {listen}" if listen else ""
            self._log.log(
                logging.WARNING if misdirected else logging.INFO,
                "request from %s%s: %s (logged once per client host)",
                remote,
                at,
                remark,
            )
        return request.reply(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark)
