"""The console's trace page against a real broker: from a message's page, "Trace" shows what
``queryMsgTraceById`` shows (the send, each consumer group's consumes, a consume not finished).

The console app runs in this process (Starlette's TestClient, real sockets to the broker); a
browser check in Debian's chromium follows the link as an operator does (``slow``; skipped
without chromium).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import free_port, wait_for
from starlette.testclient import TestClient
from test_admin_trace import TraceCluster

from tidemq.client import Message
from tidemq.trace.format import TraceBean, TraceContext, TraceType, encode_context
from tidemq_console.app import ConsoleConfig, create_app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TraceCluster, Any]]:
    """A cluster, one real message on ``Orders`` and the trace records of its send and consumes."""
    cluster = TraceCluster(tmp_path_factory.mktemp("console-trace"))
    try:
        sent = cluster.loop.run(cluster.producer.send(Message("Orders", b"order 9", keys=["order-9"])), 30)
        t0 = int(time.time() * 1000)
        mid = sent.msg_id  # the producer's unique id: what a tracing client records
        pub = TraceBean(topic="Orders", msg_id=mid, offset_msg_id=sent.offset_msg_id, keys="order-9", store_host="127.0.0.1:10911")  # fmt: skip
        records = [
            TraceContext(TraceType.PUB, t0, group_name="pg-console", cost_time=4, beans=[pub]),
            TraceContext(
                TraceType.SUB_BEFORE,
                t0 + 5,
                group_name="cg-ship",
                request_id="q1",
                beans=[TraceBean(msg_id=mid)],
            ),  # fmt: skip
            TraceContext(
                TraceType.SUB_AFTER,
                t0 + 17,
                group_name="cg-ship",
                cost_time=12,
                request_id="q1",
                beans=[TraceBean(msg_id=mid)],
            ),  # fmt: skip
            TraceContext(
                TraceType.SUB_BEFORE,
                t0 + 6,
                group_name="cg-mail",
                request_id="q2",
                beans=[TraceBean(msg_id=mid)],
            ),  # fmt: skip
        ]
        cluster.put_trace("".join(encode_context(c) for c in records), [mid, "order-9"])
        assert wait_for(lambda: len(cluster.trace_of(mid).consumers) == 2, timeout=10)
        yield cluster, sent
    finally:
        cluster.stop()


def test_trace_page_shows_the_send_and_each_consumer_group(traced: tuple[TraceCluster, Any]) -> None:
    cluster, sent = traced
    with TestClient(create_app(ConsoleConfig(namesrv=cluster.namesrv))) as web:
        # The message page (opened by the broker's offset id) links to the trace by the unique id.
        page = web.get(f"/messages/{sent.offset_msg_id}")
        assert page.status_code == 200
        link = re.search(r'href="([^"]+)" id="trace-link"', page.text)
        assert link is not None and link.group(1) == f"/messages/{sent.msg_id}/trace"
        html = web.get(link.group(1)).text
        pub = re.search(r'<table id="trace-pub">.*?</table>', html, re.S)
        assert pub is not None
        assert "pg-console" in pub.group(0) and "4 ms" in pub.group(0) and "success" in pub.group(0)
        assert "127.0.0.1:10911" in pub.group(0) and "order-9" in pub.group(0)
        groups = dict(
            re.findall(r'<table class="trace-group" data-group="([^"]*)">(.*?)</table>', html, re.S)
        )
        assert sorted(groups) == ["cg-mail", "cg-ship"]
        assert "12 ms" in groups["cg-ship"] and "success" in groups["cg-ship"]
        assert "no SubAfter yet" in groups["cg-mail"]

        # A message nobody traced, and a trace topic that does not exist, are said plainly.
        assert 'id="trace-none"' in web.get("/messages/00000000000000000000000000000000/trace").text
        missing = web.get(f"/messages/{sent.msg_id}/trace?topic=NoSuchTrace").text
        assert 'id="trace-missing"' in missing and "NoSuchTrace does not exist" in missing


@pytest.mark.slow  # a browser start-up: ~5 s
def test_trace_link_in_a_real_browser(traced: tuple[TraceCluster, Any], spawn: Any) -> None:
    from test_console_browser import _chromium

    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    cluster, sent = traced
    console = spawn("console", "-n", cluster.namesrv, "--listen", f"127.0.0.1:{free_port()}")
    base = console.addresses["console"].rstrip("/")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.goto(f"{base}/messages/{sent.offset_msg_id}")
            page.click("#trace-link")
            page.wait_for_url(f"{base}/messages/{sent.msg_id}/trace")
            assert "pg-console" in page.inner_text("#trace-pub")
            assert "no SubAfter yet" in page.inner_text('table[data-group="cg-mail"]')
        finally:
            browser.close()
