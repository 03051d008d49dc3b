"""docs/configuration.md is generated from the option classes and must match them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs

from tidemq.config_notes import NO_OPTIONS, NOTES
from tidemq.config_reference import TABLES, options, render
from tidemq.plugins import ROLES, get_plugin_manager

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
REGENERATE = "python -m tidemq.config_reference --write docs/configuration.md"


def test_docs_match_the_option_classes() -> None:
    assert DOC.read_text() == render(), f"docs/configuration.md is out of date: run `{REGENERATE}`"


def test_every_installed_plugin_is_documented_or_declared_option_less() -> None:
    documented = {tuple(t.table.split(".", 1)) for t in TABLES if "." in t.table}  # not [broker]/[namesrv]
    catalogue = get_plugin_manager().catalogue()
    own = {(role, info.name) for role in ROLES for info in catalogue[role] if info.distribution == "tidemq"}
    missing = own - documented - set(NO_OPTIONS)
    assert not missing, f"add these plugins' option classes to TABLES (or to NO_OPTIONS): {sorted(missing)}"
    assert not (documented | set(NO_OPTIONS)) - own, "a documented plugin is no longer installed"


def test_every_option_says_what_it_does_and_notes_name_real_options() -> None:
    keys = set()
    for table in TABLES:
        for option in options(table):
            keys.add(f"{table.table}.{option.name}")
            assert option.doc, f"[{table.table}] {option.name}: no description (a #: comment, or NOTES)"
        assert len(options(table)) == len(attrs.fields(table.cls))  # type: ignore[arg-type]
    assert not set(NOTES) - keys, f"NOTES for options that no longer exist: {sorted(set(NOTES) - keys)}"


def test_broker_keys_and_environment_are_in_the_reference() -> None:
    text = render()
    for needle in (
        "| `advertise` |",
        "| `data_dir` |",
        "`TIDEMQ_HOME`",
        "brokerClusterName",
        "UPDATE_NAMESRV_CONFIG",
    ):
        assert needle in text


def test_the_script_checks_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(render().replace("| `listen` |", "| `listen_port` |", 1))
    script = [sys.executable, "-m", "tidemq.config_reference"]
    out = subprocess.run([*script, "--check", str(stale)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "out of date" in out.stderr
    subprocess.run([*script, "--write", str(stale)], check=True, timeout=60)
    assert subprocess.run([*script, "--check", str(stale)], timeout=60).returncode == 0
