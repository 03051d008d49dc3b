"""The ``hash`` key index: its CPU per message on the put path and in total, lag, and query rates.

Sections (each on a fresh directory; one JSON document on stdout, progress on stderr):

* ``dispatch``: the index alone, fed the way a store's put feeds it: ``dispatch_messages`` with
  batches of 32 messages, each with one KEYS entry and a UNIQ_KEY (two index entries, as a
  producer sends them).  ``put_cpu_us`` is the CPU of the dispatching thread per message (what
  the put path pays, under the store's lock); ``total_cpu_us`` the CPU of the whole process per
  message until everything is indexed and flushed (``flush()`` drains what an asynchronous index
  still holds), so it includes the index's own thread.  Three key sets: ``unique`` (every
  message its own key, default file layout), ``tiny_slots`` (the same keys in ``--tiny-slots``
  slots: long collision chains), ``hot_keys`` (``--hot`` keys shared by all messages).  Query
  rates of each follow.
* ``store``: the mmap store (async flush) with and without the hash index, ``put_messages`` of
  32 x 1 KiB with fresh keys, awaited; ``cpu_us`` is process CPU per message over the puts plus
  the final catch-up of the index, and ``index_cpu_us`` the difference the index makes.  When the
  index reports its queue (``pending()``), the queue length and the age of its oldest entry are
  sampled under load (the lag), and the time it takes to catch up once the puts stop.
* ``query_after_ack``: a put of 32 messages, then at once a query for the last key of the batch,
  repeated: whether every key is found as soon as its put is acknowledged, and the query's time.
* ``hash``: ns per key of the index hash, the compiled hash against the ``blake3`` package called
  from Python (and from the compiled module), when the compiled module is there.

``--compare-base PYTHONPATH`` runs the sections in child processes, alternating, for the code on
that path (the committed baseline: a tree whose ``tidemq``/``tidemq_*`` packages import first)
and for this tree with the compiled index and with ``TIDEMQ_NO_EXTENSIONS=1``; it reports medians
and the ratios base / new of CPU per message.  The machine is shared: compare ratios from one run.

    python bench/index_bench.py                                   # this tree, one run
    python bench/index_bench.py --compare-base /tmp/idxbase_pkgs --rounds 3 --out result.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

T0 = 1_767_225_600_000
TOPIC = "BenchTopic"
BATCH = 32
SECTIONS = ("dispatch", "store", "query_after_ack", "hash")


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def is_baseline() -> bool:
    """Whether this process runs the committed baseline index (no batch dispatch, no reference
    functions; an editable install may still resolve ``tidemq_index_hash.native`` from the tree)."""
    from tidemq_index_hash import indexfile

    return not hasattr(indexfile, "py_key_hash")


def implementation() -> str:
    """Which index code this process runs."""
    if is_baseline():
        return "baseline (per-request dispatch on the put path)"
    from tidemq_index_hash import native

    return str(native.DESCRIPTION)


def uniq(i: int) -> str:
    return f"7F00000100002A9F{i:016X}"


def gc_like_the_broker() -> None:
    """What serving processes do (TIDEMQ_GC_GEN0): the same in every variant compared."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)


# ---------------------------------------------------------------------------- dispatch (index only)
def dispatch_batches(n: int, key_of: list[str]) -> list[tuple[Any, ...]]:
    """Arguments of ``dispatch_messages`` for ``n`` messages in batches of 32 (one queue)."""
    from tidemq.message import MessageInner

    out = []
    for start in range(0, n, BATCH):
        idx = range(start, min(start + BATCH, n))
        msgs = [
            MessageInner(topic=TOPIC, body=b"", properties={"KEYS": key_of[i], "UNIQ_KEY": uniq(i)})
            for i in idx
        ]
        # One put every 3.2 ms of store time: 1 M messages span 100 s.
        out.append(
            (msgs, [i * 1100 for i in idx], [1100] * len(msgs), [0] * len(msgs), T0 + start // 10, start)
        )
    return out


def dispatch_case(
    name: str,
    root: Path,
    n: int,
    key_of: list[str],
    slots: int | None,
    queries: int,
    max_num: int,
    warm: int,
) -> dict[str, Any]:
    from tidemq.store import dispatch_messages
    from tidemq_index_hash.service import HashIndex, HashIndexOptions

    options = HashIndexOptions() if slots is None else HashIndexOptions(max_hash_slot_num=slots)
    progress(f"[dispatch/{name}] building {n} messages")
    batches = dispatch_batches(n, key_of)
    index = HashIndex(root / name / "index", options)
    index.load(True, 0)
    dispatchers = [index]
    if warm:
        # A broker's index is not fresh: the first keys of a new file fault in the pages of its
        # slot table (block allocation on the filesystem), which a fresh file's figures would show.
        progress(f"[dispatch/{name}] warming the index with {warm} other keys")
        for msgs, offs, sizes, tags, ts, qoff in dispatch_batches(warm, [f"warm-{i}" for i in range(warm)]):
            dispatch_messages(dispatchers, msgs, offs, sizes, tags, ts, qoff)
        index.flush()
    batches = [(m, [o + warm * 1100 for o in offs], s, t, ts + warm, q) for m, offs, s, t, ts, q in batches]
    gc_like_the_broker()
    p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    for b in batches:
        dispatch_messages(dispatchers, *b)
    put_cpu, put_wall = time.thread_time() - t0, time.perf_counter() - w0
    index.flush()  # indexed and durable: drains an asynchronous index's queue
    total_cpu, total_wall = time.process_time() - p0, time.perf_counter() - w0
    gc.unfreeze()
    progress(
        f"[dispatch/{name}] put path {put_cpu / n * 1e6:.2f} us/msg CPU, "
        f"total {total_cpu / n * 1e6:.2f} us/msg CPU ({total_wall:.2f}s wall)"
    )
    rng = random.Random(7)
    probes = [rng.randrange(n) for _ in range(queries)]
    t = time.perf_counter()
    hits = 0
    for i in probes:
        hits += len(index.query(TOPIC, key_of[i], max_num, 0, 2**62).phy_offsets)
    key_s = time.perf_counter() - t
    t = time.perf_counter()
    for i in probes:
        index.query(TOPIC, uniq(i), 1, 0, 2**62)
    uniq_s = time.perf_counter() - t
    t = time.perf_counter()
    for i in probes:
        index.query(TOPIC, f"missing-{i}", max_num, 0, 2**62)
    miss_s = time.perf_counter() - t
    stats = index.stats()
    index.shutdown()
    del batches
    extra = {k: stats[k] for k in ("put_drains", "lag_max_ms") if k in stats}
    return {
        **extra,
        "messages": n,
        "warm_up_messages": warm,
        "entries": stats["entries"],
        "files": stats["files"],
        "slots": options.max_hash_slot_num,
        "put_cpu_us": round(put_cpu / n * 1e6, 3),
        "total_cpu_us": round(total_cpu / n * 1e6, 3),
        "put_msgs_per_s": round(n / put_wall),
        "indexed_msgs_per_s": round(n / total_wall),
        "query_key_per_s": round(queries / key_s),
        "query_key_avg_hits": round(hits / queries, 2),
        "query_uniq_per_s": round(queries / uniq_s),
        "query_missing_per_s": round(queries / miss_s),
    }


def dispatch_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    n = args.keys
    unique = [f"order-{i}" for i in range(n)]
    hot = [f"user-{i % args.hot}" for i in range(n)]
    q, m, w = args.queries, args.max_num, args.warm
    return {
        "unique": dispatch_case("unique", root, n, unique, None, q, m, w),
        "tiny_slots": dispatch_case("tiny_slots", root, n, unique, args.tiny_slots, q, m, w),
        "hot_keys": dispatch_case("hot_keys", root, n, hot, None, q, m, w),
    }


# ---------------------------------------------------------------------------- store (put path)
def open_store(directory: Path, with_index: bool) -> tuple[Any, Any]:
    from tidemq.plugins import get_plugin_manager
    from tidemq.testing.store_contract import build_store

    index = None
    if with_index:
        index = get_plugin_manager().create("index", "hash", data_dir=directory)
    store = build_store(
        "mmap",
        directory,
        flush="async",
        index=index,
        store_options={"commitlog_file_size": 1 << 30, "cq_flush_interval_ms": 1000},
    )
    if not store.load():
        raise RuntimeError("store did not load")
    store.start()
    return store, index


def store_batches(store: Any, n: int, size: int, tag: str) -> list[list[Any]]:
    from tidemq.message import MessageInner

    body = os.urandom(size)
    born = int(time.time() * 1000)
    return [
        [
            MessageInner(
                topic=TOPIC,
                body=body,
                queue_id=0,
                properties={"TAGS": "bench", "KEYS": f"{tag}-{i}", "UNIQ_KEY": uniq(i)},
                born_timestamp=born,
                born_host=("127.0.0.1", 50000),
                store_host=store.store_host,
            )
            for i in range(start, min(start + BATCH, n))
        ]
        for start in range(0, n, BATCH)
    ]


def pending_of(index: Any) -> Callable[[], tuple[int, float]] | None:
    """The index's queue probe (messages waiting, age in s of the oldest), if it has one."""
    return getattr(index, "pending", None) if index is not None else None


def store_case(root: Path, n: int, size: int, with_index: bool, warm: int) -> dict[str, Any]:
    name = "hash_index" if with_index else "no_index"
    store, index = open_store(root / name, with_index)
    try:
        progress(f"[store/{name}] warming up with {warm} messages")
        for b in store_batches(store, warm, size, "warm"):
            assert store.put_messages(b).result(60).ok
        batches = store_batches(store, n, size, name)
        probe = pending_of(index)
        if index is not None:
            index.flush()
        gc_like_the_broker()
        queued: list[int] = []
        ages: list[float] = []
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        for k, b in enumerate(batches):
            res = store.put_messages(b).result(60)
            if not res.ok:
                raise RuntimeError(f"put failed: {res.status} {res.error}")
            if probe is not None and k % 64 == 0:
                q, age = probe()
                queued.append(q)
                ages.append(age)
        put_cpu, put_thread, put_wall = (
            time.process_time() - p0,
            time.thread_time() - t0,
            time.perf_counter() - w0,
        )
        catch_up = 0.0
        if probe is not None:
            while probe()[0] and catch_up < 30:  # how long the index thread takes to catch up alone
                time.sleep(0.0005)
                catch_up = time.perf_counter() - w0 - put_wall
        if index is not None:
            index.flush()  # anything still queued is indexed (and durable) before the clock stops
        total_cpu = time.process_time() - p0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        gc.unfreeze()
        out: dict[str, Any] = {
            "messages": n,
            "warm_up_messages": warm,
            "body": size,
            "batch": BATCH,
            "cpu_us": round(total_cpu / n * 1e6, 3),
            "put_cpu_us": round(put_cpu / n * 1e6, 3),
            "put_thread_cpu_us": round(put_thread / n * 1e6, 3),
            # The kernel's share: page faults on the mapped files, writeback in fdatasync.
            "user_us": round((r1.ru_utime - r0.ru_utime) / n * 1e6, 3),
            "system_us": round((r1.ru_stime - r0.ru_stime) / n * 1e6, 3),
            "msgs_per_s": round(n / put_wall),
        }
        if index is not None:
            stats = index.stats()
            out |= {k: stats[k] for k in ("put_drains", "lag_max_ms") if k in stats}
        if queued:
            out["lag"] = {
                "samples": len(queued),
                "queued_msgs_max": max(queued),
                "queued_msgs_median": statistics.median(queued),
                "oldest_age_ms_max": round(max(ages) * 1e3, 2),
                "oldest_age_ms_median": round(statistics.median(ages) * 1e3, 2),
                "catch_up_after_puts_ms": round(catch_up * 1e3, 2),
            }
        progress(
            f"[store/{name}] {out['cpu_us']} us/msg CPU, {out['msgs_per_s']} msgs/s {out.get('lag', '')}"
        )
        return out
    finally:
        store.shutdown()
        shutil.rmtree(root / name, ignore_errors=True)


def store_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    without = store_case(root, args.store_messages, 1024, False, args.warm)
    with_index = store_case(root, args.store_messages, 1024, True, args.warm)
    with_index["index_cpu_us"] = round(with_index["cpu_us"] - without["cpu_us"], 3)
    with_index["index_put_thread_cpu_us"] = round(
        with_index["put_thread_cpu_us"] - without["put_thread_cpu_us"], 3
    )
    with_index["index_user_us"] = round(with_index["user_us"] - without["user_us"], 3)
    with_index["index_system_us"] = round(with_index["system_us"] - without["system_us"], 3)
    return {"no_index": without, "hash_index": with_index}


def query_after_ack_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    store, index = open_store(root / "qaa", True)
    try:
        batches = store_batches(store, args.probes * BATCH, 1024, "qaa")
        times = []
        missed = 0
        for b in batches:
            assert store.put_messages(b).result(60).ok
            key = b[-1].properties["KEYS"]
            t = time.perf_counter()
            found = index.query(TOPIC, key, 4, 0, 2**62).phy_offsets
            times.append(time.perf_counter() - t)
            missed += not found
        times.sort()
        out = {
            "probes": len(times),
            "not_found_right_after_ack": missed,
            "query_us_p50": round(times[len(times) // 2] * 1e6, 1),
            "query_us_p99": round(times[int(len(times) * 0.99)] * 1e6, 1),
            "query_us_max": round(times[-1] * 1e6, 1),
        }
        progress(f"[query_after_ack] {out}")
        return out
    finally:
        store.shutdown()
        shutil.rmtree(root / "qaa", ignore_errors=True)


# ---------------------------------------------------------------------------- hash
def hash_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    if is_baseline():
        return {"skipped": "no compiled index module in this tree"}
    from tidemq_index_hash import indexfile, native

    _native = native.impl
    if _native is None:
        return {"skipped": f"the compiled index does not run: {native.DESCRIPTION}"}
    keys = [f"{TOPIC}#{uniq(i)}" for i in range(args.hash_keys)]

    def best(fn: Callable[[], object]) -> float:
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t)
        return round(min(runs) / len(keys) * 1e9, 1)

    out = {
        "keys": len(keys),
        "key_bytes": len(keys[0].encode()),
        "compiled_ns": best(lambda: [_native.key_hash(k) for k in keys]),
        "package_via_compiled_ns": best(lambda: [_native.package_key_hash(k) for k in keys]),
        "python_reference_ns": best(lambda: [indexfile.py_key_hash(k) for k in keys]),
    }
    out["compiled_vs_package_via_compiled"] = round(out["package_via_compiled_ns"] / out["compiled_ns"], 2)
    out["compiled_vs_python_reference"] = round(out["python_reference_ns"] / out["compiled_ns"], 2)
    progress(f"[hash] {out}")
    return out


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "dispatch": dispatch_section,
    "store": store_section,
    "query_after_ack": query_after_ack_section,
    "hash": hash_section,
}


def run_sections(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"implementation": implementation()}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for section in args.sections.split(","):
            out[section] = RUNNERS[section](args, Path(tmp))
    return out


# ---------------------------------------------------------------------------- comparison driver
def child(args: argparse.Namespace, variant: str, base_path: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("TIDEMQ_NO_EXTENSIONS", None)
    if variant == "base":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (base_path, env.get("PYTHONPATH", "")) if p)
    elif variant == "new_pure":
        env["TIDEMQ_NO_EXTENSIONS"] = "1"
    cmd = [sys.executable, __file__, "--sections", args.sections, "--keys", str(args.keys)]
    cmd += ["--store-messages", str(args.store_messages), "--probes", str(args.probes)]
    cmd += ["--queries", str(args.queries), "--hash-keys", str(args.hash_keys), "--warm", str(args.warm)]
    if args.dir:
        cmd += ["--dir", str(args.dir)]
    progress(f"=== {variant}")
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def cpu_figures(run: dict[str, Any]) -> dict[str, float]:
    """The per-message CPU figures compared between variants, flattened."""
    out = {}
    for name, case in run.get("dispatch", {}).items():
        out[f"dispatch.{name}.put_cpu_us"] = case["put_cpu_us"]
        out[f"dispatch.{name}.total_cpu_us"] = case["total_cpu_us"]
    store = run.get("store")
    if store:
        out["store.no_index.cpu_us"] = store["no_index"]["cpu_us"]
        out["store.hash_index.cpu_us"] = store["hash_index"]["cpu_us"]
        out["store.hash_index.put_thread_cpu_us"] = store["hash_index"]["put_thread_cpu_us"]
        out["store.index_cpu_us"] = store["hash_index"]["index_cpu_us"]
        out["store.index_put_thread_cpu_us"] = store["hash_index"]["index_put_thread_cpu_us"]
        out["store.index_user_us"] = store["hash_index"]["index_user_us"]
        out["store.index_system_us"] = store["hash_index"]["index_system_us"]
    return out


def compare(args: argparse.Namespace) -> dict[str, Any]:
    variants = ("base", "new", "new_pure")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else tuple(reversed(variants))
        for v in order:
            runs[v].append(child(args, v, args.compare_base))
    medians = {}
    for v in variants:
        figures = [cpu_figures(run) for run in runs[v]]
        medians[v] = {k: round(statistics.median(f[k] for f in figures), 3) for k in figures[0]}
    ratios = {
        f"base_over_{v}": {
            k: round(medians["base"][k] / medians[v][k], 2) if medians[v][k] > 0 else None
            for k in medians["base"]
        }
        for v in ("new", "new_pure")
    }
    return {
        "bench": "index_hash",
        "command": " ".join(sys.argv),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "implementations": {v: runs[v][0]["implementation"] for v in variants},
        "median_cpu_us_per_msg": medians,
        "ratios": ratios,
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    ap.add_argument("--keys", type=int, default=200_000, help="messages of each dispatch workload")
    ap.add_argument("--queries", type=int, default=20_000, help="queries of each kind per dispatch workload")
    ap.add_argument("--max-num", type=int, default=32, help="max_num of each key query")
    ap.add_argument("--tiny-slots", type=int, default=1024, help="slot count of the tiny_slots workload")
    ap.add_argument("--hot", type=int, default=1000, help="distinct keys of the hot_keys workload")
    ap.add_argument("--warm", type=int, default=100_000, help="messages put before each timed case")
    ap.add_argument("--store-messages", type=int, default=100_000, help="messages of each store case")
    ap.add_argument("--probes", type=int, default=2000, help="puts of the query_after_ack section")
    ap.add_argument("--hash-keys", type=int, default=100_000, help="keys hashed by the hash section")
    ap.add_argument("--dir", type=Path, default=None, help="where to put files (default: a temp dir)")
    ap.add_argument("--compare-base", default=None, help="PYTHONPATH of the baseline tree: compare")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of each variant (compare)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    for section in args.sections.split(","):
        if section not in RUNNERS:
            ap.error(f"unknown section {section!r}")
    result = compare(args) if args.compare_base else run_sections(args)
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
