"""The duplicate window's SIGKILL rounds under the official client, outside pytest's timeout.

    python bench/dedup_crash_rounds.py [--rounds 100] [--seed 3737] [--control] [--out FILE]

Runs ``tests/test_dedup_crash.py``'s ``official_crash_rounds`` (4 ``rocketmq==0.4.4`` producers
sending without pause while the broker is SIGKILLed and restarted ``--rounds`` times; every
message read back and counted by body) and prints JSON: acknowledged sends, send errors, stored,
duplicates, lost (acknowledged, not stored), resends the window dropped; ``--control`` runs the
same with the window off.  The slow test asserts the same figures (its timeout is for CI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "compat")]

from test_dedup_crash import official_crash_rounds  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--seed", type=int, default=3737)
    p.add_argument("--control", action="store_true", help="also run the rounds with the window off")
    p.add_argument("--out", help="write the JSON here too")
    args = p.parse_args()
    result: dict[str, object] = {"command": " ".join(sys.argv), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="tidemq-dedup-crash-") as tmp:
        started = time.monotonic()
        result["window_on"] = official_crash_rounds(Path(tmp) / "on", args.rounds, seed=args.seed)
        result["window_on_seconds"] = round(time.monotonic() - started, 1)
        if args.control:
            started = time.monotonic()
            result["window_off"] = official_crash_rounds(
                Path(tmp) / "off", args.rounds, seed=args.seed, broker={"dedup_window_s": 0}
            )
            result["window_off_seconds"] = round(time.monotonic() - started, 1)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
