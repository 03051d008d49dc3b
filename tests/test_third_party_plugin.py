"""A third-party plugin distribution, built and installed here, is picked up from config alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_SOURCE = '''
"""A third-party key index that appends every dispatched key to a text file."""

from pathlib import Path

import attrs
from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.index import QueryResult


@attrs.define
class Options:
    log_name: str = "audit.log"


class AuditIndex:
    def __init__(self, path):
        self.path = path
        self.entries = {}

    def load(self, last_exit_ok, checkpoint_timestamp_ms):
        pass

    def dispatch(self, request):
        keys = [k for k in request.keys.split(" ") if k]
        with open(self.path, "a") as fh:
            for key in keys:
                fh.write(f"{request.topic}#{key} {request.commit_log_offset}\\n")
                self.entries.setdefault((request.topic, key), []).append(request.commit_log_offset)

    def query(self, topic, key, max_num, begin_ts, end_ts):
        return QueryResult(tuple(reversed(self.entries.get((topic, key), [])))[:max_num])

    def flush(self):
        return 0

    def delete_expired(self, min_phy_offset):
        pass

    def shutdown(self):
        pass


def create(ctx):
    opts = parse_options(Options, ctx.options, "[index.audit]")
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    return AuditIndex(Path(ctx.data_dir) / opts.log_name)


@hookimpl
def tidemq_register_indexes(register):
    register.add("audit", create, "appends every key to a text file")
'''

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tidemq-audit-index"
version = "1.0"
dependencies = ["tidemq"]

[project.entry-points.tidemq]
audit = "tidemq_audit_index"

[tool.setuptools]
py-modules = ["tidemq_audit_index"]
"""

COMPOSE_AND_SEND = """
import sys
from tidemq.config import compose, load_config
from tidemq.message import MessageInner

components = compose(load_config(sys.argv[1]))
store, index = components["store"], components["index"]
store.load()
store.start()
result = store.put_message(MessageInner(topic="orders", body=b"x", properties={"KEYS": "k1 k2"})).result(10)
print(type(index).__module__, result.status.value, index.query("orders", "k2", 10, 0, 2**62).phy_offsets)
store.shutdown()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Build a wheel of the third-party plugin and install it into its own directory."""
    root = tmp_path_factory.mktemp("third_party")
    src = root / "src"
    src.mkdir()
    (src / "pyproject.toml").write_text(PYPROJECT)
    (src / "tidemq_audit_index.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", root / "dist", src],
        check=True,
    )
    wheels = list((root / "dist").glob("tidemq_audit_index-1.0-*.whl"))
    assert len(wheels) == 1
    target = root / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", target, wheels[0]], check=True)
    return target


def run_tidemq(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_installed_plugin_is_listed_with_its_distribution(site, tmp_path):
    out = run_tidemq(site, "-m", "tidemq", "plugins", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    index_section = out.stdout.split("index:")[1].split("filter:")[0]
    assert "audit" in index_section and "from tidemq-audit-index" in index_section
    # without the plugin installed, the same command does not list it
    plain = subprocess.run(
        [sys.executable, "-m", "tidemq", "plugins"], capture_output=True, text=True, cwd=tmp_path
    )
    assert "audit" not in plain.stdout


def test_broker_composes_the_third_party_index_from_config(site, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\ndata_dir = "{tmp_path / "data"}"\n\n[plugins]\nstore = "memory"\nindex = "audit"\n\n'
        '[index.audit]\nlog_name = "keys.txt"\n'
    )
    check = run_tidemq(site, "-m", "tidemq", "check-config", str(cfg), cwd=tmp_path)
    assert check.returncode == 0, check.stderr
    assert "index = audit" in check.stdout

    script = tmp_path / "send.py"
    script.write_text(COMPOSE_AND_SEND)
    out = run_tidemq(site, str(script), str(cfg), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    module, status, offsets = out.stdout.split(" ", 2)
    assert module == "tidemq_audit_index" and status == "PUT_OK" and offsets.strip() != "()"
    lines = (tmp_path / "data" / "keys.txt").read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["orders#k1", "orders#k2"]


def test_typo_in_the_third_party_options_is_one_line(site, tmp_path):
    cfg = tmp_path / "broker.toml"
    cfg.write_text(
        f'[broker]\ndata_dir = "{tmp_path}"\n[plugins]\nstore = "memory"\nindex = "audit"\n[index.audit]\nlog_nme = "x"\n'
    )
    out = run_tidemq(site, "-c", f"from tidemq.config import *; compose(load_config(r'{cfg}'))", cwd=tmp_path)
    assert out.returncode != 0
    assert "[index.audit]: unknown key 'log_nme' (did you mean 'log_name'?)" in out.stderr
