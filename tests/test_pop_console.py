"""POP groups in the console (issue 39), over HTTP against a real broker: a group's page shows each
popped queue's pop offset and in-flight count, the cluster page each broker's POP in-flight
messages and revive lag."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from pop_support import PopEnv
from starlette.testclient import TestClient

from tidemq_console.app import ConsoleConfig, create_app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[PopEnv]:
    e = PopEnv(tmp_path)
    try:
        yield e
    finally:
        e.close()


def cells(html: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert body is not None, html[-2000:]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body.group(1), re.S)]


def test_pop_progress_in_flight_and_revive_lag_in_the_console(env: PopEnv) -> None:
    env.send("PopConsole", 10, "c")
    c = env.consumer("GPOPCON", "PopConsole")
    msgs = env.receive_all(c, 10, invisible=60)
    assert len(msgs) == 10
    env.ack(c, msgs[:4])
    with TestClient(create_app(ConsoleConfig(namesrv=env.namesrv))) as web:
        page = web.get("/groups/GPOPCON")
        assert page.status_code == 200
        assert re.search(r'<span id="pop-in-flight">6</span>', page.text), page.text[-3000:]
        head = re.search(r'<table id="group-queues">\s*<thead>(.*?)</thead>', page.text, re.S)
        assert head is not None and "pop offset" in head.group(1) and "in flight" in head.group(1)
        rows = [r for r in cells(page.text, "group-queues") if r[0] == "PopConsole"]
        assert sum(int(r[8]) for r in rows) == 6
        # every message is popped: each queue's pop offset is its broker offset
        assert all(r[7] == r[3] for r in rows) and sum(int(r[3]) for r in rows) == 10

        def broker_row() -> list[str]:
            (row,) = [r for r in cells(web.get("/").text, "brokers") if r[1] == "broker-pop"]
            return row

        row = broker_row()
        assert row[-2] == "6" and row[-1] == "0"  # in flight; revive on time
        env.ack(c, msgs[4:])
        assert wait_for(lambda: broker_row()[-2] == "0", 10)
        # A classic group's page has no POP columns.
        classic = web.get("/groups/NoSuchClassicGroup").text
        assert "pop offset" not in classic
