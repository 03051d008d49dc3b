"""Which implementation of the index's per-key work runs: compiled or the pure-Python reference.

``tidemq_index_hash._native`` (Cython, built by ``pip install`` next to the codec when a C
compiler is available) holds compiled versions of the key hash, the hashing of a dispatched batch
and the insertion of its entries into an IndexFile; :mod:`tidemq_index_hash.indexfile` uses them
in place of its Python ones (``py_key_hash``, ``py_hash_batch``, ``IndexFile.py_put_batch``), which
stay as the reference.  The switch is the codec's (``tidemq._native.DISABLE_VARIABLE``): with
``TIDEMQ_NO_EXTENSIONS=1`` both run pure Python.  Read once, at import.

``impl`` is the compiled module or ``None``; ``DESCRIPTION`` is one line for logs and tools, e.g.
``compiled (tidemq_index_hash._native; blake3: one chunk in C, ...)``.
"""

from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

_MODULE = "tidemq_index_hash._native"
#: The codec's switch, read the way ``tidemq._native`` reads it (one variable turns off every
#: compiled module; tests/test_native_index.py checks they agree).  Named here because plugins may
#: import only tidemq's public API, which ``tidemq._native`` is not.
DISABLE_VARIABLE = "TIDEMQ_NO_EXTENSIONS"

impl: ModuleType | None = None
if os.environ.get(DISABLE_VARIABLE, "") not in ("", "0"):
    DESCRIPTION = f"pure Python ({DISABLE_VARIABLE}=1)"
else:
    try:
        impl = importlib.import_module(_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _MODULE:
            raise
        DESCRIPTION = "pure Python (extension not built: no C compiler at install, or installed without it)"
    except ImportError as exc:  # built, but does not load here (or its self-check failed)
        warnings.warn(f"tidemq: the compiled index does not load, running pure Python: {exc}", stacklevel=2)
        DESCRIPTION = f"pure Python (extension not loadable: {exc})"
    else:
        DESCRIPTION = f"compiled ({_MODULE}; {impl.HASH_SOURCE})"

#: Whether the compiled index code is in use.
ACTIVE = impl is not None
