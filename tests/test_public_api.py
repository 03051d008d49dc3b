"""The plugin-facing API: ``tidemq.__all__``, the public submodules, and what the built-in plugins import.

A plugin may import a ``tidemq.*`` name when it is public: in ``tidemq.__all__`` (from ``tidemq`` or
from the module defining it) or in the ``__all__`` of a public submodule (:data:`PUBLIC_SUBMODULES`,
named in ``tidemq``'s docstring).  Anything else is on :data:`ALLOWED_INTERNAL`, one entry per name
with the reason, so the exceptions are written down and shrink instead of spreading.

Between plugins the same rule holds: a plugin may import from another only the names of that
plugin's declared public surface, the ``__all__`` of its ``tidemq_<x>.api`` module (or of its
package), and a class it subclasses from there may use only the base's public members.
:data:`ALLOWED_CROSS_PLUGIN` would list exceptions; it is empty.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import tidemq

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"

#: Submodules that are public through their own ``__all__`` (and named in ``tidemq.__doc__``).
PUBLIC_SUBMODULES = (
    "tidemq.address",
    "tidemq.broker.services",
    "tidemq.broker.services.transactions",
    "tidemq.cli",
    "tidemq.client",
    "tidemq.compression",
    "tidemq.datadir",
    "tidemq.file_regions",
    "tidemq.writeback",
    "tidemq.logs",
    "tidemq.message",
    "tidemq.metrics",
    "tidemq.mqjson",
    "tidemq.names",
    "tidemq.pop_header",
    "tidemq.remoting",
    "tidemq.remoting.codec",
    "tidemq.remoting.codes",
    "tidemq.remoting.command",
    "tidemq.remoting.errors",
    "tidemq.remoting.protocol",
    "tidemq.threads",
    "tidemq.topic_attributes",
    "tidemq.trace",
    "tidemq.trace.view",
)

#: (module, name) a built-in plugin imports although it is not public.  Started from the imports
#: of issue 27; remove an entry when its last import goes, add one only with a reason.
ALLOWED_INTERNAL: frozenset[tuple[str, str]] = frozenset(
    {
        # The gRPC consumers' backend (consume_backend.py, issue 40) registers consumers and reads
        # the POP service's refusals; to be published with the services layer.
        ("tidemq.broker.clients", "SubscriptionData"),
        ("tidemq.broker.services.clients", "ConsumerRegistration"),
        ("tidemq.broker.services.pop", "PopError"),
        # Delay levels and the schedule topic: the mmap store keeps RocketMQ's delay offsets.
        ("tidemq.delay", "DEFAULT_DELAY_LEVELS"),
        ("tidemq.delay", "SCHEDULE_TOPIC"),
        ("tidemq.delay", "delay_level_in"),
        ("tidemq.delay", "parse_delay_levels"),
        ("tidemq.delay", "schedule_tags_code"),
        # Protected mode and secret files (issue 41): the HA plugins check their port and secret file
        # as the kernel checks its own listeners and secret files.
        ("tidemq.protected", "check_ha_listener"),
        # ... and the gRPC proxy (tidemq proxy) its listener.
        ("tidemq.protected", "Listener"),
        ("tidemq.protected", "check"),
        ("tidemq.secretfile", "private_mode_problem"),
        # Request signing: the acl plugin checks what the kernel's clients sign.
        ("tidemq.acl", "ACCESS_KEY"),
        ("tidemq.acl", "SIGNATURE"),
        ("tidemq.acl", "verify_signature"),
        # ... and checks them from a request lane's frame (issue 38) with the same HmacSHA1.
        ("tidemq.acl", "verify_fields"),
        ("tidemq.acl", "SigningKey"),
        ("tidemq.acl", "signing_key"),
        # RocketMQ 5's signature (gRPC): the acl plugin checks what the v5 clients sign.
        ("tidemq.acl", "parse_v5_authorization"),
        ("tidemq.acl", "verify_v5_signature"),
        # The filter server signs the pulls it forwards to its broker as the kernel's clients do.
        ("tidemq.acl", "ONS_CHANNEL"),
        ("tidemq.acl", "SECURITY_TOKEN"),
        ("tidemq.acl", "sign_request"),
        # Bounds for tidemq.number() in option classes.
        ("tidemq.config", "DAY_S"),
        ("tidemq.config", "INT32_MAX"),
        # The mmap verifier's default index when it is given only a data directory.
        ("tidemq.config", "DEFAULT_PLUGINS"),
        # Small kernel utilities: a crash-safe file write, a restarting background task.
        ("tidemq.jsonfile", "atomic_write_bytes"),
        ("tidemq.tasks", "supervise"),
        # The metrics exporter's tidemq_build_info says whether the compiled codec runs.
        ("tidemq._native", "ACTIVE"),
    }
)

#: (plugin directory, module, name): an import of another plugin's name outside its declared
#: public surface.  Empty; add an entry only with a reason, and remove it when its import goes.
ALLOWED_CROSS_PLUGIN: frozenset[tuple[str, str, str]] = frozenset()

#: The module of a plugin package whose ``__all__`` declares what other plugins may import.
PLUGIN_API_MODULE = "api"


def _plugin_files() -> list[Path]:
    return sorted(p for p in PLUGINS.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every absolute import in ``path``; name None for ``import module``."""
    out: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.extend((node.lineno, node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, None) for alias in node.names)
    return out


def _is_public(module: str, name: str) -> bool:
    if module == "tidemq":
        return name in tidemq.__all__
    if module in PUBLIC_SUBMODULES and name in importlib.import_module(module).__all__:
        return True
    # A name of tidemq.__all__ imported from the module that defines it.
    return name in tidemq.__all__ and getattr(importlib.import_module(module), name, None) is getattr(
        tidemq, name
    )


def test_every_public_name_resolves() -> None:
    assert len(set(tidemq.__all__)) == len(tidemq.__all__)
    for name in tidemq.__all__:
        assert getattr(tidemq, name) is not None, name
    assert set(tidemq.__all__) <= set(dir(tidemq))
    for module_name in PUBLIC_SUBMODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            assert hasattr(module, name), f"{module_name}.__all__ names {name!r}, which it lacks"


def test_lazy_names_match_all_and_the_type_checking_imports() -> None:
    """``__all__``, the lazy table and the ``TYPE_CHECKING`` imports name the same things."""
    lazy = {(module, name) for name, module in tidemq._LAZY.items()}
    assert set(tidemq.__all__) == {"PROJECT", "__version__", "hookimpl"} | {name for _, name in lazy}
    tree = ast.parse(Path(tidemq.__file__).read_text())
    typed = {
        (node.module, alias.name)
        for block in tree.body
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == lazy


def test_public_submodules_are_documented() -> None:
    doc = tidemq.__doc__ or ""
    for module_name in PUBLIC_SUBMODULES:
        short = module_name.rsplit(".", 1)[1]
        assert f"``{module_name}``" in doc or f"``{short}``" in doc, module_name


def test_import_tidemq_stays_cheap() -> None:
    """The public names are lazy: ``import tidemq`` imports no tidemq submodule."""
    code = "import sys, tidemq; print(sorted(m for m in sys.modules if m.startswith('tidemq.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        tidemq.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("tidemq.no_such_name resolved")


def test_plugins_import_only_the_public_api() -> None:
    bad = []
    for path in _plugin_files():
        for line, module, name in _imports(path):
            if module != "tidemq" and not module.startswith("tidemq."):
                continue
            where = f"{path.relative_to(PLUGINS.parent)}:{line}"
            if name is None:
                if module != "tidemq" and module not in PUBLIC_SUBMODULES:
                    bad.append(f"{where}: import {module}")
            elif not _is_public(module, name) and (module, name) not in ALLOWED_INTERNAL:
                bad.append(f"{where}: from {module} import {name}")
    assert not bad, "plugins import names outside tidemq's public API:\n" + "\n".join(bad)


def test_allowed_internal_names_exist() -> None:
    for module, name in sorted(ALLOWED_INTERNAL):
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
        assert not _is_public(module, name), f"{module}.{name} is public now: drop it from the list"


def _plugin_surface(package: str) -> dict[str, set[str]]:
    """The declared public surface of plugin ``package``: module -> the names its ``__all__`` lists."""
    surface: dict[str, set[str]] = {}
    for module_name in (package, f"{package}.{PLUGIN_API_MODULE}"):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        names = getattr(module, "__all__", None)
        if names is not None:
            surface[module_name] = set(names)
    return surface


def _cross_plugin_imports() -> list[tuple[str, str, int, str, str | None]]:
    """(own plugin, file, line, module, name) of each import of another plugin's package."""
    out = []
    for path in _plugin_files():
        own = path.relative_to(PLUGINS).parts[0]
        for line, module, name in _imports(path):
            package = module.split(".")[0]
            if package.startswith("tidemq_") and package != f"tidemq_{own}":
                out.append((own, f"{path.relative_to(PLUGINS.parent)}", line, module, name))
    return out


def test_plugins_import_only_each_other_s_public_surface() -> None:
    bad = []
    for own, where, line, module, name in _cross_plugin_imports():
        surface = _plugin_surface(module.split(".")[0])
        if name is None or name not in surface.get(module, set()):
            if name is None or (own, module, name) not in ALLOWED_CROSS_PLUGIN:
                what = f"import {module}" if name is None else f"from {module} import {name}"
                bad.append(f"{where}:{line}: {what}")
    assert not bad, (
        "plugins import another plugin's names outside its declared public surface:\n" + "\n".join(bad)
    )


def test_allowed_cross_plugin_entries_are_still_needed() -> None:
    """Each exception is still imported, and still outside the other plugin's public surface."""
    used = {(own, module, name) for own, _where, _line, module, name in _cross_plugin_imports()}
    for own, module, name in sorted(ALLOWED_CROSS_PLUGIN):
        assert (own, module, name) in used, f"{own} no longer imports {module}.{name}: drop the entry"
        surface = _plugin_surface(module.split(".")[0])
        assert name not in surface.get(module, set()), f"{module}.{name} is public now: drop the entry"


def test_declared_plugin_surfaces_resolve_and_are_documented() -> None:
    """A plugin's surface names exist, none is private, and its package docstring points to it."""
    for package_dir in sorted(p for p in PLUGINS.iterdir() if (p / "__init__.py").exists()):
        package = f"tidemq_{package_dir.name}"
        for module_name, names in _plugin_surface(package).items():
            module = importlib.import_module(module_name)
            for name in names:
                assert not name.startswith("_"), f"{module_name}.__all__ names the private {name!r}"
                assert hasattr(module, name), f"{module_name}.__all__ names {name!r}, which it lacks"
            doc = importlib.import_module(package).__doc__ or ""
            assert module_name == package or module_name in doc, f"{package}'s docstring: name {module_name}"


def _private_members(cls: type) -> set[str]:
    """``_name`` members of ``cls`` and its bases: defined in the class or assigned on ``self``."""
    names = {n for n in dir(cls) if n.startswith("_") and not n.startswith("__")}
    for klass in cls.__mro__[:-1]:
        if klass.__module__ == "builtins":  # an exception's bases: no source, no private members
            continue
        for node in ast.walk(ast.parse(inspect.getsource(klass))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                if node.attr.startswith("_") and not node.attr.startswith("__"):
                    names.add(node.attr)
    return names


def test_subclasses_of_another_plugin_s_class_use_only_its_public_members() -> None:
    bad = []
    for _own, where, _line, module, name in _cross_plugin_imports():
        base = getattr(importlib.import_module(module), name or "", None)
        if not isinstance(base, type):
            continue
        private = _private_members(base)
        tree = ast.parse((PLUGINS.parent / where).read_text())
        for cls in ast.walk(tree):
            if not isinstance(cls, ast.ClassDef) or not any(
                isinstance(b, ast.Name) and b.id == name for b in cls.bases
            ):
                continue
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and node.attr in private:
                    bad.append(f"{where}:{node.lineno}: {cls.name} uses {name}'s private {node.attr}")
    assert not bad, "\n".join(bad)
