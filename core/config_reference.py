"""The configuration reference: every option of ``[broker]``, ``[namesrv]`` and the built-in plugins.

``docs/configuration.md`` is generated from the option classes (their attrs fields, types,
defaults, ranges, choices and ``#:`` comments) plus the few facts a class cannot say (RocketMQ's
name for an option, a description where the class has no comment).  Regenerate it with::

    python -m tidemq.config_reference --write docs/configuration.md

``tests/test_config_reference.py`` fails when the file and the code differ.  ``tidemq check-config
--show`` uses :func:`options_class` to print every option a broker would run with.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import sys
import textwrap
import tokenize
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import click

from tidemq.config import Config, parse_options
from tidemq.config_notes import ENVIRONMENT, NO_OPTIONS, NOTES, PREAMBLE, TABLE_NOTES
from tidemq.plugins import get_plugin_manager

__all__ = ["TABLES", "Option", "OptionTable", "options", "options_class", "render", "show"]


@attrs.frozen
class OptionTable:
    """One TOML table and the attrs class that parses it."""

    table: str  # "broker", "store.mmap"
    cls_path: str  # "module:Class"

    @property
    def cls(self) -> type:
        module, _, name = self.cls_path.partition(":")
        return typing.cast(type, getattr(importlib.import_module(module), name))


@attrs.frozen
class Option:
    """One documented key."""

    table: str
    name: str
    type: str
    default: Any
    valid: str
    rocketmq: str
    runtime: str
    doc: str


#: Every table with options, in the order of the reference.  A built-in plugin with options must
#: be here; one without is in ``NO_OPTIONS`` (the test checks that every installed one is in one).
TABLES: tuple[OptionTable, ...] = (
    OptionTable("broker", "tidemq.config:BrokerSettings"),
    OptionTable("namesrv", "tidemq.config:NamesrvSettings"),
    OptionTable("transport.tcp", "tidemq_transport_tcp.options:TcpOptions"),
    OptionTable("transport.grpc", "tidemq_transport_grpc.options:GrpcOptions"),
    OptionTable("store.mmap", "tidemq_store_mmap.options:MmapStoreOptions"),
    OptionTable("store.memory", "tidemq_store_memory:MemoryStoreOptions"),
    OptionTable("flush.sync", "tidemq_flush.group_commit:SyncFlushOptions"),
    OptionTable("flush.async", "tidemq_flush.periodic:AsyncFlushOptions"),
    OptionTable("index.hash", "tidemq_index_hash.service:HashIndexOptions"),
    OptionTable("filter.SQL92", "tidemq_filter_server.plugin:Sql92Options"),
    OptionTable("replication.master_slave", "tidemq_ha_replication.master_slave:MasterSlaveOptions"),
    OptionTable("replication.controller", "tidemq_controller.options:ControllerOptions"),
    OptionTable("acl.plain", "tidemq_acl.validator:PlainAclOptions"),
    OptionTable("metrics.prometheus", "tidemq_metrics_prometheus.options:PrometheusOptions"),
    OptionTable("select.latency_fault", "tidemq_queue_select:LatencyFaultOptions"),
    OptionTable("allocate.consistent_hash", "tidemq_allocate:ConsistentHashOptions"),
    OptionTable("allocate.config", "tidemq_allocate:ByConfigOptions"),
    OptionTable("allocate.machine_room", "tidemq_allocate:MachineRoomOptions"),
)


def options_class(table: str) -> type | None:
    """The attrs class of ``table`` ("store.mmap"), None when it is not a built-in table with options."""
    for t in TABLES:
        if t.table == table:
            return t.cls
    return None


# ---------------------------------------------------------------------------- reading the classes
def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> the ``#:``/``#`` comment lines above it and the comment at its end."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#:").strip()
    lines = source.splitlines()
    body = typing.cast(ast.ClassDef, ast.parse(source).body[0]).body
    found: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments.get(line, ""))
            line -= 1
        end = node.end_lineno or node.lineno
        after = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
        found[node.target.id] = " ".join(p for p in [*above, *after] if p)
    return found


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is None and isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _default(field: attrs.Attribute) -> Any:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs.Factory is a class at run time
        return default.factory()
    return default


def _valid(field: attrs.Attribute) -> str:
    choices = field.metadata.get("choices")
    if choices:
        return ", ".join(f"`{c}`" for c in choices)
    return str(field.metadata.get("range", ""))


def options(table: OptionTable) -> list[Option]:
    """The documented options of one table, in the class's field order."""
    from tidemq.namesrv.server import _RUNTIME_KEYS  # what UPDATE_NAMESRV_CONFIG may change

    cls = table.cls
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    result = []
    for field in attrs.fields(cls):
        note = NOTES.get(f"{table.table}.{field.name}", {})
        result.append(
            Option(
                table=table.table,
                name=field.name,
                type=_type_name(hints.get(field.name, Any)),
                default=_default(field),
                valid=note.get("valid", "") or _valid(field),
                rocketmq=note.get("rocketmq", ""),
                runtime="UPDATE_NAMESRV_CONFIG"
                if table.table == "namesrv" and field.name in _RUNTIME_KEYS
                else note.get("runtime", "restart"),
                doc=(note.get("doc", "") or comments.get(field.name, "")).replace("``", "`"),
            )
        )
    return result


# ---------------------------------------------------------------------------- rendering
def toml_value(value: Any) -> str:
    """``value`` as TOML (strings, booleans, numbers and lists of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole of ``docs/configuration.md``."""
    out = [PREAMBLE.strip(), ""]
    out.append("## Tables\n")
    for t in TABLES:
        out.append(f"* [`[{t.table}]`](#{t.table.replace('.', '').lower()})")
    out.append("")
    for t in TABLES:
        out.append(f"## [{t.table}]\n")
        note = TABLE_NOTES.get(t.table, "")
        out.append(f"Class: `{t.cls_path}`." + (f" {note}" if note else "") + "\n")
        out.append("| key | type | default | valid | RocketMQ | at run time | what |")
        out.append("| --- | --- | --- | --- | --- | --- | --- |")
        for o in options(t):
            out.append(
                f"| `{o.name}` | {_cell(o.type)} | `{_cell(toml_value(o.default))}` | {_cell(o.valid)} "
                f"| {_cell(o.rocketmq) or '—'} | {o.runtime} | {_cell(o.doc)} |"
            )
        out.append("")
    out.append("## Plugins without options\n")
    out.append(
        "A table for these is refused with one line (`[replication.none] takes no options`):"
        + " "
        + ", ".join(f'`{role} = "{name}"`' for role, name in NO_OPTIONS)
        + ".\n"
    )
    out.append("## Environment variables\n")
    out.append("| variable | what |")
    out.append("| --- | --- |")
    for name, text in ENVIRONMENT:
        out.append(f"| `{name}` | {_cell(text)} |")
    return "\n".join(out).rstrip() + "\n"


def _table_lines(
    name: str, values: Mapping[str, Any], given: Mapping[str, Any], notes: Mapping[str, str] | None = None
) -> list[str]:
    lines = [f"[{name}]"]
    for key, value in values.items():
        marks = ["set in the file"] if key in given else []
        if notes and key in notes:
            marks.append(notes[key])
        lines.append(f"{key} = {toml_value(value)}" + (f"  # {'; '.join(marks)}" if marks else ""))
    return [*lines, ""]


def show(cfg: Config, given: Mapping[str, Any]) -> str:
    """The effective configuration of ``cfg`` as TOML: every key of every table the broker uses.

    ``given`` is the parsed file (keys it sets are marked); plugin tables are parsed with their
    classes, so defaults are filled in.  A third-party plugin's table is shown as written.
    """
    out = [f"# effective configuration of {cfg.source}", ""]
    derived = {"data_dir": f"resolves to {cfg.broker.store_path}"}
    if not cfg.broker.advertise:
        derived["advertise"] = "registers the listen address (a wildcard: this machine's address)"
    out += _table_lines("broker", attrs.asdict(cfg.broker), given.get("broker", {}), derived)
    out += _table_lines("namesrv", attrs.asdict(cfg.namesrv), given.get("namesrv", {}))
    out += _table_lines("plugins", cfg.plugins, given.get("plugins", {}))
    selected = [
        (role, name)
        for role, name in cfg.plugins.items()
        if not (role in ("acl", "metrics") and name == "none")
    ]
    selected += [("filter", name) for name in get_plugin_manager().available("filter")]
    for role, name in selected:
        table = f"{role}.{name}"
        written = cfg.options.get(role, {}).get(name, {})
        cls = options_class(table)
        if cls is not None:
            values = attrs.asdict(parse_options(cls, written, f"[{table}]"))
            out += _table_lines(table, values, written)
        elif (role, name) in NO_OPTIONS:
            out += [f"# [{table}]: no options", ""]
        else:
            out += [
                f"# [{table}]: a third-party plugin; its options as written",
                *_table_lines(table, written, written),
            ]
    return "\n".join(out).rstrip() + "\n"


DOC_PATH = Path("docs") / "configuration.md"


@click.command()
@click.option("--write", "write_to", type=click.Path(dir_okay=False), help="Write the reference here.")
@click.option("--check", "check_path", type=click.Path(dir_okay=False), help="Exit 1 if this file differs.")
def main(write_to: str | None, check_path: str | None) -> None:
    """Print (or write, or check) the configuration reference."""
    text = render()
    if check_path:
        if Path(check_path).read_text() != text:
            click.echo(
                f"{check_path} is out of date: python -m tidemq.config_reference --write {check_path}",
                err=True,
            )
            sys.exit(1)
        return
    if write_to:
        Path(write_to).write_text(text)
        return
    click.echo(text, nl=False)


if __name__ == "__main__":
    main()
