"""Plugin loading and the per-role registry of named factories.

Plugins are found through the ``tidemq`` entry-point group: built-ins and third-party
distributions alike.  Each entry point names a module (or object) holding ``@tidemq.hookimpl``
functions.  After loading, every registration hook is called once per plugin, in registration
order, through pluggy's hook callers (so ``specname`` and hook tracing apply:
:meth:`PluginManager.call_per_plugin`), and the factories are kept by role and name; :meth:`PluginManager.create` then builds the instance a config asks for.

Environment switches, as pytest and datasette have them:

* ``TIDEMQ_DISABLE_PLUGIN_AUTOLOAD=1``: load only tidemq's own plugins, none of a third party's;
* ``TIDEMQ_BLOCK_PLUGINS=name,...``: never load the entry points of these names;
* ``TIDEMQ_TRACE_HOOKS=1``: log every hook call and its result at DEBUG (logger ``tidemq.hooks``).
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import pluggy

from tidemq import PROJECT, hookspecs
from tidemq.errors import PluginError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = PROJECT

#: role -> registration hook name.  Roles are the pieces a broker is composed of.
ROLE_HOOKS: dict[str, str] = {
    "transport": "tidemq_register_transports",
    "flush": "tidemq_register_flush_policies",
    "index": "tidemq_register_indexes",
    "filter": "tidemq_register_filters",
    "store": "tidemq_register_stores",
    "replication": "tidemq_register_replications",
    "allocate": "tidemq_register_allocate_strategies",
    "select": "tidemq_register_queue_selectors",
    "acl": "tidemq_register_acl_validators",
    "metrics": "tidemq_register_metrics_exporters",
}
ROLES: tuple[str, ...] = tuple(ROLE_HOOKS)
#: The order in which the composer builds roles; later factories see earlier instances.
BUILD_ORDER: tuple[str, ...] = ("transport", "flush", "index", "store", "replication")

Factory = Callable[["PluginContext"], Any]


@attrs.frozen
class PluginInfo:
    """One named implementation of a role."""

    role: str
    name: str
    factory: Factory
    summary: str
    plugin: str  # the registering plugin's name (its entry point name)
    distribution: str  # the distribution that ships it ("tidemq" for built-ins)


@attrs.frozen
class PluginContext:
    """What a factory receives.

    ``options`` is the role's own table from the config (``[store.mmap]`` for ``store = "mmap"``);
    ``components`` holds the instances already built in :data:`BUILD_ORDER`.
    """

    role: str
    name: str
    options: Mapping[str, Any]
    data_dir: Path
    manager: PluginManager
    components: Mapping[str, Any] = attrs.field(factory=dict)
    settings: Mapping[str, Any] = attrs.field(factory=dict)


class Register:
    """Handed to a registration hook; collects the role's named factories."""

    def __init__(self, role: str, plugin: str, distribution: str, sink: dict[str, PluginInfo]):
        self.role = role
        self._plugin = plugin
        self._distribution = distribution
        self._sink = sink

    def add(self, name: str, factory: Factory, summary: str = "") -> None:
        """Register ``factory`` under ``name`` for this role; a name may be taken only once."""
        if not name or not isinstance(name, str):
            raise PluginError(f"plugin {self._plugin!r} registered an empty {self.role} name")
        existing = self._sink.get(name)
        if existing is not None:
            raise PluginError(
                f"{self.role} {name!r} is registered twice: by plugin {existing.plugin!r} "
                f"({existing.distribution}) and by plugin {self._plugin!r} ({self._distribution})"
            )
        self._sink[name] = PluginInfo(self.role, name, factory, summary, self._plugin, self._distribution)


class PluginManager:
    """Loads plugins and answers which implementations each role has."""

    def __init__(self) -> None:
        self.hook_manager = HookManager(PROJECT)
        self.hook_manager.add_hookspecs(hookspecs)
        self._registry: dict[str, dict[str, PluginInfo]] = {role: {} for role in ROLES}
        self._distributions: dict[str, str] = {}
        self._collected = False

    @property
    def hook(self) -> Any:
        """The pluggy hook relay: ``manager.hook.tidemq_after_send(context=...)``."""
        return self.hook_manager.hook

    # ------------------------------------------------------------------ loading
    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Load every plugin advertised in the entry-point group, built-ins first.

        ``TIDEMQ_DISABLE_PLUGIN_AUTOLOAD`` keeps third-party plugins out and
        ``TIDEMQ_BLOCK_PLUGINS`` names entry points never to load (see the module docstring).
        """
        for name in _env_list("TIDEMQ_BLOCK_PLUGINS"):
            self.hook_manager.set_blocked(name)
        own_only = os.environ.get("TIDEMQ_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0")
        eps = [
            ep
            for ep in metadata.entry_points(group=group)
            if not (own_only and (ep.dist.name if ep.dist else "") != PROJECT)
        ]

        def order(ep: metadata.EntryPoint) -> tuple[int, str, str]:
            dist = ep.dist.name if ep.dist else ""
            return (0 if dist == PROJECT else 1, dist, ep.name)

        for ep in sorted(eps, key=order):
            if self.hook_manager.get_plugin(ep.name) is not None or self.hook_manager.is_blocked(ep.name):
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # a broken third-party plugin must name itself
                raise PluginError(f"cannot load plugin {ep.name!r} ({ep.value}): {exc}") from exc
            self.register(obj, name=ep.name, distribution=ep.dist.name if ep.dist else "?")

    def register(self, plugin: object, name: str | None = None, distribution: str = "local") -> str:
        """Register a plugin object or module directly (tests, embedding).

        A hook implementation whose arguments do not fit its spec, or that names a hook no spec
        declares (``tidemq_register_store``), is a :class:`PluginError` naming the plugin, and
        the plugin is left out whole.
        """
        try:
            registered = self.hook_manager.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            self._drop(plugin)
            raise PluginError(f"plugin {name or plugin!r} does not fit tidemq's hooks: {exc}") from exc
        if registered is None:
            raise PluginError(f"plugin {name!r} is blocked or already registered")
        try:
            self.hook_manager.check_pending()
        except pluggy.PluginValidationError as exc:
            self._drop(plugin)
            raise PluginError(f"plugin {registered!r} implements a hook tidemq does not have: {exc}") from exc
        self._distributions[registered] = distribution
        self._collected = False
        return registered

    def _drop(self, plugin: object) -> None:
        # pluggy keeps a plugin that failed validation in its name table: take it out again.
        if self.hook_manager.is_registered(plugin):
            self.hook_manager.unregister(plugin)

    def _collect(self) -> None:
        if self._collected:
            return
        self._registry = {role: {} for role in ROLES}
        for role, hook_name in ROLE_HOOKS.items():
            self.call_per_plugin(hook_name, self._registering(role))
        self._collected = True

    def _registering(self, role: str) -> Callable[[str], Mapping[str, Any]]:
        """What each plugin's registration hook of ``role`` gets: a :class:`Register` naming it."""
        sink = self._registry[role]

        def kwargs(plugin: str) -> Mapping[str, Any]:
            return {"register": Register(role, plugin, self._distributions.get(plugin, "local"), sink)}

        return kwargs

    def call_per_plugin(self, hook_name: str, kwargs: Callable[[str], Mapping[str, Any]]) -> None:
        """Call hook ``hook_name`` once per plugin implementing it, in registration order, with
        ``kwargs(plugin_name)``: what each call gets knows its plugin (a name or request code
        registered twice blames the later plugin, by name).

        Each call goes through pluggy's hook caller (a subset caller holding that plugin alone),
        so ``specname``, hook-call monitoring and ``TIDEMQ_TRACE_HOOKS`` see it; pluggy alone would
        call the plugins last-registered first, in one call that cannot say whose turn it is.
        """
        hm = self.hook_manager
        impls = getattr(hm.hook, hook_name).get_hookimpls()
        plugins: list[tuple[object, str]] = []
        for impl in impls:
            if all(impl.plugin is not seen for seen, _name in plugins):
                plugins.append((impl.plugin, impl.plugin_name))
        # pluggy keeps the plugins to leave out in a set: with an unhashable plugin object (a
        # SimpleNamespace) implementing the hook, the hook functions are called directly.
        through_pluggy = all(_hashable(plugin) for plugin, _name in plugins)
        for plugin, name in plugins:
            if through_pluggy:
                others = [other for other, _name in plugins if other is not plugin]
                hm.subset_hook_caller(hook_name, others)(**kwargs(name))
                continue
            for impl in impls:
                if impl.plugin is plugin:
                    impl.function(**kwargs(name))

    def trace_hooks(self) -> None:
        """Log every hook call and its outcome at DEBUG on ``tidemq.hooks`` (``TIDEMQ_TRACE_HOOKS``)."""
        hooks_log = logging.getLogger("tidemq.hooks")

        def before(hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            hooks_log.debug("%s(%s) -> %s", hook_name, ", ".join(kwargs), [i.plugin_name for i in impls])

        def after(outcome: Any, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            exc = outcome.exception
            hooks_log.debug("%s returned %r", hook_name, exc if exc is not None else outcome.get_result())

        self.hook_manager.add_hookcall_monitoring(before, after)

    # ------------------------------------------------------------------ queries
    def available(self, role: str) -> dict[str, PluginInfo]:
        """Implementations of ``role`` by name."""
        if role not in self._registry:
            raise PluginError(f"unknown role {role!r}; roles are: {', '.join(ROLES)}")
        self._collect()
        return dict(self._registry[role])

    def catalogue(self) -> dict[str, list[PluginInfo]]:
        """Every role with its implementations, sorted by name (``tidemq plugins``)."""
        self._collect()
        return {role: sorted(self._registry[role].values(), key=lambda p: p.name) for role in ROLES}

    def lookup(self, role: str, name: str, *, key: str | None = None) -> PluginInfo:
        """The implementation called ``name``, or a one-line error listing what is installed."""
        choices = self.available(role)
        info = choices.get(name)
        if info is None:
            raise PluginError(unknown_choice(key or role, name, choices))
        return info

    def create(
        self,
        role: str,
        name: str,
        *,
        options: Mapping[str, Any] | None = None,
        data_dir: Path | str = ".",
        components: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Any:
        """Build the implementation of ``role`` called ``name``.

        The result must fit the role's contract (:func:`role_contract`): a factory returning
        anything else is a :class:`PluginError` naming the plugin, not an AttributeError later.
        """
        info = self.lookup(role, name)
        ctx = PluginContext(
            role=role,
            name=name,
            options=dict(options or {}),
            data_dir=Path(data_dir),
            manager=self,
            components=dict(components or {}),
            settings=dict(settings or {}),
        )
        instance = info.factory(ctx)
        contract = role_contract(role)
        if not isinstance(instance, contract):
            missing = sorted(m for m in contract_members(contract) if not hasattr(instance, m))
            raise PluginError(
                f"{role} {name!r} of plugin {info.plugin!r} built a {type(instance).__name__}, which is no "
                f"{contract.__module__}.{contract.__name__}"
                + (f" (it lacks {', '.join(missing)})" if missing else "")
            )
        return instance


def role_contract(role: str) -> type:
    """The runtime-checkable Protocol a role's instances implement."""
    from tidemq.acl import AccessValidator
    from tidemq.filter import FilterFactory
    from tidemq.flush import FlushPolicy
    from tidemq.index import KeyIndex
    from tidemq.metrics import MetricsExporter
    from tidemq.queues import AllocateStrategy, QueueSelector
    from tidemq.replication import Replication
    from tidemq.store import MessageStore
    from tidemq.transport import Transport

    contracts: dict[str, type] = {
        "transport": Transport,
        "store": MessageStore,
        "flush": FlushPolicy,
        "index": KeyIndex,
        "filter": FilterFactory,
        "replication": Replication,
        "allocate": AllocateStrategy,
        "select": QueueSelector,
        "acl": AccessValidator,
        "metrics": MetricsExporter,
    }
    return contracts[role]


def contract_members(contract: type) -> set[str]:
    """The public methods and attributes a role's Protocol declares."""
    members = {n for n in vars(contract) if not n.startswith("_")}
    return members | set(getattr(contract, "__annotations__", {}))


def _hashable(obj: object) -> bool:
    return type(obj).__hash__ is not None


#: Bumped whenever a plugin is registered or unregistered (:class:`HookManager`): what
#: :class:`Listeners` caches its answer on.
_generation = 0


class HookManager(pluggy.PluginManager):
    """pluggy's plugin manager, counting the plugins that come and go (for :class:`Listeners`).

    Only pluggy's public methods are overridden; every registration, tidemq's or a direct
    ``hook_manager.register``/``unregister``, goes through them.
    """

    def register(self, plugin: object, name: str | None = None) -> str | None:
        global _generation
        try:
            return super().register(plugin, name)
        finally:
            _generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        global _generation
        try:
            return super().unregister(plugin, name)
        finally:
            _generation += 1


class Listeners:
    """Whether any plugin implements one of ``hooks`` now: the one guard before building a hook's
    context per message (``SendContext``, ``ConsumeContext``), so unheard hooks cost nothing.

    Asked per message, answered from a cache until a plugin is registered or unregistered (a
    plugin added while the broker runs is seen by the next message), then from pluggy's public
    ``get_hookimpls``.  ``hooks`` are hook callers of a :class:`PluginManager`'s relay.
    """

    __slots__ = ("_any", "_generation", "_hooks")

    def __init__(self, *hooks: pluggy.HookCaller) -> None:
        self._hooks = hooks
        self._generation = -1
        self._any = False

    def __call__(self) -> bool:
        if self._generation == _generation:
            return self._any
        self._generation = _generation
        self._any = any(hook.get_hookimpls() for hook in self._hooks)
        return self._any


def unknown_choice(key: str, value: str, choices: Iterable[str]) -> str:
    """A one-line message for a value that is not among ``choices``."""
    names = sorted(choices)
    hint = difflib.get_close_matches(value, names, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    installed = ", ".join(names) if names else "none installed"
    return f"{key} = {value!r} is not installed{suggestion}; choices: {installed}"


_default: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide manager with every entry-point plugin loaded."""
    global _default
    if _default is None:
        pm = PluginManager()
        if os.environ.get("TIDEMQ_TRACE_HOOKS", "") not in ("", "0"):
            pm.trace_hooks()
        pm.load_entry_points()
        _default = pm
    return _default


def _env_list(variable: str) -> list[str]:
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]
