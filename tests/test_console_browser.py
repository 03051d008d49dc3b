"""``tidemq console`` end to end in a real headless Chromium (Debian's ``chromium`` package).

Playwright drives the system browser (no browser download).  Against a real ``tidemq
standalone``: create a topic, send a message, find it by key and open it, watch a consumer
group's lag fall to 0 while a consumer runs, then reset the group's offset by time and see the
lag come back.  Screenshots of each step are saved under ``$TIDEMQ_ARTIFACTS`` (default: the
test's temporary directory).  ``.ci/run`` installs chromium; elsewhere the test skips unless
``TIDEMQ_REQUIRE_SERVERS=1``.
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import commit_offset, free_port, require_server

from tidemq.client import BlockingProducer, BlockingPushConsumer, Message, SendStatus

pytestmark = pytest.mark.timeout(240)

TOPIC = "ConsoleTopic"
GROUP = "console-group"


def _chromium() -> str:
    return require_server("chromium", "chromium-browser", package="chromium")


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(20_000)
        try:
            yield page
        finally:
            browser.close()


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TIDEMQ_ARTIFACTS") or tmp_path) / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_console_in_a_real_browser(spawn: Any, tmp_path: Path, browser_page: Any) -> None:
    page = browser_page
    shots = _artifacts(tmp_path)
    cluster = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
    )
    namesrv, broker = cluster.addresses["namesrv"], cluster.addresses["broker"]
    console = spawn("console", "-n", namesrv, "--listen", f"127.0.0.1:{free_port()}")
    base = console.addresses["console"].rstrip("/")

    # The cluster page lists the broker.
    page.goto(base + "/")
    assert broker in page.inner_text("#brokers")
    page.screenshot(path=str(shots / "1-cluster.png"), full_page=True)

    # Create a topic with one queue.
    page.click("#nav-topics")
    page.fill("#topic-name", TOPIC)
    page.fill("input[name=queues]", "1")
    page.click("#create-topic button")
    page.wait_for_url(f"{base}/topics/{TOPIC}")
    assert f"topic {TOPIC} created" in page.inner_text(".flash.ok")
    page.screenshot(path=str(shots / "2-topic.png"), full_page=True)

    # Send a message with a key, then find it by that key and open it.
    page.goto(f"{base}/send?topic={TOPIC}")
    page.fill("#send-keys", "order-42")
    page.fill("#send-tags", "TagA")
    page.fill("#send-body", "hello from the console")
    page.click("#send-button")
    assert page.inner_text("#send-result").startswith("SEND_OK")
    page.click("#nav-messages")
    page.fill("#search-key input[name=topic]", TOPIC)
    page.fill("#search-key-value", "order-42")
    page.click("#search-key button")
    rows = page.locator("#found tbody tr")
    assert rows.count() == 1 and "hello from the console" in rows.inner_text()
    page.screenshot(path=str(shots / "3-search.png"), full_page=True)
    rows.locator("a").click()
    assert page.inner_text("#message-body") == "hello from the console"
    assert "order-42" in page.inner_text("#message")

    # A group 20 messages behind: the console shows its lag fall to 0 as a consumer catches up.
    with BlockingProducer("console-test-pg", namesrv) as producer:
        for i in range(20):
            assert producer.send(Message(TOPIC, b"m%02d" % i)).status is SendStatus.SEND_OK
    commit_offset(namesrv, broker, GROUP, TOPIC, 0, 0)
    page.goto(f"{base}/groups/{GROUP}")
    assert page.inner_text("#group-lag") == "21"
    got: list[bytes] = []
    consumer = BlockingPushConsumer(GROUP, namesrv, consume_from="first", suspend_s=1.0)
    consumer.subscribe(TOPIC)
    consumer.register_listener(lambda msgs: got.extend(m.body for m in msgs))
    with consumer:
        # The page polls /api/live every 2 s; the consumer commits its offset every few seconds.
        page.wait_for_function("document.getElementById('group-lag').textContent === '0'", timeout=60_000)
        page.screenshot(path=str(shots / "4-group-caught-up.png"), full_page=True)
        assert len(got) == 21
        page.reload()  # the client list is rendered by the server
        assert page.locator("#clients tbody tr").count() >= 1
    # Reset the (now offline) group to before the first message: the backlog comes back.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the consumer's unregistration reaches the broker
        page.goto(f"{base}/groups/{GROUP}")
        if "none online" in page.inner_text("#clients"):
            break
        time.sleep(0.5)
    page.select_option("#reset-topic", TOPIC)
    page.fill("#reset-when", "2020-01-01T00:00:00")
    page.click("#reset-button")
    assert "1 queue(s) reset" in page.inner_text(".flash.ok")
    assert page.inner_text("#group-lag") == "21"
    page.screenshot(path=str(shots / "5-group-reset.png"), full_page=True)

    # Forms refuse a request without the session's CSRF token, and a bad topic name is a message.
    req = urllib.request.Request(f"{base}/topics", data=b"topic=Evil&queues=1&perm=6", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 403
    page.click("#nav-topics")
    page.fill("#topic-name", "bad topic name!")
    page.click("#create-topic button")
    assert page.locator(".flash.error").count() == 1


ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: reader-ak
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""


def test_console_with_acl_asks_for_admin_keys(spawn: Any, tmp_path: Path, browser_page: Any) -> None:
    """`--acl`: nothing is shown before an admin account's keys are given; a non-admin account is
    refused; once signed in, every request the console makes is signed (the broker refuses
    unsigned admin requests, so the pages could not show a topic otherwise)."""
    page = browser_page
    (tmp_path / "plain_acl.yml").write_text(ACL)
    ns = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = ["{ns}"]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{tmp_path / "plain_acl.yml"}"\n'
    )
    spawn("broker", "-c", str(tmp_path / "broker.toml"))
    console = spawn("console", "-n", ns, "--listen", f"127.0.0.1:{free_port()}", "--acl")
    base = console.addresses["console"].rstrip("/")

    page.goto(base + "/topics")
    page.wait_for_url(base + "/login")
    page.fill("#access_key", "reader-ak")
    page.fill("#secret_key", "reader-secret")
    page.click("#login button")
    assert "not an admin account" in page.inner_text(".flash.error")
    page.goto(base + "/groups")
    page.wait_for_url(base + "/login")  # still nothing without admin keys

    page.fill("#access_key", "admin-ak")
    page.fill("#secret_key", "admin-secret")
    page.click("#login button")
    assert "signed in as admin-ak" in page.inner_text(".flash.ok")
    page.click("#nav-topics")
    page.fill("#topic-name", "AclConsoleTopic")
    page.click("#create-topic button")  # UPDATE_AND_CREATE_TOPIC: admin only, signed
    page.wait_for_url(f"{base}/topics/AclConsoleTopic")
    page.screenshot(path=str(_artifacts(tmp_path) / "6-acl-signed-in.png"), full_page=True)
    page.click("header form.inline button")  # sign out
    page.wait_for_url(base + "/login")
