"""``tidemq admin``: RocketMQ's mqadmin commands, with mqadmin's names and flags, over the tcp transport.

Every command takes ``-n/--namesrv`` (``host:port;host:port``, default ``$TIDEMQ_NAMESRV`` or
``127.0.0.1:9876``).  The requests themselves are :class:`tidemq.client.admin.AdminClient`'s
(re-exported here).  One module per group of commands; importing this package registers them all
on the :data:`admin` click group.
"""

from __future__ import annotations

from tidemq.admin import acl, commands, consumers, groups_config, namesrv, stats, timer, trace  # noqa: F401  (registers the commands)
from tidemq.admin._common import DEFAULT_NAMESRV, admin
from tidemq.admin.commands import _query
from tidemq.client.admin import TIMEOUT_S, AdminClient, AdminError

__all__ = ["DEFAULT_NAMESRV", "TIMEOUT_S", "AdminClient", "AdminError", "_query", "admin"]
