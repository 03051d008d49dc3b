"""The command line as an operator uses it."""

from __future__ import annotations

import signal
import subprocess
import sys

from conftest import free_port


def tidemq(*args: str, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def test_plugins_lists_built_ins_by_role():
    out = tidemq("plugins")
    assert out.returncode == 0, out.stderr
    sections = {}
    role = None
    for line in out.stdout.splitlines():
        if not line.startswith(" "):
            role = line.rstrip(":")
            sections[role] = []
        else:
            sections[role].append(line.split()[0])
    assert {"mmap", "memory"} <= set(sections["store"])
    assert {"sync", "async"} <= set(sections["flush"])
    assert "tcp" in sections["transport"] and "hash" in sections["index"]


def test_bad_config_is_one_line_naming_key_and_choices(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[plugins]\nflush = "fast"\n')
    out = tidemq("broker", "-c", str(cfg))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert (
        "[plugins] flush = 'fast' is not installed" in lines[0] and "async" in lines[0] and "sync" in lines[0]
    )


def test_check_config_prints_selection(tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[plugins]\nflush = "sync"\nstore = "memory"\n')
    out = tidemq("check-config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "flush = sync" in out.stdout and "store = memory" in out.stdout


def test_standalone_starts_announces_and_stops_cleanly(spawn, tmp_path):
    data = tmp_path / "data"
    ns_port, broker_port = free_port(), free_port()
    server = spawn(
        "standalone",
        "--data-dir",
        str(data),
        "--namesrv-listen",
        f"127.0.0.1:{ns_port}",
        "--broker-listen",
        f"127.0.0.1:{broker_port}",
    )
    assert server.addresses == {"namesrv": f"127.0.0.1:{ns_port}", "broker": f"127.0.0.1:{broker_port}"}
    assert (data / "abort").exists()  # the store marks itself running in the embedded directory
    assert server.stop(signal.SIGTERM) == 0
    assert not (data / "abort").exists()  # a clean stop: the next start needs no crash recovery


def test_port_in_use_is_a_clear_error(spawn):
    server = spawn("namesrv", "--listen", f"127.0.0.1:{free_port()}")
    out = tidemq("namesrv", "--listen", server.addresses["namesrv"], timeout=30)
    assert out.returncode == 2
    assert out.stderr.startswith("tidemq: error:") and "address already in use" in out.stderr.lower()


def test_corrupt_topic_table_is_a_one_line_error_naming_the_file(tmp_path):
    data = tmp_path / "data"
    (data / "config").mkdir(parents=True)
    (data / "config" / "topics.json").write_text('{"topicConfigTable": {"orders": ')
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = []\ndata_dir = "{data}"\n')
    out = tidemq("broker", "-c", str(cfg))
    assert out.returncode == 2
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tidemq: error:") and "topics.json is not valid JSON" in last
