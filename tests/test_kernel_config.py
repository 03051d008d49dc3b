"""Config validation: every mistake is one line naming the key and the valid choices."""

from __future__ import annotations

import types

import attrs
import pytest

from tidemq import hookimpl
from tidemq.config import BrokerSettings, compose, load_config, parse_config, parse_options
from tidemq.errors import ConfigError
from tidemq.plugins import PluginManager


@pytest.fixture
def pm() -> PluginManager:
    """A manager with one fake plugin per broker role, so config checks need no real plugin."""
    pm = PluginManager()
    built: list[str] = []

    def reg(hook: str, *names: str):
        def register(register):
            for n in names:
                register.add(n, lambda ctx, role=register.role, n=n: built.append(role) or (role, n, ctx), "")

        return types.SimpleNamespace(**{hook: hookimpl(register)})

    for i, (hook, names) in enumerate(
        [
            ("tidemq_register_transports", ["tcp"]),
            ("tidemq_register_stores", ["mmap", "memory"]),
            ("tidemq_register_flush_policies", ["sync", "async"]),
            ("tidemq_register_indexes", ["hash", "none"]),
            ("tidemq_register_replications", ["none"]),
            ("tidemq_register_allocate_strategies", ["averagely"]),
            ("tidemq_register_queue_selectors", ["latency_fault"]),
        ]
    ):
        pm.register(reg(hook, *names), name=f"fake{i}")
    pm.built = built  # type: ignore[attr-defined]
    return pm


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_unknown_broker_key_suggests_and_lists(pm):
    with pytest.raises(ConfigError) as err:
        parse_config({"broker": {"lisen": "x"}}, "b.toml", pm)
    msg = one_line(err)
    assert "b.toml: [broker]: unknown key 'lisen'" in msg and "did you mean 'listen'" in msg
    assert "valid keys:" in msg and "namesrv" in msg


def test_wrong_type_names_key_and_type(pm):
    with pytest.raises(ConfigError) as err:
        parse_config({"broker": {"default_topic_queues": "eight"}}, "b.toml", pm)
    assert "default_topic_queues = 'eight' should be of type int" in one_line(err)


def test_bad_choice_lists_choices(pm):
    with pytest.raises(ConfigError) as err:
        parse_config({"broker": {"role": "MASTER"}}, "b.toml", pm)
    assert "choices: ASYNC_MASTER, SYNC_MASTER, SLAVE" in one_line(err)


def test_unknown_plugin_name_lists_installed(pm):
    with pytest.raises(ConfigError) as err:
        parse_config({"plugins": {"store": "mmapp"}}, "b.toml", pm)
    msg = one_line(err)
    assert "[plugins] store = 'mmapp' is not installed" in msg
    assert "did you mean 'mmap'" in msg and "choices: memory, mmap" in msg


def test_unknown_role_and_table(pm):
    with pytest.raises(ConfigError, match=r"\[plugins\] unknown role 'stor'.*did you mean 'store'"):
        parse_config({"plugins": {"stor": "mmap"}}, "b.toml", pm)
    with pytest.raises(ConfigError, match=r"unknown table \[brokr\].*did you mean 'broker'"):
        parse_config({"brokr": {}}, "b.toml", pm)


def test_options_for_a_plugin_that_is_not_installed(pm):
    with pytest.raises(
        ConfigError, match=r"\[flush.asyncc\] configures a plugin that is not installed.*'async'"
    ):
        parse_config({"flush": {"asyncc": {"interval_ms": 5}}}, "b.toml", pm)


def test_file_errors(tmp_path, pm):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", pm)
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker\nname=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, pm)


def test_compose_builds_selected_plugins_in_order_with_their_options(tmp_path, pm):
    cfg = parse_config(
        {
            "broker": {"data_dir": str(tmp_path)},
            "plugins": {"store": "memory", "flush": "sync"},
            "store": {"memory": {"capacity": 10}, "mmap": {"ignored": True}},
        },
        "b.toml",
        pm,
    )
    comps = compose(cfg, pm)
    assert pm.built == ["transport", "flush", "index", "store", "replication"]
    role, name, ctx = comps["store"]
    assert (role, name) == ("store", "memory")
    assert ctx.options == {"capacity": 10}  # only the chosen plugin's table
    assert ctx.data_dir == tmp_path
    assert set(ctx.components) == {"transport", "flush", "index"}  # built before the store
    assert comps["flush"][1] == "sync"


def test_parse_options_for_plugin_tables():
    @attrs.define
    class Opts:
        interval_ms: int = 500
        pages: int = 4

    assert parse_options(Opts, {"pages": 8}, "[flush.async]") == Opts(500, 8)
    with pytest.raises(ConfigError, match=r"\[flush.async\]: unknown key 'page' \(did you mean 'pages'\?\)"):
        parse_options(Opts, {"page": 8}, "[flush.async]")


def test_defaults_are_a_usable_broker():
    s = BrokerSettings()
    assert (s.host, s.port) == ("127.0.0.1", 10911)
    assert s.store_path.name == "broker-a"
