"""Where ``tidemq`` logs: --log-file with rotation, --log-format json, default locations, flags
before or after the sub-command, ``TIDEMQ_LOG_*`` variables (issue 22, "Logs and progress")."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tidemq.logs import JsonFormatter, parse_size
from tidemq.testing.store_contract import build_store, message

JSON_KEYS = {"time", "level", "logger", "message"}


def tidemq(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def json_lines(*paths: Path) -> list[dict]:
    """Every line of the files, each parsed as one JSON object with the documented keys."""
    records = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = orjson.loads(line)
            assert JSON_KEYS <= record.keys(), line
            records.append(record)
    return records


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store shut down cleanly: 200 records in 1 MiB commit-log files."""
    root = tmp_path_factory.mktemp("logs") / "store"
    store = build_store("mmap", root, store_options={"commitlog_file_size": 1 << 20})
    assert store.load()
    store.start()
    for i in range(200):
        assert store.put_message(message(topic="LogT", body=b"b%d" % i, queue_id=i % 2)).result(10).ok
    store.shutdown()
    yield root


def test_json_log_file_rotates_and_flags_after_the_subcommand_win(spawn, tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "tidemq.log"
    # spawn puts `--log-level INFO` before the sub-command; DEBUG after it must win.
    server = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
        "--log-file",
        str(log_file),
        "--log-format",
        "json",
        "--log-level",
        "DEBUG",
        "--log-max-bytes",
        "500",
        "--log-backups",
        "2",
        env={"TIDEMQ_TRACE_HOOKS": "1"},  # DEBUG records (every hook call)
    )
    assert server.stop() == 0
    rotated = [log_file, log_file.with_name("tidemq.log.1"), log_file.with_name("tidemq.log.2")]
    assert all(p.is_file() for p in rotated), sorted(p.name for p in log_file.parent.iterdir())
    assert not log_file.with_name("tidemq.log.3").exists()  # only --log-backups files kept
    # Rotated before a record would pass the size: a file over it holds that one record.
    assert all(p.stat().st_size <= 500 or p.read_text().count("\n") == 1 for p in rotated)
    records = json_lines(*rotated)
    levels = {r["level"] for r in records}
    assert "DEBUG" in levels and "INFO" in levels
    messages = " ".join(r["message"] for r in records)
    assert "signal received, shutting down" in messages  # the newest records are in the file
    # stderr keeps WARNING and above only, in the same format.
    for line in server.log_path.read_text().splitlines():
        assert orjson.loads(line)["level"] in ("WARNING", "ERROR", "CRITICAL"), line


def test_default_log_locations_by_flag_and_by_variable(spawn, tmp_path: Path) -> None:
    home = tmp_path / "home"
    ns = spawn(
        "namesrv",
        "--listen",
        "127.0.0.1:0",
        env={"TIDEMQ_HOME": str(home), "TIDEMQ_LOG_FILE": "auto", "TIDEMQ_LOG_FORMAT": "json"},
    )
    data = tmp_path / "broker-data"
    broker = spawn(
        "broker",
        "--listen",
        "127.0.0.1:0",
        "--namesrv",
        ns.addresses["namesrv"],
        "--data-dir",
        str(data),
        "--log-file",  # no value: the broker's default file
    )
    broker.stop()
    ns.stop()
    ns_log = home / "logs" / "namesrv.log"
    assert any("NameServer listening" in r["message"] for r in json_lines(ns_log))
    broker_log = (data / "logs" / "broker.log").read_text()
    assert " INFO tidemq.broker.broker: broker broker-a " in broker_log  # text format
    assert "store " in broker_log and " loaded in " in broker_log
    assert " INFO " not in broker.log_path.read_text()  # stderr: WARNING and above


def test_cli_task_logs_by_group_flags_variables_and_sub_command_flags(
    small_store: Path, tmp_path: Path
) -> None:
    log_file = tmp_path / "verify.log"
    done = tidemq("--log-format", "json", "--log-file", str(log_file), "store", "verify", str(small_store))
    assert done.returncode == 0, done.stderr
    assert "OK: 0 errors" in done.stdout
    found = [r for r in json_lines(log_file) if r["message"].startswith("verify: commit log:")]
    assert found and found[-1]["logger"] == "tidemq_store_mmap.verify"
    # The variable sets the level; a flag before the sub-command beats it, one after beats both.
    quiet = tidemq("store", "verify", "--no-progress", str(small_store), env={"TIDEMQ_LOG_LEVEL": "WARNING"})
    assert quiet.returncode == 0 and " INFO " not in quiet.stderr
    loud = tidemq(
        "--log-level", "INFO", "store", "verify", str(small_store), env={"TIDEMQ_LOG_LEVEL": "WARNING"}
    )
    assert " INFO tidemq_store_mmap.verify: verify: commit log:" in loud.stderr
    after = tidemq("--log-level", "WARNING", "store", "verify", "--log-level", "INFO", str(small_store))
    assert " INFO tidemq_store_mmap.verify: verify: commit log:" in after.stderr
    json_err = tidemq("store", "verify", str(small_store), env={"TIDEMQ_LOG_FORMAT": "json"})
    assert any(orjson.loads(line)["message"].startswith("verify: ") for line in json_err.stderr.splitlines())


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--log-format", "xml", "plugins"], "'xml' is not one of 'text', 'json'"),
        (["--log-max-bytes", "lots", "plugins"], "'lots' is not a size"),
        (["--log-level", "LOUD", "plugins"], "'LOUD' is not a level"),
        (["plugins", "--log-level", "LOUD"], "'LOUD' is not a level"),
        (
            ["--log-file", "/proc/no-such-dir/x.log", "plugins"],
            "tidemq: error: cannot log to /proc/no-such-dir/x.log",
        ),
    ],
    ids=["format", "size", "level", "level-after", "unwritable-file"],
)
def test_bad_log_flags_are_one_line_errors(args: list[str], expected: str) -> None:
    done = tidemq(*args)
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr


def test_json_formatter_carries_the_exception_text(tmp_path: Path) -> None:
    path = tmp_path / "j.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tidemq.test_json_formatter")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("it failed: %s", "badly", exc_info=True)
    finally:
        handler.close()
        logger.removeHandler(handler)
    (record,) = json_lines(path)
    assert record["level"] == "ERROR" and record["logger"] == "tidemq.test_json_formatter"
    assert record["message"] == "it failed: badly"
    assert "Traceback" in record["exception"] and "ValueError: boom" in record["exception"]
    assert record["time"].endswith("+00:00")


def test_sizes() -> None:
    assert parse_size("64MiB") == 64 << 20
    assert parse_size("2k") == 2048
    assert parse_size("1G") == 1 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError, match="not a size"):
        parse_size("big")


def test_http_client_request_lines_stay_out_of_the_log_unless_debug() -> None:
    # The controller renews its etcd lease every second: httpx would log each request at INFO.
    from tidemq.logs import LogSettings, configure

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        configure(LogSettings(level="INFO"))
        assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
        assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
        assert logging.getLogger("tidemq").isEnabledFor(logging.INFO)
        configure(LogSettings(level="DEBUG"))
        assert logging.getLogger("httpx").isEnabledFor(logging.INFO)
    finally:
        configure(LogSettings(level=logging.getLevelName(level)))
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        for h in handlers:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
