"""tidemq: a RocketMQ 4.x compatible message broker built as a pluggy plugin framework.

The kernel is small: :mod:`tidemq.hookspecs` names the hooks, :mod:`tidemq.plugins` loads plugins
from the ``tidemq`` entry-point group and :mod:`tidemq.config` composes a broker from a TOML file
that names the plugin serving each role.
"""

import pluggy

__version__ = "0.1.0"

PROJECT = "tidemq"
#: Mark plugin functions with ``@tidemq.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)

__all__ = ["PROJECT", "__version__", "hookimpl"]
