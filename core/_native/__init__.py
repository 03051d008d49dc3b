"""Which implementation of the per-message codec runs: compiled or the pure-Python reference.

``tidemq._native._codec`` (Cython, built by ``pip install`` when a C compiler is available) holds
compiled versions of the record encoder, the SEND_BATCH_MESSAGE decoder, the record decoders and
checks, and message ids; :mod:`tidemq.message` hands them out in place of the Python ones in
:mod:`tidemq.record`.  Read once, at import: ``TIDEMQ_NO_EXTENSIONS=1`` selects pure Python.

``ACTIVE`` says whether the compiled codec runs; ``DESCRIPTION`` is one line for ``--version``
and the broker's start-up log, e.g. ``compiled (tidemq._native._codec; crc32: zlib-ng direct)``
or ``pure Python (TIDEMQ_NO_EXTENSIONS=1)``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

#: Set (to anything but "" or "0") to run the pure-Python reference even when the codec is built.
DISABLE_VARIABLE = "TIDEMQ_NO_EXTENSIONS"

codec: ModuleType | None = None
if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
    DESCRIPTION = f"pure Python ({DISABLE_VARIABLE}=1)"
else:
    try:
        codec = importlib.import_module(f"{__name__}._codec")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}._codec":
            raise
        DESCRIPTION = "pure Python (extension not built: no C compiler at install, or installed without it)"
    except ImportError as exc:  # built, but does not load here (another Python, missing symbol...)
        warnings.warn(f"tidemq: the compiled codec does not load, running pure Python: {exc}", stacklevel=2)
        DESCRIPTION = f"pure Python (extension not loadable: {exc})"
    else:
        DESCRIPTION = f"compiled ({codec.__name__}; crc32: {codec.CRC32_SOURCE})"

#: Whether the compiled codec is in use.
ACTIVE = codec is not None
