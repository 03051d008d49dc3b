"""Issue 23: the errors a new user met, each now one line naming the cause and the fix.

Real processes and sockets on loopback: ``python -m tidemq`` servers and admin commands.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from conftest import free_port

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand


def tidemq(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith(("tidemq: error:", "tidemq admin: error:")), out.stderr
    return lines[-1]


# ---------------------------------------------------------------------------- a port in use
def test_port_in_use_names_the_address_the_cause_and_the_flags(spawn, tmp_path: Path) -> None:
    ns = spawn("namesrv", "--listen", f"127.0.0.1:{free_port()}").addresses["namesrv"]
    out = tidemq("namesrv", "--listen", ns, timeout=30)
    assert out.returncode == 2
    line = one_error_line(out)
    assert f"cannot listen on {ns}: address already in use" in line
    assert "another tidemq" in line and "--listen HOST:PORT" in line and "[Errno" not in line

    out = tidemq("standalone", "--namesrv-listen", ns, "--data-dir", str(tmp_path / "data"), timeout=30)
    line = one_error_line(out)
    assert "--namesrv-listen" in line and "--broker-listen" in line


# ---------------------------------------------------------------------------- a TLS file missing
def test_missing_tls_file_names_the_key_and_the_path(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        '[transport.tcp]\ntls = true\ntls_certfile = "certs/node.crt"\ntls_keyfile = "certs/node.key"\n'
    )
    for args in (
        ["check-config", str(cfg)],
        ["namesrv", "-c", str(cfg), "--listen", f"127.0.0.1:{free_port()}"],
    ):
        out = tidemq(*args, timeout=30)
        assert out.returncode == 2, out.stderr
        line = one_error_line(out)
        assert "tls_certfile = 'certs/node.crt': no such file" in line, line
        assert "relative to" in line and "Errno" not in line


def test_unreadable_tls_file_is_named(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    cert = tmp_path / "node.crt"
    cert.write_text("x")
    cert.chmod(0)
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'[transport.tcp]\ntls = true\ntls_certfile = "{cert}"\ntls_keyfile = "{cert}"\n')
    line = one_error_line(tidemq("check-config", str(cfg)))
    assert f"tls_certfile = '{cert}': not readable" in line


# ---------------------------------------------------------------------------- an option out of range
def test_memory_ratio_out_of_range_names_the_option_and_its_range(tmp_path: Path) -> None:
    """``access_message_in_memory_max_ratio`` (accessMessageInMemoryMaxRatio) is a percentage."""
    cfg = tmp_path / "broker.toml"
    for bad in ("150", "-1"):
        cfg.write_text(f"[broker]\naccess_message_in_memory_max_ratio = {bad}\n")
        out = tidemq("check-config", str(cfg))
        assert out.returncode == 2, out.stderr
        line = one_error_line(out)
        assert f"access_message_in_memory_max_ratio = {bad} must be >= 0 and <= 100" in line, line
    cfg.write_text("[broker]\naccess_message_in_memory_max_ratio = 10\n")
    assert tidemq("check-config", str(cfg)).returncode == 0


# ---------------------------------------------------------------------------- a client at the wrong port
def _ask(addr: str, code: int, times: int) -> list[RemotingCommand]:
    async def run() -> list[RemotingCommand]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            return [
                await client.invoke(addr, RemotingCommand.request(code, {"topic": "orders"}), 5.0)
                for _ in range(times)
            ]
        finally:
            await client.close()

    return asyncio.run(run())


def test_nameserver_request_at_a_broker_says_so_once(spawn, tmp_path: Path) -> None:
    """A client given the broker's port as its NameServer: the answer says where routes come from,
    and the broker logs it once (it used to log "request code 105 ... not supported" per retry)."""
    server = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{free_port()}",
        "--broker-listen",
        f"127.0.0.1:{free_port()}",
    )
    answers = _ask(server.addresses["broker"], RequestCode.GET_ROUTEINFO_BY_TOPIC, 3)
    for resp in answers:
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert "this is a tidemq broker, not a NameServer" in resp.remark
        assert "GET_ROUTEINFO_BY_TOPIC (105)" in resp.remark and "NameServer's port" in resp.remark
    # And the other way round: a send at the NameServer port.
    (resp,) = _ask(server.addresses["namesrv"], RequestCode.SEND_MESSAGE_V2, 1)
    assert "this is a tidemq NameServer, not a broker" in resp.remark
    server.stop()
    log = server.log_path.read_text()
    warnings = [line for line in log.splitlines() if "not a NameServer" in line]
    assert len(warnings) == 1 and " WARNING " in warnings[0], log[-3000:]
    assert "not supported" not in log


# ---------------------------------------------------------------------------- admin commands
@pytest.fixture
def no_auto_create(spawn, tmp_path: Path) -> str:
    """A standalone whose broker does not create topics on first send; its NameServer address."""
    cfg = tmp_path / "standalone.toml"
    cfg.write_text("[broker]\nauto_create_topic = false\n")
    server = spawn(
        "standalone",
        "-c",
        str(cfg),
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{free_port()}",
        "--broker-listen",
        f"127.0.0.1:{free_port()}",
    )
    return server.addresses["namesrv"]


def test_admin_send_to_a_missing_topic_says_how_to_create_it(no_auto_create: str) -> None:
    out = tidemq("admin", "sendMessage", "-n", no_auto_create, "-t", "NoSuchTopic", "-p", "hello")
    assert out.returncode == 1
    line = one_error_line(out)
    assert "topic 'NoSuchTopic' does not exist" in line and "auto_create_topic = false" in line
    assert "tidemq admin updateTopic -t NoSuchTopic" in line and "TBW102" not in line
    # Following the advice works.
    assert tidemq("admin", "updateTopic", "-n", no_auto_create, "-t", "NoSuchTopic").returncode == 0
    sent = tidemq("admin", "sendMessage", "-n", no_auto_create, "-t", "NoSuchTopic", "-p", "hello")
    assert sent.returncode == 0 and "SEND_OK" in sent.stdout, sent.stderr


def test_query_by_producer_id_without_topic_asks_for_it(no_auto_create: str) -> None:
    ns = no_auto_create
    assert tidemq("admin", "updateTopic", "-n", ns, "-t", "Orders").returncode == 0
    with BlockingProducer("first-hour-pg", ns) as producer:
        deadline = time.monotonic() + 20
        while True:
            try:
                res = producer.send(Message("Orders", b"hello", keys="order-1"))
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    assert res.status is SendStatus.SEND_OK
    # The official client's ids put the IP in the other byte order: 127.0.0.1 reads as 1.0.0.127.
    official_style = "0100007F0000B8CD000006CAA17C0100"
    for msg_id in (res.msg_id, official_style):
        start = time.monotonic()
        out = tidemq("admin", "queryMsgById", "-n", ns, "-i", msg_id)
        assert out.returncode == 1
        line = one_error_line(out)
        assert (
            "is not an offset message id of this cluster" in line and "no broker the NameServer knows" in line
        )
        assert f"tidemq admin queryMsgById -i {msg_id} -t TOPIC" in line and "frame" not in line
        assert time.monotonic() - start < 30  # no connection to whatever the id names
    found = tidemq("admin", "queryMsgById", "-n", ns, "-i", res.msg_id, "-t", "Orders")
    assert found.returncode == 0 and "Message Body:        hello" in found.stdout, found.stderr
    by_offset = tidemq("admin", "queryMsgById", "-n", ns, "-i", res.offset_msg_id)
    assert by_offset.returncode == 0 and f"OffsetID:            {res.offset_msg_id}" in by_offset.stdout


# ---------------------------------------------------------------------------- --version, --show
def test_version_names_the_version_and_each_compiled_extension() -> None:
    out = tidemq("--version", env={"TIDEMQ_NO_EXTENSIONS": ""})  # the extensions on, whatever this run has
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tidemq, version ")
    assert lines[1].startswith("codec: ") and lines[2].startswith("hash index: ")
    assert lines[3].startswith("request lanes: SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE (compiled")
    assert lines[4].startswith("spark columns: ")
    assert "pull lane: PULL_MESSAGE (compiled: tidemq._native._pull_lane)" in lines[5]
    assert lines[6].startswith("sync flush rounds: compiled (tidemq_flush._round")
    assert lines[7].startswith("store group put: compiled (tidemq_store_mmap._group_put")
    pure = tidemq("--version", env={"TIDEMQ_NO_EXTENSIONS": "1"}).stdout
    assert "codec: pure Python" in pure and "hash index: pure Python" in pure
    assert "request lanes: none (the Python handlers serve every request" in pure
    assert "spark columns: pure Python (TIDEMQ_NO_EXTENSIONS=1)" in pure
    assert "pull lane: no pull lane (the Python handler serves every pull: TIDEMQ_NO_EXTENSIONS=1)" in pure
    assert "sync flush rounds: the Python flush thread" in pure
    assert "store group put: Python (tidemq_store_mmap.group_put: TIDEMQ_NO_EXTENSIONS=1)" in pure


def test_check_config_show_prints_every_effective_value_as_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        '[broker]\nname = "broker-x"\n[plugins]\nflush = "sync"\n[flush.sync]\ntimeout_ms = 2000\n'
        "[store.mmap]\ncommitlog_file_size = 1048576\n"
    )
    out = tidemq("check-config", "--show", str(cfg))
    assert out.returncode == 0, out.stderr
    shown = tomllib.loads(out.stdout)
    assert shown["broker"]["name"] == "broker-x" and shown["broker"]["listen"] == "127.0.0.1:10911"
    assert shown["plugins"]["flush"] == "sync" and shown["flush"]["sync"] == {
        "timeout_ms": 2000,
        "batch_wait_us": 1000,
        "batch_idle_us": 100,
        "inline_max_us": 0,
        "loop_gather_us": 0,
        "compiled_rounds": True,
        "overlap_rounds": 1,
        "overlap_max_load": 2.0,
        "kick_polls": 1,
        "kick_min_messages": 8,
        "worker_gather_us": 2000,
    }
    assert shown["store"]["mmap"]["commitlog_file_size"] == 1048576
    assert shown["store"]["mmap"]["disk_space_warning_ratio"] == 90  # a default filled in
    assert shown["transport"]["tcp"]["tls"] is False and "SQL92" in shown["filter"]
    assert 'name = "broker-x"  # set in the file' in out.stdout
    assert "resolves to" in out.stdout  # data_dir = "" says where the data goes
    # What it prints is itself a config that means the same.
    again = tmp_path / "shown.toml"
    again.write_text(out.stdout)
    second = tidemq("check-config", "--show", str(again))
    assert second.returncode == 0, second.stderr
    assert tomllib.loads(second.stdout) == shown
    # Without a file: the defaults.
    defaults = tomllib.loads(tidemq("check-config", "--show").stdout)
    assert defaults["plugins"]["store"] == "mmap" and defaults["broker"]["auto_create_topic"] is True
