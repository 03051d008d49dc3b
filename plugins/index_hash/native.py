"""Which implementation of the index's per-key work runs: compiled or the pure-Python reference.

``tidemq_index_hash._native`` (Cython, built by ``pip install`` next to the codec when a C
compiler is available) holds compiled versions of the key hash, the hashing of a dispatched batch
and the insertion of its entries into an IndexFile; :mod:`tidemq_index_hash.indexfile` uses them
in place of its Python ones (``py_key_hash``, ``py_hash_batch``, ``IndexFile.py_put_batch``), which
stay as the reference.  Picked once, at import, by the kernel's :func:`tidemq.compiled_twin` (one
switch for every compiled module: ``TIDEMQ_NO_EXTENSIONS=1`` runs pure Python, and the reason is
logged when the Python path is taken).

``impl`` is the compiled module or ``None``; ``DESCRIPTION`` is one line for logs and tools, e.g.
``compiled (tidemq_index_hash._native; blake3: one chunk in C, ...)``.
"""

from __future__ import annotations

from types import ModuleType

from tidemq.extensions import compiled_twin, twins

_MODULE = "tidemq_index_hash._native"
#: The kernel's switch (``tidemq.extensions.DISABLE_VARIABLE``; tests/test_native_index.py checks
#: they agree), named here for the tests and tools that set it.
DISABLE_VARIABLE = "TIDEMQ_NO_EXTENSIONS"

impl: ModuleType | None = compiled_twin(_MODULE)
if impl is not None:
    DESCRIPTION = f"compiled ({_MODULE}; {impl.HASH_SOURCE})"
else:
    DESCRIPTION = f"pure Python ({next(t.reason for t in twins() if t.module == _MODULE)})"

#: Whether the compiled index code is in use.
ACTIVE = impl is not None
