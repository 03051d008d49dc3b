"""tidemq_controller: automatic failover through etcd (issue 25).

:mod:`.replication` is the ``controller`` replication (master_slave's HA stream with the master
elected in etcd); :mod:`.etcd` the etcd v3 client surface (HTTP/JSON gateway), :mod:`.election`
the per-group master election with leases and fencing epochs, :mod:`.epochs` the epoch file kept
beside the commit log, :mod:`.status` what ``tidemq admin controllerStatus`` shows.  See README.md.
"""
