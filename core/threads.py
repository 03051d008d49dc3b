"""Operating-system names for the broker's threads.

Python 3.11 gives a ``threading.Thread`` a name only inside Python: ``top -H``, ``ps -L``,
``/proc/<pid>/task/<tid>/comm``, ``perf`` and ``bench/thread_cpu.py`` see every thread as the
process's name.  :func:`name_this_thread`, called first thing in a thread's run function, gives the
calling thread its Python name (its first 15 bytes: the kernel's limit) in the kernel too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
import threading

__all__ = ["MAX_NAME_BYTES", "name_this_thread", "os_name"]

log = logging.getLogger(__name__)

#: The kernel keeps 15 bytes of a thread's name (16 with the NUL).
MAX_NAME_BYTES = 15
_PR_SET_NAME = 15

_prctl = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):  # no libc to call: the threads keep the process's name
        _prctl = None


def os_name(name: str) -> bytes:
    """``name`` as the kernel keeps it: UTF-8, cut to 15 bytes without splitting a character."""
    raw = name.encode("utf-8", "replace")[:MAX_NAME_BYTES]
    return raw.decode("utf-8", "ignore").encode("utf-8")


def name_this_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its ``threading`` name) in the kernel; True if set.

    Costs one system call; does nothing where the platform has no thread names (not Linux).
    """
    if _prctl is None:
        return False
    raw = os_name(name if name is not None else threading.current_thread().name)
    if _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) != 0:
        log.debug("cannot name thread %r: errno %d", raw, ctypes.get_errno())
        return False
    return True
