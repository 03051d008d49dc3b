"""The command line as an operator uses it."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys

import pytest
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


# ---------------------------------------------------------------------------- issue 20, item 10
def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.strip().splitlines() if ln.startswith("tidemq: error:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def refused_fast(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a command that must refuse to start (one that starts is killed and fails the test)."""
    try:
        return tidemq(*args, timeout=20)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"tidemq {' '.join(args)} started instead of refusing") from exc


HOSTILE_CONFIGS = {
    "misspelt store option": ("[store.mmap]\ncommitlog_file_sise = 1048576\n", "commitlog_file_sise"),
    "size with a unit": ('[store.mmap]\ncommitlog_file_size = "16MB"\n', "commitlog_file_size"),
    "missing ACL file": (
        '[plugins]\nacl = "plain"\n[acl.plain]\nfile = "/nonexistent/plain_acl.yml"\n',
        "acl",
    ),
    "missing TLS files": (
        '[transport.tcp]\ntls = true\ntls_certfile = "/nonexistent/c.pem"\ntls_keyfile = "/nonexistent/k.pem"\n',
        "TLS",
    ),
    "port-less listen": ('[broker]\nlisten = "127.0.0.1"\n', "listen"),
    "port out of range": ('[broker]\nlisten = "127.0.0.1:109211"\n', "listen"),
    "nan interval": ("[broker]\nregister_interval_s = nan\n", "register_interval_s"),
    "flush interval zero": ("[flush.async]\ninterval_ms = 0\n", "interval_ms"),
    "sql92 option inf": ("[filter.SQL92]\nidle_expire_s = inf\n", "idle_expire_s"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_CONFIGS))
def test_check_config_refuses_what_the_broker_refuses(tmp_path, case):
    body, key = HOSTILE_CONFIGS[case]
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    if "[broker]" in body:
        body = body.replace("[broker]\n", f'[broker]\nnamesrv = []\ndata_dir = "{data}"\n')
    else:
        body = f'[broker]\nnamesrv = []\nlisten = "127.0.0.1:0"\ndata_dir = "{data}"\n' + body
    cfg.write_text(body)
    checked = one_error_line(tidemq("check-config", str(cfg)))
    assert key in checked, checked
    assert not data.exists()  # checking writes nothing into the data directory
    started = one_error_line(refused_fast("broker", "-c", str(cfg)))
    assert key in started, started


def test_check_config_accepts_a_startable_config_without_touching_the_data_dir(tmp_path):
    data = tmp_path / "data"
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = []\ndata_dir = "{data}"\n'
        "[store.mmap]\ncommitlog_file_size = 1048576\ntransient_store_pool = true\n"
    )
    out = tidemq("check-config", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "store = mmap" in out.stdout
    assert not data.exists()


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["standalone", "--broker-listen", "76447"], "--broker-listen"),
        (["standalone", "--broker-listen", "10911"], "--broker-listen"),
        (["standalone", "--namesrv-listen", "127.0.0.1:109211"], "--namesrv-listen"),
        (["broker", "--listen", "127.0.0.1:109211"], "--listen"),
        (["broker", "--namesrv", "127.0.0.1"], "--namesrv"),
        (["namesrv", "--listen", "9876"], "--listen"),
    ],
)
def test_bad_listen_flags_are_one_line_naming_the_flag(tmp_path, args, flag):
    line = one_error_line(
        refused_fast(*args, "--data-dir", str(tmp_path / "d"))
        if args[0] != "namesrv"
        else refused_fast(*args)
    )
    assert flag in line and "HOST:PORT" in line, line


def test_wildcard_listen_never_registers_loopback(spawn, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\nlisten = "0.0.0.0:0"\ninsecure = true\nnamesrv = []\ndata_dir = "{tmp_path / "data"}"\n'
    )
    try:
        server = spawn("broker", "-c", str(cfg))
    except RuntimeError as exc:  # a machine with no routable address: refused, naming advertise
        assert "advertise" in str(exc)
        return
    host = server.addresses["broker"].rsplit(":", 1)[0].strip("[]")
    assert not ipaddress.ip_address(host).is_loopback and not ipaddress.ip_address(host).is_unspecified, host


def test_wildcard_listen_registers_advertise(spawn, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\nlisten = "0.0.0.0:0"\ninsecure = true\nadvertise = "203.0.113.7:10911"\nnamesrv = []\n'
        f'data_dir = "{tmp_path / "data"}"\n'
    )
    assert spawn("broker", "-c", str(cfg)).addresses["broker"] == "203.0.113.7:10911"


def test_a_serving_process_freezes_start_up_objects_and_collects_gen0_less_often() -> None:
    probe = (
        "import gc; from tidemq.cli import tune_gc; tune_gc(); "
        "print(gc.get_threshold()[0], gc.get_freeze_count() > 1000)"
    )

    def run(**env: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            check=True,
        )
        return out.stdout.strip()

    assert run() == "50000 True"
    assert run(TIDEMQ_GC_GEN0="20000") == "20000 True"
    assert run(TIDEMQ_GC_GEN0="0") == "700 False"  # left as CPython has it


def test_version_says_which_codec_runs() -> None:
    def version(**env: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "--version"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            check=True,
        )
        return out.stdout

    assert "codec: pure Python (TIDEMQ_NO_EXTENSIONS=1)" in version(TIDEMQ_NO_EXTENSIONS="1")
    # The codec a process with the extensions switched on chooses (this one may run under
    # TIDEMQ_NO_EXTENSIONS=1, which leaves its own tidemq._native pure Python).
    chosen = subprocess.run(
        [sys.executable, "-c", "from tidemq import _native; print(_native.DESCRIPTION)"],
        capture_output=True,
        text=True,
        env={**os.environ, "TIDEMQ_NO_EXTENSIONS": ""},
        check=True,
    ).stdout.strip()
    assert chosen and f"codec: {chosen}" in version(TIDEMQ_NO_EXTENSIONS="")
