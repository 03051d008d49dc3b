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

#: bench/ scripts held to the same check (with the bench modules they import): those that pass.
TYPED_BENCH = ("compare.py", "sync_latency_trace.py")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """The links with the import names, and the packages they name (one mypy cache for both runs)."""
    root = tmp_path_factory.mktemp("typecheck")
    tree = root / "src"
    tree.mkdir()
    packages = {"tidemq": ROOT / "core"}
    packages |= {
        f"tidemq_{p.name}": p for p in sorted((ROOT / "plugins").iterdir()) if (p / "__init__.py").is_file()
    }
    for name, source in packages.items():
        (tree / name).symlink_to(source, target_is_directory=True)
    return tree, packages


def _mypy(tree: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    args += ["--cache-dir", str(tree.parent / "cache"), *targets]
    return subprocess.run(args, cwd=tree, capture_output=True, text=True, timeout=280)


def test_mypy_finds_no_errors_in_core_and_plugins(tree: tuple[Path, dict[str, Path]]) -> None:
    links, packages = tree
    proc = _mypy(links, *(arg for name in packages for arg in ("-p", name)))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_mypy_finds_no_errors_in_the_typed_bench_scripts(tree: tuple[Path, dict[str, Path]]) -> None:
    """Files, not packages (mypy takes one kind per run); ``tidemq`` resolves through the links
    (the working directory is on mypy's search path)."""
    links, _packages = tree
    proc = _mypy(links, *(str(ROOT / "bench" / name) for name in TYPED_BENCH))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
