"""Where the default test suite's time goes: parse pytest's ``--durations=0`` report into JSON.

Run the suite with ``--durations=0 --durations-min=0 -p no:cacheprovider`` and save its output, then:

    python bench/suite_durations.py OUTPUT.txt --wall SECONDS --out RESULT.json [--top 40]

The JSON holds, per test (setup + call + teardown) and per file, the summed seconds, sorted
largest first, the pytest summary line and the load average when parsed.  ``--compare BEFORE.json``
prints the per-file difference against an earlier result.  A ranking tool: the machine's load
inflates every figure, so compare runs made under similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*)$")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([0-9.]+)s")


def parse(text: str) -> dict[str, Any]:
    tests: dict[str, dict[str, float]] = defaultdict(lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0})
    summary = ""
    reported = 0.0
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            tests[m.group(3).strip()][m.group(2)] += float(m.group(1))
            continue
        s = SUMMARY.match(line)
        if s:
            summary, reported = s.group(1), float(s.group(2))
    files: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for nodeid, phases in tests.items():
        path = nodeid.split("::", 1)[0]
        files[path] += sum(phases.values())
        counts[path] += 1
    per_test: list[dict[str, Any]] = sorted(
        (
            {"test": k, **{p: round(v, 3) for p, v in ph.items()}, "total": round(sum(ph.values()), 3)}
            for k, ph in tests.items()
        ),
        key=lambda r: -float(r["total"]),
    )
    per_file: list[dict[str, Any]] = sorted(
        ({"file": f, "seconds": round(s, 2), "tests": counts[f]} for f, s in files.items()),
        key=lambda r: -float(r["seconds"]),
    )
    return {
        "summary": summary,
        "pytest_reported_seconds": reported,
        "sum_of_test_seconds": round(sum(files.values()), 1),
        "per_file": per_file,
        "per_test": per_test,
    }


def dumps(result: dict[str, Any]) -> str:
    """JSON with one line per file and per test (a diff shows which moved)."""
    parts = []
    for key, value in result.items():
        if isinstance(value, list):
            rows = ",\n  ".join(json.dumps(row) for row in value)
            parts.append(f"{json.dumps(key)}: [\n  {rows}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", type=Path, help="the pytest output with --durations=0")
    ap.add_argument("--out", type=Path, help="write the JSON here")
    ap.add_argument("--wall", type=float, help="the run's wall-clock seconds, if measured outside pytest")
    ap.add_argument("--note", default="", help="a note stored in the JSON (load, machine, command)")
    ap.add_argument("--top", type=int, default=30, help="files and tests to print")
    ap.add_argument("--compare", type=Path, help="an earlier result: print per-file differences")
    args = ap.parse_args()
    result = parse(args.output.read_text(errors="replace"))
    result["wall_seconds"] = args.wall
    result["note"] = args.note
    result["loadavg_at_parse"] = os.getloadavg()
    if args.out:
        args.out.write_text(dumps(result))
    print(
        result["summary"],
        "in",
        result["pytest_reported_seconds"],
        "s; sum of tests",
        result["sum_of_test_seconds"],
    )
    for row in result["per_file"][: args.top]:
        print(f"{row['seconds']:9.2f}  {row['tests']:4d}  {row['file']}")
    print()
    for row in result["per_test"][: args.top]:
        print(
            f"{row['total']:8.2f}  (setup {row['setup']:.2f} call {row['call']:.2f} teardown {row['teardown']:.2f})  {row['test']}"
        )
    if args.compare:
        before = {r["file"]: r["seconds"] for r in json.loads(args.compare.read_text())["per_file"]}
        after = {r["file"]: r["seconds"] for r in result["per_file"]}
        rows = sorted(set(after), key=lambda f: after.get(f, 0) - before.get(f, 0))
        print("\nper file, after - before (s):")
        for f in rows:
            d = after.get(f, 0) - before.get(f, 0)
            if abs(d) >= 1.0:
                print(f"{d:+9.2f}  {before.get(f, 0):8.2f} -> {after.get(f, 0):8.2f}  {f}")


if __name__ == "__main__":
    main()
