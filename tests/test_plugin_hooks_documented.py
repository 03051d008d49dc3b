"""The hook documentation cannot drift from the hookspecs (datasette's test_plugin_hooks_are_documented)."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import tidemq
import tidemq.hookspecs
from tidemq.plugins import ROLE_HOOKS

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "docs" / "plugin_hooks.md").read_text()
README = (ROOT / "README.md").read_text()

HOOKS = {
    name: fn for name, fn in vars(tidemq.hookspecs).items() if name.startswith("tidemq_") and callable(fn)
}


def signature(fn: object) -> str:
    """``name(arg: Type) -> Return`` as the code declares it (annotations are strings here)."""
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    params = ", ".join(f"{p.name}: {p.annotation}" for p in sig.parameters.values())
    return f"{fn.__name__}({params}) -> {sig.return_annotation}"  # type: ignore[attr-defined]


def test_there_are_hooks_to_document() -> None:
    assert len(HOOKS) >= 16


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hook_has_a_heading_with_its_exact_signature(name: str) -> None:
    heading = f"### `{signature(HOOKS[name])}`"
    assert heading in DOCS, f"docs/plugin_hooks.md lacks the heading {heading}"


def test_the_docs_document_no_hook_that_does_not_exist() -> None:
    documented = set(re.findall(r"^### `(tidemq_\w+)\(", DOCS, re.M))
    assert documented == set(HOOKS)


def test_the_readme_roles_table_names_every_role_and_its_hook() -> None:
    rows = dict(re.findall(r"^\| (\w+) \| `(tidemq_register_\w+)` \|", README, re.M))
    assert rows == ROLE_HOOKS


#: ``| `Name` | `tidemq.module` | implemented by | called by |``: a row of the published-types tables.
TYPE_ROW = re.compile(r"^\| `(\w+)` \| `(tidemq[\w.]*)` \|(.*)\|\s*$", re.M)
DOCUMENTED_TYPES = {name: (module, rest) for name, module, rest in TYPE_ROW.findall(DOCS)}

#: What must have a row: every Protocol of tidemq.__all__, the processor register and its handler type.
PUBLISHED = sorted(
    name
    for name in tidemq.__all__
    if getattr(getattr(tidemq, name, None), "_is_protocol", False)
    or name in {"ProcessorRegister", "RequestHandler"}
)


def test_there_are_published_types_to_document() -> None:
    assert {"BrokerContext", "ProcessorRegister", "StoreIntrospection", "MessageStore"} <= set(PUBLISHED)
    assert len(PUBLISHED) >= 40


@pytest.mark.parametrize("name", PUBLISHED)
def test_every_published_protocol_has_a_row(name: str) -> None:
    assert name in DOCUMENTED_TYPES, f"docs/plugin_hooks.md has no | `{name}` | `module` | ... | row"


@pytest.mark.parametrize("name", sorted(DOCUMENTED_TYPES))
def test_every_documented_type_exists_where_the_page_says(name: str) -> None:
    module, rest = DOCUMENTED_TYPES[name]
    assert name in tidemq.__all__, (
        f"docs/plugin_hooks.md documents {name}, which tidemq.__all__ does not publish"
    )
    assert getattr(importlib.import_module(module), name, None) is getattr(tidemq, name), (
        f"docs/plugin_hooks.md says {name} is in {module}; it is not"
    )
    cells = [cell.strip() for cell in rest.split(" | ")]
    assert len(cells) == 2 and all(cells), f"the row of {name} must say who implements it and who calls it"


def test_the_old_context_module_still_imports() -> None:
    """Code written against tidemq.broker.context keeps working (a re-export of tidemq.context)."""
    import tidemq.broker.context as old
    import tidemq.context as new

    assert (old.BrokerContext, old.ProcessorRegister, old.Handler) == (
        new.BrokerContext,
        new.ProcessorRegister,
        new.Handler,
    )
