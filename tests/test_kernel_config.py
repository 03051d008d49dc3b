"""Config validation: every mistake is one line naming the key and the valid choices."""

from __future__ import annotations

import types

import attrs
import pytest
from conftest import fitting

from tidemq import hookimpl
from tidemq.config import BrokerSettings, NamesrvSettings, compose, load_config, parse_config, parse_options
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
                register.add(
                    n,
                    lambda ctx, role=register.role, n=n: built.append(role) or fitting(role, (role, n, ctx)),
                    "",
                )

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
    role, name, ctx = comps["store"].payload
    assert (role, name) == ("store", "memory")
    assert ctx.options == {"capacity": 10}  # only the chosen plugin's table
    assert ctx.data_dir == tmp_path
    assert set(ctx.components) == {"transport", "flush", "index"}  # built before the store
    assert comps["flush"].payload[1] == "sync"


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


# ---------------------------------------------------------------------------- numbers (issue 20, item 5)
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("table", "key", "value"),
    [
        ("namesrv", "scan_interval_s", NAN),
        ("namesrv", "scan_interval_s", INF),
        ("namesrv", "broker_expire_s", INF),
        ("namesrv", "broker_expire_s", -INF),
        ("namesrv", "scan_interval_s", 0),
        ("namesrv", "broker_expire_s", -1.0),
        ("namesrv", "max_frame_size", 0),
        ("broker", "register_interval_s", NAN),
        ("broker", "consumer_offset_flush_s", 0.0),
        ("broker", "consumer_housekeeping_s", INF),
        ("broker", "transaction_check_interval_s", -5),
        ("broker", "transaction_timeout_s", NAN),
        ("broker", "default_topic_queues", 0),
        ("broker", "max_message_size", -1),
        ("broker", "short_polling_ms", 0),
        ("broker", "id", -1),
    ],
)
def test_non_finite_or_out_of_range_numbers_are_refused_naming_the_key(pm, table, key, value):
    with pytest.raises(ConfigError) as err:
        parse_config({table: {key: value}}, "b.toml", pm)
    msg = one_line(err)
    assert f"[{table}]" in msg and key in msg, msg


def test_plugin_float_options_must_be_finite():
    @attrs.define
    class Opts:
        idle_s: float = 1.0
        ratio: float | None = None

    for bad in (NAN, INF, -INF):
        with pytest.raises(ConfigError, match=r"\[x.y\]: idle_s = .* must be a finite number"):
            parse_options(Opts, {"idle_s": bad}, "[x.y]")
        with pytest.raises(ConfigError, match="ratio"):
            parse_options(Opts, {"ratio": bad}, "[x.y]")
    assert parse_options(Opts, {"idle_s": 2}, "[x.y]").idle_s == 2


def test_list_elements_are_type_checked(pm):
    with pytest.raises(ConfigError, match=r"\[broker\]: namesrv"):
        parse_config({"broker": {"namesrv": [9876]}}, "b.toml", pm)


def test_namesrv_refuses_non_finite_runtime_updates():
    from tidemq.namesrv import NameServer

    ns = NameServer(NamesrvSettings(), transport=object())
    for text in ("scan_interval_s=nan", "broker_expire_s=inf", "scan_interval_s=-inf", "broker_expire_s=0"):
        err = ns.update_config_properties(text)
        assert err is not None and "\n" not in err and text.split("=")[0] in err, (text, err)
    assert (ns.settings.scan_interval_s, ns.settings.broker_expire_s) == (10.0, 120.0)
    assert ns.update_config_properties("scan_interval_s=0.5\nbroker_expire_s=30") is None
    assert (ns.settings.scan_interval_s, ns.settings.broker_expire_s) == (0.5, 30.0)


# ---------------------------------------------------------------------------- listen addresses (item 10)
@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:109211",  # served on 109211 % 65536 before
        "127.0.0.1:65536",
        "76447",
        "10911",
        "localhost",
        "127.0.0.1:",
        ":10911",
        "::1:10911",  # IPv6 without brackets
        "[::1]",
        "[::1]:99999",
        "[not-v6]:10911",
        "127.0.0.1:+80",
        "127.0.0.1:-1",
        "127.0.0.1:1_0",
        "127.0.0.1:\uff18\uff10",  # full-width digits: int() takes them
        "127.0.0.1: 80",
        "my host:80",
        "",
    ],
)
def test_bad_listen_addresses_are_refused_naming_the_key(pm, value):
    for table in ("broker", "namesrv"):
        with pytest.raises(ConfigError) as err:
            parse_config({table: {"listen": value}}, "b.toml", pm)
        msg = one_line(err)
        assert f"[{table}]" in msg and "listen" in msg and "HOST:PORT" in msg, msg


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("127.0.0.1:10911", "127.0.0.1", 10911),
        ("[::1]:10911", "::1", 10911),
        ("localhost:0", "localhost", 0),
        ("0.0.0.0:65535", "0.0.0.0", 65535),
        ("broker-a.example.com:1", "broker-a.example.com", 1),
    ],
)
def test_good_listen_addresses(pm, value, host, port):
    s = parse_config({"broker": {"listen": value}, "namesrv": {"listen": value}}, "b.toml", pm)
    assert (s.broker.host, s.broker.port) == (host, port)
    assert (s.namesrv.host, s.namesrv.port) == (host, port)


def test_advertise_and_namesrv_addresses_need_a_real_port(pm):
    for broker in ({"advertise": "10.0.0.1:0"}, {"advertise": "10.0.0.1"}, {"namesrv": ["127.0.0.1:0"]}):
        with pytest.raises(ConfigError) as err:
            parse_config({"broker": broker}, "b.toml", pm)
        assert next(iter(broker)) in one_line(err)
    ok = parse_config({"broker": {"advertise": "10.0.0.1:10911"}}, "b.toml", pm)
    assert ok.broker.address == "10.0.0.1:10911"


def test_parse_address_names_the_flag():
    from tidemq.config import parse_address

    with pytest.raises(ConfigError) as err:
        parse_address("10911", "--broker-listen")
    assert one_line(err).startswith("--broker-listen = '10911'")
    assert parse_address("[::1]:9876", "--listen") == ("::1", 9876)
