"""Request handlers are plugins (tidemq_register_processors): add, wrap, refuse duplicates."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_broker_processors import call, pull_fields, running, send_fields

from tidemq import hookimpl
from tidemq.broker.context import BrokerContext, ProcessorRegister
from tidemq.errors import PluginError
from tidemq.plugins import PluginManager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand

pytestmark = pytest.mark.timeout(60)

CUSTOM_CODE = 9901


class Echo:
    """A third party's own request code, and a wrapper timing the pulls."""

    def __init__(self) -> None:
        self.pulls = 0
        self.context: BrokerContext | None = None

    @hookimpl
    def tidemq_register_processors(self, register: ProcessorRegister) -> None:
        self.context = register.context

        async def echo(conn: Any, request: RemotingCommand) -> RemotingCommand:
            topics = len(register.context.topics.all())
            return request.reply(ResponseCode.SUCCESS, f"echo {request.ext_fields.get('x')} of {topics}")

        register.add(CUSTOM_CODE, echo)

        def count(handler: Any) -> Any:
            async def counted(conn: Any, request: RemotingCommand) -> RemotingCommand | None:
                self.pulls += 1
                return await handler(conn, request)

            return counted

        register.wrap(RequestCode.PULL_MESSAGE, count)


def manager_with(*plugins: object) -> PluginManager:
    pm = PluginManager()
    pm.load_entry_points()
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"third-party-{i}")
    return pm


def test_a_plugin_adds_and_wraps_request_codes_before_the_server_starts(tmp_path: Path) -> None:
    echo = Echo()

    async def main() -> None:
        async with running(tmp_path, {}, manager=manager_with(echo)) as (broker, client):
            r = await call(client, broker, CUSTOM_CODE, {"x": "hello"})
            assert (r.code, r.remark) == (ResponseCode.SUCCESS, f"echo hello of {len(broker.topics.all())}")
            assert (await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("T", 0), b"x")).code == 0
            pulled = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("T", 0, 0))
            assert pulled.code == ResponseCode.SUCCESS  # the wrapped built-in handler still serves
            assert echo.pulls == 1 and echo.context is broker

    asyncio.run(main())


class TakesPull:
    @hookimpl
    def tidemq_register_processors(self, register: ProcessorRegister) -> None:
        async def mine(conn: Any, request: RemotingCommand) -> RemotingCommand:
            return request.reply(ResponseCode.SUCCESS)

        register.add(RequestCode.PULL_MESSAGE, mine)


def test_a_code_taken_twice_is_refused_naming_both_plugins(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}, manager=manager_with(TakesPull())):
            pass

    with pytest.raises(
        PluginError, match=r"request code 11 is registered twice.*'broker_processors'.*'third-party-0'"
    ):
        asyncio.run(main())
    assert not (tmp_path / "lock").exists() or _lock_free(tmp_path)  # the failed start released it


class WrapsNothing:
    @hookimpl
    def tidemq_register_processors(self, register: ProcessorRegister) -> None:
        register.wrap(4242, lambda handler: handler)


def test_wrapping_a_code_no_plugin_serves_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}, manager=manager_with(WrapsNothing())):
            pass

    with pytest.raises(PluginError, match="wraps request code 4242, which no plugin serves"):
        asyncio.run(main())


def _lock_free(path: Path) -> bool:
    from tidemq.datadir import holder

    return holder(path) is None


def test_the_metadata_sink_applies_a_master_s_tables_and_checks_its_names(tmp_path: Path) -> None:
    from tidemq.replication import MetadataSink

    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            sink = broker.metadata_sink
            assert isinstance(sink, MetadataSink)
            count = sink.apply_topic_configs(
                {
                    "topicConfigTable": {
                        "Orders": {"readQueueNums": 2, "writeQueueNums": 2, "perm": 6},
                        "../evil": {"readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
                    },
                    "dataVersion": {"timestamp": 7, "counter": 3},
                }
            )
            assert count == 1 and broker.topics.get("Orders").read_queue_nums == 2
            assert broker.topics.get("../evil") is None
            assert sink.topic_data_version() == {"timestamp": 7, "counter": 3}
            sink.apply_consumer_offsets({"offsetTable": {"Orders@cg": {"0": 5}, "../t@cg": {"0": 1}}})
            assert (
                broker.offsets.query("cg", "Orders", 0) == 5 and broker.offsets.query("cg", "../t", 0) == -1
            )
            sink.apply_subscription_groups(
                {"subscriptionGroupTable": {"cg": {"retryMaxTimes": 3}, "a/b": {}}}
            )
            assert broker.groups.get("cg").retry_max_times == 3 and broker.groups.get("a/b") is None
            sink.apply_delay_offsets({"offsetTable": {"3": 42}})
            assert broker.schedule.offsets[3] == 42

    asyncio.run(main())


def test_hook_tracing_sees_every_plugin_register_its_request_codes_and_roles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TIDEMQ_TRACE_HOOKS logs registration too: one traced call per plugin, in registration order."""
    echo = Echo()
    pm = manager_with(echo)
    pm.trace_hooks()  # what TIDEMQ_TRACE_HOOKS=1 turns on

    async def main() -> None:
        async with running(tmp_path, {}, manager=pm) as (broker, client):
            r = await call(client, broker, CUSTOM_CODE, {"x": "traced"})
            assert r.code == ResponseCode.SUCCESS  # registered through the traced call

    with caplog.at_level("DEBUG", logger="tidemq.hooks"):
        asyncio.run(main())
    traced = [r.getMessage() for r in caplog.records if r.name == "tidemq.hooks"]
    calls = [m for m in traced if m.startswith("tidemq_register_processors(register) -> ")]
    # Built-ins first (the acl plugin among them), then the third party: each call names one plugin.
    assert "tidemq_register_processors(register) -> ['broker_processors']" in calls[:-1], traced
    assert calls[-1] == "tidemq_register_processors(register) -> ['third-party-0']", traced
    assert any(m.startswith("tidemq_register_stores(register) -> ") for m in traced), traced
