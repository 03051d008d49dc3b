"""Hostile configuration (issue 20, items 5 and 10).

Numbers that are not finite or out of range, wrong types, sizes with units, broken listen
addresses and unknown keys, in every table: each must be accepted or refused the same way by
``tidemq check-config`` and by ``tidemq broker`` (one validation path, :func:`check_broker`), a
refusal is one line naming the key (never a traceback), and what check-config accepts does start.
The NameServer refuses nan/inf over the wire (UPDATE_NAMESRV_CONFIG) and keeps expiring brokers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.config import NamesrvSettings, check_broker, load_config
from tidemq.errors import ConfigError
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import RequestCode, ResponseCode

from .cluster import report

pytestmark = pytest.mark.timeout(240)


#: (table, key) pairs the fuzz writes hostile values into; "?" picks an unknown key.
TARGETS: list[tuple[str, str]] = [
    ("broker", k)
    for k in (
        "register_interval_s",
        "consumer_offset_flush_s",
        "consumer_housekeeping_s",
        "transaction_check_interval_s",
        "transaction_timeout_s",
        "transaction_check_max",
        "default_topic_queues",
        "default_perm",
        "max_message_size",
        "max_frame_size",
        "short_polling_ms",
        "id",
        "listen",
        "advertise",
        "namesrv",
        "name",
        "delay_levels",
        "?",
    )
] + [
    ("namesrv", "scan_interval_s"),
    ("namesrv", "broker_expire_s"),
    ("namesrv", "listen"),
    ("namesrv", "max_frame_size"),
    ("namesrv", "?"),
    ("store.mmap", "commitlog_file_size"),
    ("store.mmap", "consumequeue_entries"),
    ("store.mmap", "file_reserved_hours"),
    ("store.mmap", "disk_max_used_space_ratio"),
    ("store.mmap", "clean_interval_ms"),
    ("store.mmap", "delete_when"),
    ("store.mmap", "?"),
    ("flush.async", "interval_ms"),
    ("flush.async", "least_pages"),
    ("transport.tcp", "idle_timeout_s"),
    ("transport.tcp", "connect_timeout_s"),
    ("transport.tcp", "backlog"),
    ("index.hash", "max_hash_slot_num"),
    ("filter.SQL92", "idle_expire_s"),
    ("filter.SQL92", "bloom_bits"),
]

NUMBERS: list[Any] = [
    math.nan,
    math.inf,
    -math.inf,
    0,
    -1,
    0.0,
    -0.5,
    1e-300,
    1e300,
    2**62,
    -(2**62),
    65536,
    109211,
    3,
    1,
]
STRINGS: list[Any] = [
    "16MB",
    "10s",
    "1GB",
    "",
    " ",
    "nan",
    "inf",
    "04",
    "99",
    "1s 5s",
    "1x",
    True,
    [],
    [1],
    {},
]
ADDRESSES: list[str] = [
    "127.0.0.1:109211",
    "76447",
    "10911",
    "127.0.0.1",
    "127.0.0.1:",
    ":10911",
    "::1:10911",
    "[::1]",
    "[::1]:0",
    "[::1]:10911",
    "127.0.0.1:0",
    "127.0.0.1:65535",
    "127.0.0.1:+1",
    "127.0.0.1:1_0",
    "127.0.0.1:\uff11",
    "0.0.0.0:0",
    "localhost:0",
    "a b:1",
]
VALUES: list[Any] = NUMBERS + STRINGS + ADDRESSES + [[a] for a in ADDRESSES[:6]]


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{}"  # an inline table


def config_text(table: str, key: str, value: Any, data_dir: Path) -> str:
    """A startable broker config with one hostile value in it."""
    key = "lisen_port" if key == "?" else key
    base = {"listen": '"127.0.0.1:0"', "namesrv": "[]", "data_dir": json.dumps(str(data_dir))}
    lines = []
    if table == "broker":
        base[key] = toml_value(value)
    lines.append("[broker]")
    lines += [f"{k} = {v}" for k, v in base.items()]
    if table != "broker":
        lines += [f"[{table}]", f"{key} = {toml_value(value)}"]
    if table == "store.mmap":  # no second file made ahead: a broker started from it stays light
        lines.insert(lines.index(f"[{table}]") + 1, "preallocate = false")
    return "\n".join(lines) + "\n"


def judge(path: Path) -> tuple[bool, str]:
    """In-process verdict of the one validation path: (accepted, error line)."""
    try:
        check_broker(load_config(path))
    except ConfigError as exc:
        return False, str(exc)
    return True, ""


def tidemq(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq", *args], capture_output=True, text=True, timeout=timeout
    )


def test_every_hostile_value_is_accepted_or_refused_in_one_line(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    figures = {"inputs": 0, "accepted": 0, "refused": 0, "tracebacks": 0, "multi_line": 0}

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(target=st.sampled_from(TARGETS), value=st.sampled_from(VALUES) | st.integers() | st.floats())
    def fuzz(target: tuple[str, str], value: Any) -> None:
        table, key = target
        tmp_path = tmp_path_factory.mktemp("cfg")
        path = tmp_path / "broker.toml"
        data = tmp_path / "data"
        path.write_text(config_text(table, key, value, data))
        figures["inputs"] += 1
        try:
            ok, err = judge(path)
        except Exception:
            figures["tracebacks"] += 1
            raise
        figures["accepted" if ok else "refused"] += 1
        assert not data.exists(), "checking wrote into the data directory"
        if not ok:
            figures["multi_line"] += "\n" in err
            assert "\n" not in err, err
            shown = "lisen_port" if key == "?" else key
            assert shown in err or table.split(".")[0] in err, (target, value, err)
        if isinstance(value, float) and not math.isfinite(value) and key != "?":
            assert not ok, f"{table}.{key} = {value} accepted"

    fuzz()
    report("hostile_config_fuzz", **figures)
    assert figures["tracebacks"] == 0 and figures["multi_line"] == 0


def test_check_config_and_broker_agree(tmp_path: Path) -> None:
    """A sample through the real commands: same verdict, one line, and accepted configs do start."""
    rng = random.Random(20)
    cases = []
    for i in range(16):
        table, key = rng.choice(TARGETS)
        # Some plausible values too, so that a few accepted configs are started.
        value = rng.choice(VALUES) if rng.random() < 0.7 else rng.choice([1, 2, 30, 100, "04"])
        d = tmp_path / f"c{i}"
        d.mkdir()
        path = d / "broker.toml"
        path.write_text(config_text(table, key, value, d / "data"))
        cases.append((path, judge(path)))

    def check(case: tuple[Path, tuple[bool, str]]) -> tuple[bool, bool, str]:
        path, (ok, err) = case
        out = tidemq("check-config", str(path))
        agree = (out.returncode == 0) == ok
        return agree, "Traceback" in out.stderr, out.stderr.strip()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        checked = list(pool.map(check, cases))
    tracebacks = sum(t for _, t, _ in checked)
    disagree = [(str(c[0]), c[1], err) for c, (a, _, err) in zip(cases, checked, strict=True) if not a]
    for (_, (ok, _)), (_, _, err) in zip(cases, checked, strict=True):
        if not ok:
            assert len(err.splitlines()) == 1 and err.startswith("tidemq: error:"), err

    # The broker itself: refused ones exit 2 with one line; accepted ones (a few) start.
    refused = [c for c in cases if not c[1][0]][:4]
    accepted = [c for c in cases if c[1][0]][:2]

    def start_refused(case: tuple[Path, tuple[bool, str]]) -> bool:
        out = tidemq("broker", "-c", str(case[0]), timeout=30)
        lines = out.stderr.strip().splitlines()
        return out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        broker_refused = list(pool.map(start_refused, refused))

    def start_accepted(case: tuple[Path, tuple[bool, str]]) -> bool:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "broker", "-c", str(case[0])],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            return " listening on " in (proc.stdout.readline() if proc.stdout else "")
        finally:
            proc.terminate()
            proc.wait(15)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        started = sum(pool.map(start_accepted, accepted))
    report(
        "hostile_config_cli",
        inputs=len(cases),
        accepted=sum(c[1][0] for c in cases),
        refused=sum(not c[1][0] for c in cases),
        check_config_agrees=len(cases) - len(disagree),
        broker_refused_one_line=f"{sum(broker_refused)}/{len(refused)}",
        broker_started=f"{started}/{len(accepted)}",
        tracebacks=tracebacks,
    )
    assert not disagree, disagree
    assert tracebacks == 0 and all(broker_refused)
    assert accepted and started == len(accepted)


def test_namesrv_refuses_non_finite_updates_over_the_wire_and_keeps_expiring() -> None:
    from tidemq.namesrv import NameServer
    from tidemq_transport_tcp import TcpTransport, run

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_namesrv_routes import register_cmd, route_of

    refused: list[str] = []

    async def main() -> None:
        ns = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", broker_expire_s=0.5, scan_interval_s=0.1), TcpTransport()
        )
        await ns.start()
        client = TcpTransport().client()
        broker = TcpTransport().client()
        try:
            addr = ns.address
            for body in (
                "scan_interval_s=nan",
                "scan_interval_s=inf",
                "broker_expire_s=inf",
                "broker_expire_s=-inf",
                "broker_expire_s=1e999",
                "scan_interval_s=0",
                "scan_interval_s=nan\nbroker_expire_s=1",
            ):
                req = RemotingCommand.request(RequestCode.UPDATE_NAMESRV_CONFIG, body=body.encode())
                resp = await client.invoke(addr, req, 3)
                assert resp.code != ResponseCode.SUCCESS, body
                assert resp.remark and "\n" not in resp.remark, resp.remark
                refused.append(body)
            assert (ns.settings.scan_interval_s, ns.settings.broker_expire_s) == (0.1, 0.5)
            # Expiry still runs: a silent broker disappears from the routes.
            await broker.invoke(addr, register_cmd(topics={"T": 4}), 3)
            assert (await route_of(client, addr, "T")).code == ResponseCode.SUCCESS
            for _ in range(50):
                await asyncio.sleep(0.1)
                if (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST:
                    break
            assert (await route_of(client, addr, "T")).code == ResponseCode.TOPIC_NOT_EXIST
            assert ns._scan_task is not None and not ns._scan_task.done()
        finally:
            await broker.close()
            await client.close()
            await ns.stop()

    run(main())
    report("namesrv_runtime_update", refused=f"{len(refused)}/7", expiry_after="ran")
