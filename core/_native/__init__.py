"""The compiled codec: one Cython module per family of the record layer, each the twin of a reference.

======================  ==============================================  ===========================
module                  compiled                                        Python reference
======================  ==============================================  ===========================
``_record_decode``      decode_message, iter_messages,                  :mod:`tidemq.record`
                        record_crc_ok, record_mismatch
``_batch_decode``       decode_batch, decode_batch_messages             :mod:`tidemq.record`
``_pull_walk``          scan_queue (TAG filtering in the same pass)     :mod:`tidemq.record`
``_record_encode``      RecordEncoder, pack_cq_entries                  :mod:`tidemq.record`
``_message_id``         create_message_id                               :mod:`tidemq.message_types`
======================  ==============================================  ===========================

They share ``_support.pxi`` and ``_fields.pxi`` (included: each module compiles its own copy).
Built by ``pip install`` when a C compiler is there; :mod:`tidemq.message` (and
:mod:`tidemq.message_types` for ids) picks each one at import through
:func:`tidemq.extensions.compiled_twin`, which reads ``TIDEMQ_NO_EXTENSIONS`` and
``TIDEMQ_REQUIRE_EXTENSIONS`` and logs why the Python reference runs.

Errors: the compiled code handles well-formed input and detects malformed input itself (every
read is checked against the buffer's length before it is made).  When it finds the input
malformed, or unusual in a way its fast path does not take (a field of another type, a value out
of its Java range, a string that does not encode...), it hands the same call to the reference,
which raises its own exception (or returns its result).  So exception types and messages are the
reference's by construction; each module's ``disagreements()`` counts the calls where the
reference accepted what the compiled code had refused (0 unless there is a bug: the differential
tests and the fuzzer check it).

CRC32: zlib-ng's SIMD ``zng_crc32``, called directly from the ``zlib_ng`` extension module the
reference uses (found with ``dlsym`` and checked against the Python call on known inputs at
import); through the Python call when that symbol is not there.  ``CRC32_SOURCE`` says which.

``ACTIVE`` says whether every module runs compiled; ``DESCRIPTION`` is one line for ``--version``
and the broker's start-up log, e.g. ``compiled (tidemq._native: _batch_decode, _message_id,
_pull_walk, _record_decode, _record_encode; crc32: zlib-ng direct)`` or ``pure Python
(TIDEMQ_NO_EXTENSIONS=1)``.
"""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace

from tidemq.extensions import DISABLE_VARIABLE, compiled_twin, twins

__all__ = ["ACTIVE", "DESCRIPTION", "DISABLE_VARIABLE", "MODULES", "describe", "load_all"]

#: The compiled modules, by family (``tidemq._native.<name>``).
MODULES = ("_batch_decode", "_message_id", "_pull_walk", "_record_decode", "_record_encode")


def describe(modules: dict[str, ModuleType | None], reasons: dict[str, str]) -> str:
    """One line saying which modules run compiled and why the others do not."""
    compiled = [name for name, mod in modules.items() if mod is not None]
    pure = [name for name, mod in modules.items() if mod is None]
    crc = next((m.CRC32_SOURCE for m in modules.values() if m is not None), "")
    if not pure:
        return f"compiled ({__name__}: {', '.join(compiled)}; crc32: {crc})"
    why = "; ".join(sorted({reasons[name] for name in pure}))
    if not compiled:
        return f"pure Python ({why})"
    return f"partly compiled ({__name__}: {', '.join(compiled)}; crc32: {crc}; pure Python: {', '.join(pure)}: {why})"


def load_all() -> SimpleNamespace | None:
    """Every compiled module's names in one namespace, whatever the switches say, or None when one
    is not built (the differential tests, the fuzzer and the benchmarks compare it with the reference).

    ``disagreements()`` sums the modules' counters.
    """
    names: dict[str, object] = {}
    loaded = []
    for name in MODULES:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ImportError:
            return None
        loaded.append(mod)
        names.update({k: v for k, v in vars(mod).items() if not k.startswith("__")})
    names["disagreements"] = lambda: sum(m.disagreements() for m in loaded)
    names["modules"] = tuple(loaded)
    return SimpleNamespace(**names)


_chosen = {name: compiled_twin(f"{__name__}.{name}") for name in MODULES}
_reasons = {t.module.rsplit(".", 1)[1]: t.reason for t in twins() if t.module.startswith(f"{__name__}.")}

#: Whether every compiled module is in use.
ACTIVE = all(mod is not None for mod in _chosen.values())
DESCRIPTION = describe(_chosen, _reasons)
