"""Progress an operator can follow (issue 22): store recovery logs files and bytes checked, rate
and a summary; a clean restart cuts nothing and says nothing about "cut" data; a crash says how
many bytes it cut; ``tidemq store verify`` measures progress in bytes present, not allocated."""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tidemq.logs import human_bytes
from tidemq.message import MESSAGE_MAGIC_CODE
from tidemq.testing.store_contract import build_store, message

FILE_SIZE = 8 << 20
CQ_ENTRIES = 100_000
RECORDS = 30_000
CONFIG = f"[store.mmap]\ncommitlog_file_size = {FILE_SIZE}\nconsumequeue_entries = {CQ_ENTRIES}\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A store shut down cleanly, 8 MiB commit-log files, about 1.6 of them written; its end offset."""
    root = tmp_path_factory.mktemp("recovery") / "store"
    store = build_store(
        "mmap",
        root,
        flush="async",
        store_options={"commitlog_file_size": FILE_SIZE, "consumequeue_entries": CQ_ENTRIES},
    )
    assert store.load()
    store.start()
    futures = [
        store.put_message(message(topic="ProgT", body=b"p%06d" % i + b"x" * 300, queue_id=i % 4))
        for i in range(RECORDS)
    ]
    assert all(f.result(30).ok for f in futures)
    end = store.get_max_phy_offset()
    store.shutdown()
    assert FILE_SIZE < end < 2 * FILE_SIZE - 2 * 1024 * 1024  # the last file is far from full
    yield root, end


@pytest.fixture
def store_copy(built: tuple[Path, int], tmp_path: Path) -> tuple[Path, Path, int]:
    """This test's own copy of the store, and a config whose file sizes match it."""
    data = tmp_path / "data"
    shutil.copytree(built[0], data)
    config = tmp_path / "broker.toml"
    config.write_text(CONFIG)
    return data, config, built[1]


def standalone(spawn, data: Path, config: Path, *flags: str, env: dict[str, str] | None = None):
    return spawn(
        "standalone",
        "-c",
        str(config),
        "--data-dir",
        str(data),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
        *flags,
        env=env,
    )


def test_clean_restart_cuts_nothing_and_logs_no_cut_at_info(spawn, store_copy, tmp_path: Path) -> None:
    data, config, end = store_copy
    log_file = tmp_path / "broker.log"
    first = standalone(spawn, data, config, "--log-file", str(log_file))
    assert first.stop() == 0  # SIGTERM: a clean shutdown
    second = standalone(spawn, data, config, "--log-file", str(log_file), "--log-level", "DEBUG")
    assert second.stop() == 0
    text = log_file.read_text()
    loads = [ln for ln in text.splitlines() if " loaded in " in ln]
    assert len(loads) == 2, text[-3000:]
    for line in loads:
        assert " INFO tidemq_store_mmap.recovery: " in line and "(clean shutdown)" in line
        assert f"commit log [0, {end})" in line and f"{RECORDS} records" in line
        assert "bytes cut" not in line
    info_and_up = [ln for ln in text.splitlines() if " DEBUG " not in ln]
    assert not [ln for ln in info_and_up if re.search(r"\bcut\b", ln)], "a clean restart reported cut data"
    assert "did not exit cleanly" not in text
    # At the default pace (a line every 2 s) a fraction-of-a-second recovery logs next to nothing.
    assert len(re.findall(r"recovery: commit log: ", text)) <= 4
    # Said at DEBUG only: the rest of the last file is unwritten.
    assert f" DEBUG tidemq_store_mmap.commitlog: commit log: valid data ends at offset {end}" in text


def test_crash_restart_logs_progress_the_bytes_cut_and_a_summary(spawn, store_copy, tmp_path: Path) -> None:
    data, config, end = store_copy
    crashed = standalone(spawn, data, config)
    crashed.stop(signal.SIGKILL)
    assert (data / "abort").exists()
    # A record torn by the crash after the last whole one: a head claiming 400 bytes, 300 written.
    last = data / "commitlog" / f"{FILE_SIZE:020d}"
    torn = (400).to_bytes(4, "big") + MESSAGE_MAGIC_CODE.to_bytes(4, "big") + b"\x55" * 292
    with open(last, "r+b") as f:
        f.seek(end - FILE_SIZE)
        f.write(torn)
    log_file = tmp_path / "after-crash.log"
    restarted = standalone(
        spawn,
        data,
        config,
        "--log-file",
        str(log_file),
        "--log-format",
        "json",
        env={"TIDEMQ_PROGRESS_EVERY": "0"},  # every update logged (the default paces them 2 s apart)
    )
    assert restarted.stop() == 0
    records = [orjson.loads(line) for line in log_file.read_text().splitlines()]
    recovery = [r for r in records if r["logger"] == "tidemq_store_mmap.recovery"]
    # Progress in bytes written (the written part of the last file), with rate.
    present = human_bytes(end + len(torn))
    steps = [r["message"] for r in recovery if r["message"].startswith("recovery: commit log: ")]
    assert len(steps) >= 3, steps
    assert all(f" of {present} (" in s and "/s" in s and s.endswith(" records") for s in steps), steps
    assert human_bytes(2 * FILE_SIZE) != present  # not the allocated size
    queue_steps = [r["message"] for r in recovery if r["message"].startswith("recovery: consume queues: ")]
    assert queue_steps and queue_steps[-1].startswith("recovery: consume queues: 4 of 4 queues (100%)")
    assert " files, " in queue_steps[-1] and queue_steps[-1].endswith(" checked")
    (cut,) = [r for r in records if "not whole records" in r["message"]]
    assert cut["level"] == "WARNING"
    assert cut["message"].startswith(f"commit log: {len(torn)} bytes after offset {end} ")
    (summary,) = [r for r in recovery if " loaded in " in r["message"]]
    assert summary["level"] == "INFO"
    assert "(after a crash)" in summary["message"]
    assert f"commit log [0, {end})" in summary["message"]
    assert f"{RECORDS} records" in summary["message"] and f"{len(torn)} bytes cut" in summary["message"]
    assert "4 consume queues" in summary["message"]
    # The torn bytes are gone: the next (clean) restart cuts nothing.
    again_log = tmp_path / "again.log"
    again = standalone(spawn, data, config, "--log-file", str(again_log))
    assert again.stop() == 0
    text = again_log.read_text()
    assert "(clean shutdown)" in text and "not whole records" not in text and "bytes cut" not in text


def _run_on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal; (exit code, stdout, terminal text without escapes)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, env={**os.environ, **env})
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.stdout is not None
    stdout = proc.stdout.read().decode()
    rc = proc.wait(30)
    return rc, stdout, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))


def test_store_verify_progress_is_measured_in_bytes_present(built: tuple[Path, int]) -> None:
    data, end = built
    present = human_bytes(end)
    allocated = human_bytes(2 * FILE_SIZE)
    verify = [sys.executable, "-m", "tidemq", "store", "verify", str(data)]
    # On a terminal: bars in bytes present, no progress log lines.
    rc, stdout, screen = _run_on_a_terminal(verify, {"COLUMNS": "150"})
    assert rc == 0 and "OK: 0 errors" in stdout, screen[-2000:]
    assert "━" in screen and f"{present} / {present}" in screen, screen[-2000:]
    assert f"/ {allocated}" not in screen
    assert "verify: commit log: " not in screen.replace("verify: commit log: " + present + " checked", "")
    # Not a terminal (or --no-progress on one): log lines at the pace asked, and a line per phase.
    done = subprocess.run(
        verify, capture_output=True, text=True, timeout=60, env={**os.environ, "TIDEMQ_PROGRESS_EVERY": "0"}
    )
    assert done.returncode == 0
    steps = [ln for ln in done.stderr.splitlines() if "verify: commit log: " in ln and " of " in ln]
    assert len(steps) >= 3 and all(f" of {present} (" in s for s in steps), done.stderr[-2000:]
    assert f"verify: commit log: {present} checked, {RECORDS} records" in done.stderr
    assert "verify: consume queues: " in done.stderr and f"{RECORDS} entries in 4 queues" in done.stderr
    assert "━" not in done.stderr
    rc, _, screen = _run_on_a_terminal([*verify, "--no-progress"], {"TIDEMQ_PROGRESS_EVERY": "0"})
    assert rc == 0 and "━" not in screen and f" of {present} (" in screen


@pytest.mark.parametrize("allocate", ["fallocate", "sparse"])
def test_written_extent_finds_the_end_of_the_written_part(tmp_path: Path, allocate: str) -> None:
    import mmap

    from tidemq_store_mmap.commitlog import written_extent

    size = 64 << 20
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if allocate == "fallocate":
            os.posix_fallocate(fd, 0, size)
        else:
            os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as m:
            view = memoryview(m)
            assert written_extent(view, 0, fd) == 0 == written_extent(view)
            end = 5 * 1024 * 1024 + 123
            m[:end] = b"\x07" * end  # through the mapping: dirty pages, not yet on disk
            for probe_fd in (fd, None):
                assert written_extent(view, 0, probe_fd) == end
                assert written_extent(view, 4096, probe_fd) == end
                assert written_extent(view, end, probe_fd) == end  # only zeros after it
            os.pwrite(fd, b"\x09" * 300, end + 4096)  # a torn write past a gap of zeros
            assert written_extent(view, end, fd) == end + 4096 + 300
            view.release()
    finally:
        os.close(fd)
