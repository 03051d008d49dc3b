"""The hook documentation cannot drift from the hookspecs (datasette's test_plugin_hooks_are_documented)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

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
