"""mypy holds the kernel and the built-in plugins to their declared types (CI runs it through here).

The import names differ from the source folders (``core/`` is ``tidemq``, ``plugins/x`` is
``tidemq_x``) and mypy cannot follow setuptools' editable-install finder, so the check runs over a
tree of links with the import names.  Configuration: ``[tool.mypy]`` in pyproject.toml.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def test_mypy_finds_no_errors_in_core_and_plugins(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    packages = {"tidemq": ROOT / "core"}
    packages |= {
        f"tidemq_{p.name}": p for p in sorted((ROOT / "plugins").iterdir()) if (p / "__init__.py").is_file()
    }
    for name, source in packages.items():
        (tree / name).symlink_to(source, target_is_directory=True)
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    args += ["--cache-dir", str(tmp_path / "cache")]
    for name in packages:
        args += ["-p", name]
    proc = subprocess.run(args, cwd=tree, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
