"""The official RocketMQ 5 Python client's own virtual environment, made once per machine.

``rocketmq-python-client`` installs a top-level ``rocketmq`` package, as ``rocketmq==0.4.4`` does,
so the two cannot share one environment.  The v5 one lives under ``~/.cache/tidemq`` keyed on the
version (``TIDEMQ_V5_VENV`` overrides the place) and is reused once made; tests and
bench/grpc_bench.py share it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

V5_VERSION = "5.1.2"


class Unavailable(Exception):
    """The environment cannot be made here (no PyPI, no venv module): the reason."""


def v5_python() -> Path:
    """The v5 environment's python, making the environment on first use."""
    default = Path.home() / ".cache" / "tidemq" / f"venv-rocketmq5-{V5_VERSION}"
    venv = Path(os.environ.get("TIDEMQ_V5_VENV", default))
    python = venv / "bin" / "python"
    marker = venv / ".tidemq-ready"
    if marker.is_file() and python.is_file():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        raise Unavailable(f"cannot make the v5 client's venv: {made.stderr[-500:]}")
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", f"rocketmq-python-client=={V5_VERSION}"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if pip.returncode != 0:
        raise Unavailable(f"cannot install rocketmq-python-client=={V5_VERSION}: {pip.stderr[-500:]}")
    marker.write_text(V5_VERSION)
    return python
