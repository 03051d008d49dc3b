"""tidemq_controller: automatic failover through etcd (issue 25), the coordination layer.

:mod:`.etcd` is the etcd v3 client surface (HTTP/JSON gateway), :mod:`.election` the per-group
master election with leases and fencing epochs, :mod:`.epochs` the epoch file kept beside the
commit log, :mod:`.status` what the admin tool shows.  The broker wiring comes next; see README.md.
"""
