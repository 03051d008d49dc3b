"""A third-party expression type (regular expressions), installed as its own distribution.

The wheel is built and installed into a private directory; the broker and the filter server pick
the type up through the ``tidemq_register_filters`` hook like the built-in TAG and SQL92.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

from tidemq.message import iter_messages, properties_to_string
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(120)

PLUGIN_SOURCE = '''
"""REGEX expressions: ``<property>=<regular expression>``, matched in full against the property."""

import re

from tidemq import hookimpl


class RegexFilter:
    def __init__(self, name, pattern):
        self.name = name
        self.pattern = pattern

    def matches_tags_code(self, tags_code):
        return True

    def matches_message(self, properties):
        value = properties.get(self.name)
        return value is not None and self.pattern.fullmatch(value) is not None


class RegexFilterFactory:
    def compile(self, expression):
        name, sep, pattern = (expression or "").partition("=")
        if not sep or not name.strip():
            raise ValueError(f"REGEX expression {expression!r} is not <property>=<regular expression>")
        try:
            return RegexFilter(name.strip(), re.compile(pattern))
        except re.error as exc:
            raise ValueError(f"bad regular expression {pattern!r}: {exc}") from None


@hookimpl
def tidemq_register_filters(register):
    register.add("REGEX", lambda ctx: RegexFilterFactory(), "property matched by a regular expression")
'''

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tidemq-regex-filter"
version = "1.0"
dependencies = ["tidemq"]

[project.entry-points.tidemq]
regex_filter = "tidemq_regex_filter"

[tool.setuptools]
py-modules = ["tidemq_regex_filter"]
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("regex_plugin")
    src = root / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "tidemq_regex_filter.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "dist", src],
        check=True,
    )
    wheels = list((root / "dist").glob("tidemq_regex_filter-1.0-*.whl"))
    assert len(wheels) == 1
    target = root / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", target, wheels[0]], check=True)
    return target


def env_with(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_regex_type_is_listed_from_its_distribution(site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "plugins"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **env_with(site)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    filters = out.stdout.split("filter:")[1]
    assert "REGEX" in filters and "tidemq-regex-filter" in filters
    assert "SQL92" in filters and "TAG" in filters


async def call(
    client: Any, addr: str, code: int, fields: dict[str, Any], body: bytes | None = None
) -> RemotingCommand:
    return await client.invoke(
        addr, RemotingCommand.request(code, {k: str(v) for k, v in fields.items()}, body), 10.0
    )


def pull_fields(expression: str, expression_type: str = "REGEX") -> dict[str, Any]:
    return {
        "consumerGroup": "CG-re",
        "topic": "Regex",
        "queueId": 0,
        "queueOffset": 0,
        "maxMsgNums": 32,
        "sysFlag": 4,
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": expression,
        "subVersion": 0,
        "expressionType": expression_type,
    }


def test_broker_and_filter_server_run_the_installed_regex_type(
    spawn: Any, site: Path, tmp_path: Path
) -> None:
    env = env_with(site)
    cluster = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{free_port()}",
        "--broker-listen",
        f"127.0.0.1:{free_port()}",
        env=env,
    )
    broker = cluster.addresses["broker"]
    fs = spawn("filtersrv", "--broker", broker, env=env)
    users = ["alice", "bob", "alfred", "carol", "al"]

    async def main() -> None:
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            for i, user in enumerate(users):
                fields = {
                    "producerGroup": "PG",
                    "topic": "Regex",
                    "defaultTopic": "TBW102",
                    "defaultTopicQueueNums": 1,
                    "queueId": 0,
                    "sysFlag": 0,
                    "bornTimestamp": int(time.time() * 1000),
                    "flag": 0,
                    "properties": properties_to_string({"user": user}),
                    "reconsumeTimes": 0,
                    "unitMode": "false",
                }
                resp = await call(client, broker, RequestCode.SEND_MESSAGE, fields, b"%d" % i)
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            for addr in (broker, fs.addresses["filtersrv"]):
                resp = await call(client, addr, RequestCode.PULL_MESSAGE, pull_fields("user=al.*"))
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                assert [int(m.body) for m in iter_messages(resp.payload())] == [0, 2, 4]
                bad = await call(client, addr, RequestCode.PULL_MESSAGE, pull_fields("user=(unclosed"))
                assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
                assert "bad regular expression" in bad.remark
        finally:
            await client.close()

    asyncio.run(main())
