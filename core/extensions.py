"""Compiled twins: which implementation of a module runs, picked once, at import.

A compiled module (Cython, built by ``pip install`` when a C compiler is there) is the twin of a
pure-Python reference: same names, same results.  The module that serves those names picks, once
at its import, like aiokafka's records modules::

    _decode = compiled_twin("tidemq._native._record_decode")
    if _decode is None:
        from tidemq.record import decode_message
    else:
        decode_message = _decode.decode_message

:func:`compiled_twin` is the one place that reads the switches and says why the Python reference
runs (stdlib logging, once per module):

* ``TIDEMQ_NO_EXTENSIONS=1``: every twin is the Python reference (and wins over the next one);
* ``TIDEMQ_REQUIRE_EXTENSIONS=1``: a twin that is not built, or does not load, is an
  :class:`ImportError` instead of a quiet fall back (CI sets it).

:func:`twins` lists the choices made so far (``tidemq --version`` and the broker's start-up log).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

import attrs

__all__ = ["DISABLE_VARIABLE", "REQUIRE_VARIABLE", "Twin", "compiled_twin", "twins"]

log = logging.getLogger(__name__)

#: Set (to anything but "" or "0") to run every pure-Python reference even when the twins are built.
DISABLE_VARIABLE = "TIDEMQ_NO_EXTENSIONS"
#: Set to make a missing or unloadable twin an ImportError (ignored when DISABLE_VARIABLE is set).
REQUIRE_VARIABLE = "TIDEMQ_REQUIRE_EXTENSIONS"

NOT_BUILT = "not built: no C compiler at install, or installed without it"


@attrs.frozen
class Twin:
    """One choice: the compiled module, or None with the reason the Python reference runs."""

    module: str
    compiled: ModuleType | None
    reason: str = ""


_chosen: dict[str, Twin] = {}


def _set(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def compiled_twin(module: str) -> ModuleType | None:
    """The compiled module ``module`` (an absolute import name), or None: run the Python reference.

    Decided on the first call for each module and remembered; the reason for the Python path is
    logged then (INFO when asked for or not built, WARNING when built but not loadable).
    """
    twin = _chosen.get(module)
    if twin is None:
        twin = _choose(module)
        if module in _chosen:  # chosen meanwhile, by the import itself (a package's __init__)
            return _chosen[module].compiled
        _chosen[module] = twin
        if twin.compiled is None:
            level = logging.WARNING if twin.reason.startswith("not loadable") else logging.INFO
            log.log(level, "%s: running the pure-Python reference (%s)", module, twin.reason)
    return twin.compiled


def _choose(module: str) -> Twin:
    if _set(DISABLE_VARIABLE):
        return Twin(module, None, f"{DISABLE_VARIABLE}=1")
    try:
        return Twin(module, importlib.import_module(module))
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        reason = NOT_BUILT
    except ImportError as exc:  # built, but does not load here (another Python, a missing symbol...)
        reason = f"not loadable: {exc}"
    if _set(REQUIRE_VARIABLE):
        raise ImportError(f"{REQUIRE_VARIABLE} is set but the compiled {module} is {reason}", name=module)
    return Twin(module, None, reason)


def twins() -> tuple[Twin, ...]:
    """The choices made so far, in the order the modules were first asked for."""
    return tuple(_chosen.values())
