"""``tidemq console`` under attack on loopback (issue 41, item 5): foreign Host and Origin, DNS
rebinding in a real Chromium, cookie-less floods, slow requests, login guessing, planted session
ids and a bind beyond loopback without keys."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, free_port
from test_console_browser import _chromium

from tidemq_console.guard import LoginThrottle, SessionStore, TrustedHosts

pytestmark = pytest.mark.timeout(180)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _request(
    base: str, method: str, path: str, *, host: str | None = None, body: str | None = None, cookie: str = ""
) -> tuple[int, dict[str, str], str]:
    hostport = base.split("//", 1)[1]
    conn = http.client.HTTPConnection(hostport, timeout=20)
    headers = {"Host": hostport if host is None else host}
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if cookie:
        headers["Cookie"] = cookie
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def _cookie(headers: dict[str, str]) -> str:
    return headers.get("set-cookie", "").split(";", 1)[0]


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page[:500]
    return found.group(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, str]]:
    """One standalone NameServer + broker behind the module's consoles (each test starts its own
    console; the topics they make have names of their own)."""
    tmp = tmp_path_factory.mktemp("console-security")
    c = Server(
        [
            "standalone",
            "--data-dir",
            str(tmp / "data"),
            "--namesrv-listen",
            "127.0.0.1:0",
            "--broker-listen",
            "127.0.0.1:0",
        ],
        tmp,
    )
    try:
        yield c, c.addresses["namesrv"], c.addresses["broker"]
    finally:
        c.stop()


def _topic_exists(namesrv: str, broker: str, topic: str) -> bool:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "topicList", "-n", namesrv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return topic in out.stdout.split()


@pytest.fixture
def rebinding_browser() -> Iterator[Any]:
    """Chromium resolving attacker.example (and evil.example) to 127.0.0.1, as after a DNS rebind."""
    executable = _chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable,
            args=[
                "--no-sandbox",
                "--disable-dev-shm-usage",
                "--host-resolver-rules=MAP attacker.example 127.0.0.1, MAP evil.example 127.0.0.1",
            ],
        )
        page = browser.new_page()
        page.set_default_timeout(20_000)
        try:
            yield page
        finally:
            browser.close()


def test_dns_rebinding_and_foreign_origin_are_refused_in_a_browser(
    spawn: Any, cluster: tuple[Any, str, str], rebinding_browser: Any
) -> None:
    # Before: with Host attacker.example the console served /topics (200), and the page's own
    # CSRF token let it delete a topic.
    _, namesrv, broker = cluster
    subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-t", "Junk1", "-b", broker, "-n", namesrv],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    console = spawn("console", "-n", namesrv, "--listen", f"127.0.0.1:{port}")
    base = console.addresses["console"].rstrip("/")
    page = rebinding_browser

    # The rebound page: same origin as the attacker's, Host attacker.example, served by the console.
    resp = page.goto(f"http://attacker.example:{port}/topics")
    assert resp is not None and resp.status == 421
    assert "Junk1" not in page.content()
    status = page.evaluate(
        "fetch('/topics/Junk1/delete', {method: 'POST', body: new URLSearchParams({csrf: 'x'})})"
        ".then(r => r.status)"
    )
    assert status == 421

    # A page from another origin posting a form to the real console address: Origin refused.
    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            html = (
                f'<form id=f method=post action="{base}/topics/Junk1/delete">'
                '<input name=csrf value=x></form><script>document.getElementById("f").submit()</script>'
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        with page.expect_response(lambda r: r.url.endswith("/topics/Junk1/delete")) as posted:
            page.goto(f"http://evil.example:{evil.server_address[1]}/")
        assert posted.value.status == 403
    finally:
        evil.shutdown()
    assert _topic_exists(namesrv, broker, "Junk1")

    # The console itself still works in the browser, by its address and by localhost.
    assert page.goto(base + "/topics").status == 200 and "Junk1" in page.content()
    assert page.goto(f"http://localhost:{port}/").status == 200


def test_foreign_hosts_and_public_host(spawn: Any, cluster: tuple[Any, str, str]) -> None:
    _, namesrv, _ = cluster
    port = free_port()
    console = spawn("console", "-n", namesrv, "--listen", f"127.0.0.1:{port}", "--public-host", "mq.example")
    base = console.addresses["console"].rstrip("/")
    for host in ("attacker.example", f"attacker.example:{port}", f"127.0.0.1:{port + 1}", ""):
        assert _request(base, "GET", "/", host=host)[0] in (400, 421), host
    for host in ("mq.example", f"mq.example:{port}", f"localhost:{port}", f"127.0.0.1:{port}"):
        assert _request(base, "GET", "/", host=host)[0] == 200, host


def test_cookieless_requests_keep_no_state(spawn: Any, cluster: tuple[Any, str, str]) -> None:
    # Before: 300 cookie-less GETs made 300 sessions and AdminClients: +600 fds in the console
    # and +600 in the broker's process, never freed.
    c, namesrv, _ = cluster
    console = spawn("console", "-n", namesrv, "--listen", f"127.0.0.1:{free_port()}", "--max-sessions", "1")
    base = console.addresses["console"].rstrip("/")
    for _ in range(3):
        assert _request(base, "GET", "/")[0] == 200
    # One real session (a form post), the only one --max-sessions 1 keeps.
    status, headers, page = _request(base, "GET", "/topics")
    anonymous = _cookie(headers)
    body = f"csrf={_csrf(page)}&topic=SessTopic&queues=1&perm=6"
    status, headers, _ = _request(base, "POST", "/topics", body=body, cookie=anonymous)
    assert status == 303
    session = _cookie(headers)
    assert session != anonymous
    before = _fds(console.proc.pid), _fds(c.proc.pid)
    cookies = set()
    for _ in range(300):
        status, headers, _ = _request(base, "GET", "/")
        assert status == 200
        cookies.add(_cookie(headers))
    after = _fds(console.proc.pid), _fds(c.proc.pid)
    assert after[0] - before[0] < 20, (before, after)
    assert after[1] - before[1] < 20, (before, after)
    assert len(cookies) == 300  # each got a throw-away id, and none took the one session's place:
    status, _, page = _request(base, "GET", "/topics/SessTopic", cookie=session)
    assert status == 200 and "topic SessTopic created" in page


def test_slow_requests_are_dropped_and_connections_capped(spawn: Any, cluster: tuple[Any, str, str]) -> None:
    _, namesrv, _ = cluster
    console = spawn(
        "console",
        "-n",
        namesrv,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--request-timeout",
        "1",
        "--max-connections",
        "32",
    )
    base = console.addresses["console"].rstrip("/")
    host, port = base.split("//", 1)[1].rsplit(":", 1)
    baseline = _fds(console.proc.pid)
    slow = []
    for _ in range(100):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() + b"\r\nX-Slow: ")
        slow.append(s)
    time.sleep(0.3)
    assert _fds(console.proc.pid) - baseline <= 40  # the cap: the rest were closed at once
    deadline = time.monotonic() + 10
    for s in slow:  # each half-sent request is dropped once its time is up
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass  # closed with the half-sent request unread
        s.close()
    assert _fds(console.proc.pid) - baseline < 5
    assert _request(base, "GET", "/")[0] == 200


ACL = """\
accounts:
  - accessKey: reader-ak
    secretKey: reader-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""


def test_login_rotates_the_session_and_is_throttled(spawn: Any, tmp_path: Path) -> None:
    (tmp_path / "plain_acl.yml").write_text(ACL)
    ns = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = ["{ns}"]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[plugins]\nacl = "plain"\n[acl.plain]\nfile = "{tmp_path / "plain_acl.yml"}"\n'
    )
    spawn("broker", "-c", str(tmp_path / "broker.toml"))
    console = spawn("console", "-n", ns, "--listen", f"127.0.0.1:{free_port()}", "--acl")
    base = console.addresses["console"].rstrip("/")

    # An attacker plants a well-formed id (cookies are not per port); the victim logs in with it.
    planted = "tidemq_console=" + "ab" * 24
    status, _, page = _request(base, "GET", "/login", cookie=planted)
    assert status == 200
    body = f"csrf={_csrf(page)}&access_key=admin-ak&secret_key=admin-secret"
    status, headers, _ = _request(base, "POST", "/login", body=body, cookie=planted)
    assert status == 303 and headers["location"] == "/"
    signed_in = _cookie(headers)
    assert signed_in.startswith("tidemq_console=") and signed_in != planted
    assert _request(base, "GET", "/topics", cookie=signed_in)[0] == 200
    status, headers, _ = _request(base, "GET", "/topics", cookie=planted)
    assert status == 303 and headers["location"] == "/login"  # the planted id is nobody's session

    # Guessing secrets: five failures, then 429 for a while, even with the right keys.
    fresh = "tidemq_console=" + "cd" * 24
    csrf = _csrf(_request(base, "GET", "/login", cookie=fresh)[2])
    for i in range(5):
        wrong = f"csrf={csrf}&access_key=admin-ak&secret_key=guess-{i}"
        assert _request(base, "POST", "/login", body=wrong, cookie=fresh)[0] == 403
    right = f"csrf={csrf}&access_key=admin-ak&secret_key=admin-secret"
    status, headers, page = _request(base, "POST", "/login", body=right, cookie=fresh)
    assert status == 429 and "too many failed logins" in page and int(headers["retry-after"]) > 0


def test_beyond_loopback_without_keys_is_refused(cluster: tuple[Any, str, str], tmp_path: Path) -> None:
    _, namesrv, _ = cluster
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "console", "-n", namesrv, "--listen", f"0.0.0.0:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert "--acl" in out.stderr and "--insecure" in out.stderr, out.stderr


def test_sessions_are_capped_and_expire() -> None:
    store: SessionStore[str] = SessionStore(max_sessions=3, idle_s=10, lifetime_s=100)
    for i in range(5):
        store.add(f"t{i}", f"s{i}", now=float(i))
    assert len(store) == 3 and store.reap() == ["s0", "s1"]  # the least recently used went
    assert store.get("t2", now=5) == "s2"
    store.add("t5", "s5", now=6)
    assert store.get("t3", now=6) is None and store.reap() == ["s3"]  # t3 was least recent
    assert store.get("t2", now=16) is None  # idle > 10 s
    store.add("t6", "s6", now=17)
    for now in range(18, 130, 5):  # used often, but older than lifetime_s
        if store.get("t6", now=float(now)) is None:
            break
    assert now > 100 and "s6" in store.reap()


def test_login_throttle_windows() -> None:
    t = LoginThrottle(per_client=2, overall=3, window_s=60)
    t.failed("a", now=0)
    t.failed("a", now=1)
    assert t.retry_after("a", now=2) == pytest.approx(58) and t.retry_after("b", now=2) == 0
    t.failed("b", now=3)
    assert t.retry_after("c", now=4) == pytest.approx(56)  # three failures overall
    assert t.retry_after("a", now=61) == 0 and t.retry_after("c", now=64) == 0


def test_trusted_hosts() -> None:
    loop = TrustedHosts("127.0.0.1", 8080, ["console.example.com", "proxy.example:443"])
    assert loop.allows("127.0.0.1:8080") and loop.allows("LOCALHOST:8080") and loop.allows("[::1]:8080")
    assert loop.allows("console.example.com") and loop.allows("console.example.com:8080")
    assert loop.allows("proxy.example:443") and not loop.allows("proxy.example")
    assert not loop.allows("127.0.0.1") and not loop.allows("127.0.0.1:8081") and not loop.allows("evil:8080")
    assert loop.allows_origin("http://127.0.0.1:8080") and loop.allows_origin("https://console.example.com")
    assert not loop.allows_origin("null") and not loop.allows_origin("http://evil.example:8080")
    wild = TrustedHosts("0.0.0.0", 8080)
    assert wild.allows("localhost:8080") and not wild.allows("10.1.2.3:8080")
    assert TrustedHosts("127.0.0.1", 80).allows("127.0.0.1") and TrustedHosts("::1", 443).allows("[::1]")
    lan = TrustedHosts("10.1.2.3", 8080)
    assert lan.allows("10.1.2.3:8080") and not lan.allows("localhost:8080")
