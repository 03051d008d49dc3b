"""Where a process's anonymous memory is: /proc smaps by mapping, glibc arenas, Python's heap.

Two halves:

* ``smaps_breakdown(pid)``, read from outside: anonymous RSS by kind of mapping (``[heap]``, the
  brk heap and glibc's main arena; anonymous mmaps split into thread-arena-sized ones (64 MiB
  reservations), 1 MiB pymalloc-arena-sized ones and the rest; private dirty pages of loaded files
  (``.so`` data, relocations); stacks), transparent huge pages, and the thread count.
* ``install()``, run inside a process (``bench/rss_site/sitecustomize.py`` calls it when
  ``TIDEMQ_RSS_PROBE_DIR`` is set, so a broker started with that directory first on PYTHONPATH
  runs it): a daemon thread that answers a request file ``req-LABEL`` in that directory with
  ``probe-LABEL.json``: glibc's ``mallinfo2`` (all arenas) and ``malloc_info`` per arena,
  pymalloc's arenas (``sys._debugmallocstats``), the live objects by type (``gc``), and, when
  ``TIDEMQ_RSS_TRACEMALLOC=N`` started ``tracemalloc`` with N frames, the top allocations by
  file:line and their growth since the ``start`` probe.  ``req-LABEL-trim`` also calls
  ``malloc_trim(0)`` after measuring and reports RssAnon before and after it.

``bench/load_test.py --probe`` drives both; this module alone does nothing.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

_ARENA_RESERVE = 64 * 1024 * 1024  # glibc HEAP_MAX_SIZE on 64-bit: a thread arena's reservation
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")


def status_kib(pid: int | str) -> dict[str, int]:
    """RssAnon, RssFile, VmRSS and Threads of /proc/PID/status."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("RssAnon", "RssFile", "RssShmem", "VmRSS", "Threads"):
            out[key] = int(rest.split()[0])
    return out


def smaps_breakdown(pid: int | str) -> dict[str, Any]:
    """Anonymous RSS of PID by kind of mapping, in KiB (the kinds are described in the module doc)."""
    maps: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = _HEADER.match(line)
        if m:
            cur = {
                "start": int(m.group(1), 16),
                "end": int(m.group(2), 16),
                "perms": m.group(3),
                "path": m.group(4).strip(),
            }
            maps.append(cur)
            continue
        if cur is None:
            continue
        key, _, rest = line.partition(":")
        if key in ("Anonymous", "AnonHugePages", "Rss", "Private_Dirty"):
            cur[key] = int(rest.split()[0])
    kinds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    huge = 0
    big: list[tuple[int, str, int]] = []
    for i, mp in enumerate(maps):
        anon = mp.get("Anonymous", 0)
        huge += mp.get("AnonHugePages", 0)
        if not anon:
            continue
        path = mp["path"]
        size = mp["end"] - mp["start"]
        if path == "[heap]":
            kind = "heap (brk: main arena)"
        elif path.startswith("[stack"):
            kind = "stack"
        elif path.startswith("["):
            kind = "other " + path
        elif path:
            kind = "file-backed private (.so data, relocations)"
        else:
            # A thread arena is a 64 MiB-aligned reservation: its used part, then PROT_NONE rest.
            nxt = maps[i + 1] if i + 1 < len(maps) else None
            arena = mp["start"] % _ARENA_RESERVE == 0 and (
                size == _ARENA_RESERVE
                or (
                    nxt is not None
                    and nxt["start"] == mp["end"]
                    and nxt["perms"].startswith("---")
                    and nxt["end"] - mp["start"] == _ARENA_RESERVE
                )
            )
            if arena:
                kind = "anon mmap: glibc thread arena (64 MiB reservation)"
            elif size == 1024 * 1024 or (size % (1024 * 1024) == 0 and size <= 16 * 1024 * 1024):
                kind = "anon mmap: 1-16 MiB (pymalloc arenas, large blocks)"
            elif size > 16 * 1024 * 1024:
                kind = "anon mmap: > 16 MiB (large tables, big malloc)"
            else:
                kind = "anon mmap: other (thread stacks, small blocks)"
            if anon >= 4096:
                big.append((anon, f"{mp['start']:x}-{mp['end']:x} {mp['perms']}", size // 1024))
        kinds[kind] += anon
        counts[kind] += 1
    big.sort(reverse=True)
    return {
        "status_kib": status_kib(pid),
        "anon_kib_by_kind": dict(kinds.most_common()),
        "mappings_by_kind": dict(counts),
        "anon_huge_pages_kib": huge,
        "largest_anon_mmaps_kib": [{"anon_kib": a, "range": r, "size_kib": s} for a, r, s in big[:12]],
    }


# ---------------------------------------------------------------------------- inside the process


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def malloc_figures() -> dict[str, Any]:
    """mallinfo2 over all arenas and malloc_info's per-arena sizes, in KiB."""
    libc = _libc()
    out: dict[str, Any] = {}
    try:
        libc.mallinfo2.restype = _Mallinfo2
        mi = libc.mallinfo2()
        out["mallinfo2_kib"] = {
            "arena_sbrk_and_thread_heaps": mi.arena // 1024,
            "mmapped_chunks": mi.hblkhd // 1024,
            "mmapped_chunk_count": mi.hblks,
            "in_use": mi.uordblks // 1024,
            "free_in_arenas": mi.fordblks // 1024,
            "releasable_top": mi.keepcost // 1024,
        }
    except AttributeError:  # glibc < 2.33
        pass
    try:
        libc.open_memstream.restype = ctypes.c_void_p
        buf = ctypes.c_char_p()
        size = ctypes.c_size_t()
        stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        xml = ctypes.string_at(buf, size.value).decode()
        libc.free(buf)
        arenas = []
        for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S):
            cur = re.search(r'<system type="current" size="(\d+)"', body)
            rest = re.search(r'<total type="rest" count="\d+" size="(\d+)"', body)
            arenas.append(
                {
                    "arena": int(nr),
                    "system_kib": int(cur.group(1)) // 1024 if cur else 0,
                    "free_kib": int(rest.group(1)) // 1024 if rest else 0,
                }
            )
        mm = re.search(r'<total type="mmap" count="(\d+)" size="(\d+)"/>\s*<system type="current"', xml)
        out["arenas"] = arenas
        out["arena_count"] = len(arenas)
        if mm:
            out["mmap_chunks_kib"] = int(mm.group(2)) // 1024
    except (AttributeError, OSError):
        pass
    return out


def pymalloc_figures() -> dict[str, int]:
    """pymalloc's arenas and blocks from sys._debugmallocstats (it writes to fd 2)."""
    r, w = os.pipe()
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(w, 2)
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(w)
    text = b""
    while chunk := os.read(r, 65536):
        text += chunk
    os.close(r)
    out: dict[str, int] = {}
    for key, pat in (
        ("arenas_allocated_current", r"# arenas allocated current\s*=\s*([\d,]+)"),
        ("arenas_highwater", r"# arenas highwater mark\s*=\s*([\d,]+)"),
        ("bytes_in_allocated_blocks", r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
        ("bytes_in_available_blocks", r"# bytes in available blocks\s*=\s*([\d,]+)"),
        ("total", r"Total\s*=\s*([\d,]+)"),
    ):
        m = re.search(pat, text.decode(errors="replace"))
        if m:
            out[key] = int(m.group(1).replace(",", ""))
    return out


def objects_by_type(top: int = 25) -> list[dict[str, Any]]:
    """The live gc-tracked objects by type name (count and sys.getsizeof total)."""
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for o in gc.get_objects():
        name = type(o).__qualname__
        counts[name] += 1
        try:
            sizes[name] += sys.getsizeof(o)
        except TypeError:
            pass
    return [
        {"type": t, "count": n, "shallow_kib": sizes[t] // 1024}
        for t, n in sizes.most_common(top)
        for n in [counts[t]]
    ]


def _trace_top(snap: tracemalloc.Snapshot, base: tracemalloc.Snapshot | None, top: int) -> dict[str, Any]:
    filt = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    snap = snap.filter_traces(filt)
    out: dict[str, Any] = {
        "traced_kib": sum(s.size for s in snap.statistics("filename")) // 1024,
        "top_by_line": [
            {"where": str(s.traceback), "kib": s.size // 1024, "count": s.count}
            for s in snap.statistics("lineno")[:top]
        ],
    }
    if base is not None:
        diff = snap.compare_to(base.filter_traces(filt), "lineno")
        out["growth_by_line"] = [
            {"where": str(d.traceback), "kib": d.size_diff // 1024, "count": d.count_diff} for d in diff[:top]
        ]
    return out


def probe(label: str, trim: bool, state: dict[str, Any]) -> dict[str, Any]:
    """All the in-process figures; ``state`` keeps the ``start`` tracemalloc snapshot."""
    t0 = time.monotonic()
    gc.collect()
    out: dict[str, Any] = {"label": label, "status_kib": status_kib("self")}
    out["threads"] = sorted(t.name for t in threading.enumerate())
    out["malloc"] = malloc_figures()
    out["pymalloc"] = pymalloc_figures()
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        out["tracemalloc"] = _trace_top(snap, state.get("start"), 30)
        if label == "start":
            state["start"] = snap
    out["objects_by_type"] = objects_by_type()
    if trim:
        before = status_kib("self")["RssAnon"]
        _libc().malloc_trim(0)
        out["malloc_trim_anon_kib"] = {"before": before, "after": status_kib("self")["RssAnon"]}
    out["probe_seconds"] = round(time.monotonic() - t0, 2)
    return out


def _serve(directory: Path) -> None:
    state: dict[str, Any] = {}
    while True:
        for req in sorted(directory.glob("req-*")):
            label = req.name[4:]
            trim = label.endswith("-trim")
            label = label.removesuffix("-trim")
            try:
                result = probe(label, trim, state)
            except Exception as exc:  # a probe must never take the broker down
                result = {"label": label, "error": repr(exc)}
            tmp = directory / f".probe-{label}.json"
            tmp.write_text(json.dumps(result, indent=1))
            os.replace(tmp, directory / f"probe-{label}.json")
            req.unlink(missing_ok=True)
        time.sleep(0.2)


def install() -> None:
    """Start the probe thread when TIDEMQ_RSS_PROBE_DIR names a directory (and tracemalloc if asked)."""
    directory = os.environ.get("TIDEMQ_RSS_PROBE_DIR")
    if not directory:
        return
    frames = int(os.environ.get("TIDEMQ_RSS_TRACEMALLOC", "0") or 0)
    if frames > 0:
        tracemalloc.start(frames)
    threading.Thread(target=_serve, args=(Path(directory),), name="rss-probe", daemon=True).start()


def request(directory: Path, label: str, trim: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Ask the probe thread of the process watching DIRECTORY for LABEL's figures (and wait)."""
    out = directory / f"probe-{label}.json"
    (directory / f"req-{label}{'-trim' if trim else ''}").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists():
            result: dict[str, Any] = json.loads(out.read_text())
            return result
        time.sleep(0.2)
    return {"label": label, "error": "no answer"}
