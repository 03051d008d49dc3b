"""The ``controller`` plugin (entry point ``controller``): elected masters through etcd.

Registers nothing yet: the ``controller`` replication is being wired (issue 25).
"""

from __future__ import annotations
