"""Mutation testing of the modules that keep data safe (``tox -e mutation``), with cosmic-ray.

cosmic-ray mutates the source files in place, one mutant at a time, and runs a test command: that
works with tidemq's layout (``core/`` imported as ``tidemq`` through the editable install, brokers
started as subprocesses), where a tool that copies the tree elsewhere (mutmut 3) never runs its
mutants.  Do not edit the tree while it runs; each mutant is reverted after its tests.

Each AREA names a module, the functions in it that are mutated (every other mutant is skipped, to
keep the run within minutes on a shared 2-core machine) and the tests that bear on them.
``--tests before`` runs the tests that existed before issue 42; ``after`` adds its new tests and,
since they only add tests, reruns only the mutants the ``before`` run left alive.

    python tests/mutation/run.py --tests after --out bench/results/2026-11-28/mutation-after.json
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]


@attrs.frozen
class Area:
    name: str
    module: str
    functions: tuple[str, ...]
    before: tuple[str, ...]  # pytest arguments
    after: tuple[str, ...]  # run first: the new tests kill fastest
    timeout_s: float = 60.0


AREAS = (
    Area(
        "offsets",
        "core/broker/offsets.py",
        ("commit", "persist", "load"),
        (
            "tests/test_rocketmq_data_files.py",
            "tests/test_broker_processors.py::test_consumer_offsets_survive_restart",
        ),
        ("tests/test_offsets_crash.py",),
    ),
    Area(
        "send-retry",
        "core/broker/processors/send.py",
        ("_route_retry",),
        ("tests/test_broker_processors.py", "-k", "retry or dead"),
        ("tests/test_send_edges.py", "-k", "dlq"),
    ),
    Area(
        "ha-auth",
        "plugins/ha_replication/wire.py",
        ("auth_mac", "load_key"),
        ("tests/test_ha_auth.py",),
        ("tests/test_ha_auth_vector.py",),
    ),
    Area(
        "acl-verify",
        "core/acl.py",
        ("verify_signature",),
        ("tests/test_acl_signature.py",),
        ("tests/test_acl_empty_signature.py",),
    ),
    Area(
        "controller-truncate",
        "plugins/controller/epochs.py",
        ("consistent_point",),
        ("tests/test_controller_epochs.py", "-k", "consistent_point"),
        ("tests/test_controller_truncation_point.py",),
    ),
)


def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where ``module``'s annotations are: with ``from __future__ import annotations`` they are
    never evaluated, so a mutant inside one is equivalent (it cannot be killed) and is skipped."""
    spans = []
    for node in ast.walk(ast.parse((ROOT / module).read_text())):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            notes.append(node.annotation)
        for note in notes:
            if note is not None and note.end_lineno is not None and note.end_col_offset is not None:
                spans.append(((note.lineno, note.col_offset), (note.end_lineno, note.end_col_offset)))
    return spans


def in_annotation(pos: tuple[int, int], spans: list[tuple[tuple[int, int], tuple[int, int]]]) -> bool:
    return any(start <= (pos[0], pos[1]) < end for start, end in spans)


def command(area: Area, which: str) -> str:
    args = list(area.before) if which == "before" else [*area.after]
    return " ".join([*PYTEST, *(f"'{a}'" if " " in a else a for a in args)])


def run_area(area: Area, which: str, work: Path, only: set[str] | None) -> dict[str, Any]:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    config = work / f"{area.name}.toml"
    session = work / f"{area.name}-{which}.sqlite"
    test_command = command(area, which)
    if which == "after":  # the old tests stay: a mutant they kill is killed either way
        test_command = command(area, "after") + " && " + command(area, "before")
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{area.module}"\n'
        f"timeout = {area.timeout_s}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps('bash -c ' + json.dumps(test_command))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    cr = [sys.executable, "-m", "cosmic_ray.cli"]
    subprocess.run([*cr, "init", str(config), str(session), "--force"], cwd=ROOT, check=True)
    spans = annotation_spans(area.module)
    equivalent = 0
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.pending_work_items:
            m = item.mutations[0]
            key = f"{m.operator_name}@{m.start_pos[0]}:{m.start_pos[1]}#{m.occurrence}"
            skip = m.definition_name not in area.functions or (only is not None and key not in only)
            if not skip and in_annotation(m.start_pos, spans):
                skip, equivalent = True, equivalent + 1
            if skip:
                db.set_result(
                    item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="out of scope")
                )
    started = time.monotonic()
    subprocess.run([*cr, "exec", str(config), str(session)], cwd=ROOT, check=True)
    seconds = time.monotonic() - started
    killed: list[dict[str, Any]] = []
    survived: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            m = item.mutations[0]
            row = {
                "key": f"{m.operator_name}@{m.start_pos[0]}:{m.start_pos[1]}#{m.occurrence}",
                "function": m.definition_name,
                "line": m.start_pos[0],
                "operator": m.operator_name,
                "outcome": str(result.test_outcome),
                "diff": result.diff,
            }
            if result.worker_outcome != WorkerOutcome.NORMAL:
                other.append({**row, "outcome": str(result.worker_outcome)})
            elif result.is_killed:
                killed.append(row)
            else:
                survived.append(row)
    return {
        "area": area.name,
        "module": area.module,
        "functions": list(area.functions),
        "tests": test_command,
        "killed": len(killed),
        "survived": len(survived),
        "errors": len(other),
        "skipped_in_annotations": equivalent,
        "seconds": round(seconds, 1),
        "survivors": survived,
        "killed_keys": [k["key"] for k in killed],
        "errored": other,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", choices=("before", "after"), default="after")
    parser.add_argument("--area", action="append", help="only these areas (default: all)")
    parser.add_argument("--before-report", help="after: rerun only this before-run's survivors")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    previous = json.loads(Path(args.before_report).read_text()) if args.before_report else None
    results = []
    with tempfile.TemporaryDirectory(prefix="tidemq-mutation-") as tmp:
        for area in AREAS:
            if args.area and area.name not in args.area:
                continue
            only = None
            if previous is not None:
                before = next(r for r in previous["areas"] if r["area"] == area.name)
                only = {s["key"] for s in before["survivors"]}
            result = run_area(area, args.tests, Path(tmp), only)
            if previous is not None:
                result["killed_before"] = before["killed"]
            results.append(result)
            print(f"{area.name}: killed {result['killed']} survived {result['survived']}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"tests": args.tests, "areas": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
