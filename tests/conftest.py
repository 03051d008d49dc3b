"""Shared fixtures: free loopback ports and subprocess servers; tidemq's own pytest plugin."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0, every: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (errors while polling count as not
    yet: a process still starting); the last try's result, or its error, after the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:
            pass
        time.sleep(every)
    return predicate()


def run_admin(
    namesrv: str, *args: str, cwd: Path, ok: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``tidemq admin ARGS -n NAMESRV`` in a subprocess, as an operator runs it; with ``ok`` it must
    exit 0 without a traceback."""
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", *args, "-n", namesrv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ},
    )
    if ok:
        assert out.returncode == 0, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
    return out


def commit_offset(namesrv: str, broker: str, group: str, topic: str, queue_id: int, offset: int) -> None:
    """UPDATE_CONSUMER_OFFSET: ``group``'s committed offset on one queue, as a consumer commits it.

    Sent from a thread of its own, so a test running an event loop (Playwright's) can call it.
    """
    from tidemq.client import AdminClient
    from tidemq.remoting.codes import RequestCode

    async def commit() -> None:
        client = AdminClient(namesrv)
        try:
            await client.call(
                broker,
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset},
            )
        finally:
            await client.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, commit()).result(30)


def runtime_info(addr: str) -> dict[str, str]:
    """GET_BROKER_RUNTIME_INFO of the broker at ``addr``: its ``table`` (role, offsets, ...)."""
    import asyncio

    import orjson

    from tidemq.plugins import get_plugin_manager
    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    async def ask() -> dict[str, str]:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            resp = await client.invoke(
                addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 3.0
            )
        finally:
            await client.close()
        assert resp.code == ResponseCode.SUCCESS
        return dict(orjson.loads(resp.body)["table"])

    return asyncio.run(ask())


def pytest_configure(config: pytest.Config) -> None:
    """Load tidemq's pytest plugin (tidemq_plugins, tidemq_make_store, ...) unless its ``pytest11``
    entry point already did: ``pytest_plugins = [...]`` would register the module a second time
    under another name, which pytest refuses."""
    import tidemq.testing.pytest_plugin as plugin

    manager = config.pluginmanager
    if not manager.is_registered(plugin) and not manager.is_blocked("tidemq"):
        manager.register(plugin, "tidemq")


def require_server(*names: str, package: str) -> str:
    """The path of the first of ``names`` found on PATH: a real server a test starts (etcd,
    chromium, prometheus).  Missing, the test skips with one line naming the Debian package, or
    fails when ``TIDEMQ_REQUIRE_SERVERS=1`` (``.ci/run`` sets it), so CI never turns a missing
    server into a quiet skip."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    what = f"{names[0]} is not installed (Debian package {package}; .ci/install-servers installs it)"
    if os.environ.get("TIDEMQ_REQUIRE_SERVERS", "") not in ("", "0"):
        pytest.fail(f"TIDEMQ_REQUIRE_SERVERS is set but {what}", pytrace=False)
    pytest.skip(what)


@pytest.fixture
def port() -> int:
    return free_port()


class Server:
    """A ``python -m tidemq ...`` subprocess that announced ``listening on HOST:PORT``."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 30.0):
        self.log_path = cwd / f"{args[0]}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq", "--log-level", "INFO", *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
        self.addresses: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline().decode()
            if not line:
                break
            if " listening on " in line:
                what = line.split()[1]
                self.addresses[what] = line.rsplit(" ", 1)[1].strip()
                if args[0] != "standalone" or "broker" in self.addresses:
                    return
        self.stop()
        raise RuntimeError(f"{args} did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int | None = None) -> int:
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator:
    """Start tidemq subprocesses; all are stopped at the end of the test."""
    started: list[Server] = []

    def _spawn(*args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(list(args), tmp_path, env)
        started.append(server)
        return server

    yield _spawn
    for server in reversed(started):
        server.stop()


def matrix_plugins() -> dict[str, str]:
    """The plugin combination under test, chosen by the tox matrix through environment variables.

    ``TIDEMQ_TEST_STORE`` / ``TIDEMQ_TEST_FLUSH`` / ``TIDEMQ_TEST_REPLICATION`` select the broker's
    store, flush policy and replication; tests that compose a broker use this so every tox factor
    runs the same tests against another combination.
    """
    return {
        "store": os.environ.get("TIDEMQ_TEST_STORE", "mmap"),
        "flush": os.environ.get("TIDEMQ_TEST_FLUSH", "async"),
        "replication": os.environ.get("TIDEMQ_TEST_REPLICATION", "none"),
    }


@pytest.fixture
def plugin_matrix() -> dict[str, str]:
    return matrix_plugins()


def fitting(role: str, payload: object) -> object:
    """A stand-in plugin instance that fits ``role``'s contract (every member a no-op), carrying
    ``payload``: PluginManager.create refuses anything that does not fit."""
    from tidemq.plugins import contract_members, role_contract

    members = {m: (lambda *a, **k: None) for m in contract_members(role_contract(role))}
    return type("Fitting", (), {**members, "payload": payload})()


@pytest.fixture
def pipe() -> Iterator[int]:
    """A pipe's write end (its read end open too): a file descriptor whose fdatasync fails (EINVAL),
    for the flush tests' failed rounds."""
    r, w = os.pipe()
    yield w
    os.close(r)
    os.close(w)
