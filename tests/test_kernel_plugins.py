"""The plugin manager: registration, lookup, errors and hook ordering."""

from __future__ import annotations

import types

import pytest
from conftest import fitting

from tidemq import hookimpl
from tidemq.errors import PluginError
from tidemq.observe import SendContext
from tidemq.plugins import (
    ROLE_HOOKS,
    ROLES,
    PluginManager,
    get_plugin_manager,
)


def make_plugin(role_hook: str, *names: str, factory=None) -> types.SimpleNamespace:
    role = next(r for r, h in ROLE_HOOKS.items() if h == role_hook)

    def register(register):
        for name in names:
            register.add(
                name,
                factory or (lambda ctx, n=name: fitting(role, ("built", n, dict(ctx.options)))),
                f"{name} summary",
            )

    return types.SimpleNamespace(**{role_hook: hookimpl(register)})


def test_registered_factory_is_built_with_its_options(tmp_path):
    pm = PluginManager()
    pm.register(make_plugin("tidemq_register_stores", "fancy"), name="fancy-store")
    built = pm.create("store", "fancy", options={"size": 3}, data_dir=tmp_path)
    assert built.payload == ("built", "fancy", {"size": 3})
    assert [p.name for p in pm.catalogue()["store"]] == ["fancy"]
    assert pm.catalogue()["store"][0].plugin == "fancy-store"


def test_unknown_name_lists_installed_choices_and_suggests():
    pm = PluginManager()
    pm.register(make_plugin("tidemq_register_flush_policies", "sync", "async"), name="flush")
    with pytest.raises(PluginError) as err:
        pm.lookup("flush", "asnyc", key="[plugins] flush")
    msg = str(err.value)
    assert "\n" not in msg
    assert "'asnyc'" in msg and "did you mean 'async'" in msg and "choices: async, sync" in msg


def test_same_name_registered_twice_names_both_plugins():
    pm = PluginManager()
    pm.register(make_plugin("tidemq_register_indexes", "hash"), name="first")
    pm.register(make_plugin("tidemq_register_indexes", "hash"), name="second")
    with pytest.raises(PluginError, match="registered twice.*'first'.*'second'"):
        pm.available("index")


def test_unknown_role_is_rejected():
    with pytest.raises(PluginError, match="unknown role 'stroe'"):
        PluginManager().available("stroe")


def test_before_send_veto_is_firstresult_and_later_plugins_run_first():
    pm = PluginManager()
    seen: list[str] = []

    class Tracer:
        @hookimpl
        def tidemq_before_send(self, context):
            seen.append("tracer")
            context.properties["TRACE"] = "1"

    class Acl:
        @hookimpl
        def tidemq_before_send(self, context):
            seen.append("acl")
            return "topic is read-only" if context.topic == "locked" else None

    pm.register(Tracer(), name="tracer")
    pm.register(Acl(), name="acl")  # registered later: called first
    ctx = SendContext(producer_group="g", topic="open", queue_id=0, properties={}, body_size=1)
    assert pm.hook.tidemq_before_send(context=ctx) is None
    assert seen == ["acl", "tracer"] and ctx.properties == {"TRACE": "1"}

    seen.clear()
    locked = SendContext(producer_group="g", topic="locked", queue_id=0, properties={}, body_size=1)
    assert pm.hook.tidemq_before_send(context=locked) == "topic is read-only"
    assert seen == ["acl"]  # the veto stops the remaining implementations
    assert locked.properties == {}


def test_broken_entry_point_plugin_names_itself(monkeypatch):
    from importlib import metadata

    ep = metadata.EntryPoint(name="broken", value="tidemq_no_such_module_xyz", group="tidemq")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [ep])
    with pytest.raises(PluginError, match="cannot load plugin 'broken'"):
        PluginManager().load_entry_points()


BUILT_INS = {
    "transport": {"tcp"},
    "store": {"mmap", "memory"},
    "flush": {"sync", "async"},
    "index": {"hash", "none"},
    "filter": {"TAG"},
    "replication": {"none"},
    "allocate": {"averagely", "averagely_by_circle", "consistent_hash"},
    "select": {"round_robin", "latency_fault"},
    "acl": {"none", "plain"},
    "metrics": {"none", "prometheus"},
}


@pytest.mark.parametrize("role", ROLES)
def test_built_in_plugins_register_through_the_entry_point_group(role):
    catalogue = get_plugin_manager().catalogue()
    names = {info.name for info in catalogue[role]}
    assert BUILT_INS[role] <= names
    assert all(info.distribution == "tidemq" for info in catalogue[role] if info.name in BUILT_INS[role])


def test_registration_goes_through_pluggy_so_specname_counts(tmp_path):
    class Named:
        @hookimpl(specname="tidemq_register_stores")
        def add_my_store(self, register):
            register.add("named", lambda ctx: fitting("store", "built by specname"))

    pm = PluginManager()
    pm.register(Named(), name="named-plugin")
    assert pm.create("store", "named", data_dir=tmp_path).payload == "built by specname"


def test_a_misspelt_hook_is_an_error_naming_the_plugin():
    class Misspelt:
        @hookimpl
        def tidemq_register_store(self, register):  # no such hook: the role is "stores"
            register.add("lost", lambda ctx: None)

    pm = PluginManager()
    with pytest.raises(PluginError, match="'misspelt'.*tidemq_register_store"):
        pm.register(Misspelt(), name="misspelt")
    assert pm.hook_manager.get_plugin("misspelt") is None  # left out whole
    assert "lost" not in pm.available("store")


def test_a_hook_with_arguments_its_spec_lacks_is_an_error_naming_the_plugin():
    class Wrong:
        @hookimpl
        def tidemq_register_stores(self, register, extra):
            pass

    pm = PluginManager()
    with pytest.raises(PluginError, match="'wrong'"):
        pm.register(Wrong(), name="wrong")
    assert pm.hook_manager.get_plugin("wrong") is None
    pm.register(make_plugin("tidemq_register_stores", "fine"), name="fine")
    assert list(pm.available("store")) == ["fine"]


def test_environment_switches_block_and_disable_autoload(monkeypatch):
    monkeypatch.setenv("TIDEMQ_BLOCK_PLUGINS", "store_memory, acl")
    pm = PluginManager()
    pm.load_entry_points()
    assert "memory" not in pm.available("store") and "mmap" in pm.available("store")
    assert pm.available("acl") == {}

    monkeypatch.delenv("TIDEMQ_BLOCK_PLUGINS")
    monkeypatch.setenv("TIDEMQ_DISABLE_PLUGIN_AUTOLOAD", "1")
    from importlib import metadata

    real = metadata.entry_points

    def with_a_third_party(group):
        third = metadata.EntryPoint(name="third", value="tidemq_no_such_module_xyz", group="tidemq")
        return [*real(group=group), third]  # would fail to import if it were loaded

    monkeypatch.setattr(metadata, "entry_points", with_a_third_party)
    pm = PluginManager()
    pm.load_entry_points()
    assert "mmap" in pm.available("store") and pm.hook_manager.get_plugin("third") is None


def test_hook_calls_can_be_traced(caplog):
    pm = PluginManager()
    pm.trace_hooks()
    pm.register(make_plugin("tidemq_register_stores", "traced"), name="traced-plugin")
    caplog.set_level("DEBUG", logger="tidemq.hooks")
    ctx = SendContext(producer_group="g", topic="t", queue_id=0, properties={}, body_size=1)
    pm.hook.tidemq_after_send(context=ctx)
    assert any("tidemq_after_send" in r.getMessage() for r in caplog.records if r.name == "tidemq.hooks")


def test_a_factory_whose_result_does_not_fit_its_role_is_named(tmp_path):
    pm = PluginManager()
    pm.register(
        make_plugin("tidemq_register_stores", "hollow", factory=lambda ctx: object()), name="hollow-store"
    )
    with pytest.raises(
        PluginError, match=r"store 'hollow' of plugin 'hollow-store' built a object.*MessageStore.*lacks"
    ):
        pm.create("store", "hollow", data_dir=tmp_path)


def test_the_listener_guard_sees_plugins_come_and_go():
    """The per-message guard is cached, yet a plugin registered (or removed) meanwhile is seen at once,
    whichever way it was registered: through tidemq's manager or pluggy's directly."""
    from tidemq.plugins import Listeners

    pm = PluginManager()
    listening = Listeners(pm.hook.tidemq_before_send, pm.hook.tidemq_after_send)
    assert not listening()

    class After:
        @hookimpl
        def tidemq_after_send(self, context):
            return None

    name = pm.register(After(), name="after")
    assert listening()
    pm.hook_manager.unregister(name=name)
    assert not listening()
    pm.hook_manager.register(After(), name="direct")
    assert listening()
