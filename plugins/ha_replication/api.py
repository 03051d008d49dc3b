r"""The public API of the ha_replication plugin, for other replication plugins (``controller``).

Everything in ``__all__`` is supported for import by other plugins; nothing else in
``tidemq_ha_replication`` is (``tests/test_public_api.py`` checks that no plugin imports
anything else from here).

- :class:`MasterSlaveReplication` and :class:`MasterSlaveOptions`: the ``master_slave``
  replication and its option table, meant to be subclassed by a replication that streams the
  same way but chooses the master otherwise (the extension points are listed in
  :mod:`tidemq_ha_replication.master_slave`'s docstring);
- :class:`HAServer` (a master's HA port, whose ``connections`` are :class:`HAConnection`\s, one
  per slave, with its broker id, acknowledged offset and catch-up time), :class:`HAClient` (a slave's stream from its master)
  and :class:`GroupTransfer` (SYNC_MASTER sends waiting for a slave's acknowledgement);
- :class:`SlaveSynchronize`: a slave's copy of its master's metadata through a
  :class:`~tidemq.replication.MetadataSink`;
- :func:`completed`: a shared resolved ``Future[ReplicaStatus]`` for answers known at once;
  :func:`broker_setting`: one key of the broker settings ``Replication.start`` receives;
  :func:`check_protected`: protected mode for the HA port (refuses a port beyond loopback
  without ``secret_file`` unless ``insecure = true``).
"""

from __future__ import annotations

from .ha_master import GroupTransfer, HAConnection, HAServer
from .ha_slave import HAClient
from .master_slave import (
    MasterSlaveOptions,
    MasterSlaveReplication,
    broker_setting,
    check_protected,
    completed,
)
from .slave_sync import SlaveSynchronize

__all__ = [
    "GroupTransfer",
    "HAConnection",
    "HAClient",
    "HAServer",
    "MasterSlaveOptions",
    "MasterSlaveReplication",
    "SlaveSynchronize",
    "broker_setting",
    "check_protected",
    "completed",
]
