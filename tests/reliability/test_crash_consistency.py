"""SIGKILL a loaded broker at random moments, restart it on the same data, check every ack.

Fast subset: a few rounds per flush mode, the default configuration among them.  ``-m slow`` (tox -e reliability): 20+ rounds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .crash import run_crash_rounds

# Under async flush with the transient store pool, acknowledged data waits in an off-map buffer
# for the next commit (every 200 ms by default); a SIGKILL loses at most that much, plus the time a
# busy 2-core machine delays the commit thread.
ASYNC_COMMIT_INTERVAL_MS = 200
ASYNC_LOSS_WINDOW_MS = ASYNC_COMMIT_INTERVAL_MS + 3000


def report(name: str, summary: dict) -> None:
    # Visible with -s and in the tox log: the figures the README's report is made of.
    print(f"\nRELIABILITY {name} {json.dumps(summary)}", file=sys.stderr)


def assert_sync_run(run) -> None:
    s = run.summary()
    assert run.kills == run.rounds and run.acked > 0
    assert run.check.lost == 0, run.check.lost_examples
    assert run.check.found == run.acked
    assert run.check.corrupt_served == 0 and run.check.duplicated_served == 0
    assert run.check.offset_gaps == 0
    assert run.verify_errors_after_crash == 0
    assert run.verify_final["ok"], run.verify_final
    assert run.verify_final["records"] >= run.acked, s


def assert_async_run(run) -> None:
    assert run.kills == run.rounds and run.acked > 0
    # Whatever was lost was acknowledged within the commit window before a kill.
    assert max(run.lost_age_ms, default=0) <= ASYNC_LOSS_WINDOW_MS, sorted(run.lost_age_ms)[-10:]
    assert run.check.corrupt_served == 0 and run.check.duplicated_served == 0
    assert run.check.offset_gaps == 0
    assert run.verify_errors_after_crash == 0
    assert run.verify_final["ok"], run.verify_final


def test_sync_flush_keeps_every_acknowledged_message(tmp_path: Path) -> None:
    run = run_crash_rounds(tmp_path, 3, flush="sync", seed=1)
    report("crash-sync-fast", run.summary())
    assert_sync_run(run)


def test_async_flush_loses_only_the_last_commit_window(tmp_path: Path) -> None:
    run = run_crash_rounds(tmp_path, 2, flush="async", transient=True, seed=2)
    report("crash-async-fast", run.summary())
    assert_async_run(run)


@pytest.mark.slow
def test_sync_flush_20_rounds(tmp_path: Path) -> None:
    run = run_crash_rounds(tmp_path, 20, flush="sync", seed=11)
    report("crash-sync-20", run.summary())
    assert_sync_run(run)


@pytest.mark.slow
def test_sync_flush_transient_pool_20_rounds(tmp_path: Path) -> None:
    run = run_crash_rounds(tmp_path, 20, flush="sync", transient=True, seed=12)
    report("crash-sync-transient-20", run.summary())
    assert_sync_run(run)


def test_default_configuration_loses_nothing_on_sigkill(tmp_path: Path) -> None:
    """The defaults (async flush, no transient pool): records go straight into the mapped files, so
    a process kill leaves them in the page cache and every acknowledged message survives."""
    run = run_crash_rounds(tmp_path, 3, flush="async", transient=False, seed=4)
    report("crash-async-mapped-fast", run.summary())
    assert_sync_run(run)


@pytest.mark.slow
def test_async_flush_without_transient_pool_loses_nothing_on_sigkill(tmp_path: Path) -> None:
    """The default configuration over 10 rounds."""
    run = run_crash_rounds(tmp_path, 10, flush="async", transient=False, seed=14)
    report("crash-async-mapped-10", run.summary())
    assert_sync_run(run)


@pytest.mark.slow
def test_async_flush_20_rounds(tmp_path: Path) -> None:
    run = run_crash_rounds(tmp_path, 20, flush="async", transient=True, seed=13)
    report("crash-async-transient-20", run.summary())
    assert_async_run(run)


def test_verify_command_reports_a_clean_store(tmp_path: Path) -> None:
    """``tidemq store verify`` exits 0 with a JSON report on a store shut down cleanly."""
    run = run_crash_rounds(tmp_path, 1, flush="sync", seed=3)
    assert run.verify_final["ok"]
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "store", "verify", "--json", str(tmp_path / "broker-data")],
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    rep = json.loads(out.stdout)
    assert rep["ok"] and rep["strict"] and rep["records"] >= run.acked and rep["index_entries"] > 0
