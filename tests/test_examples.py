"""The examples the README walks a new user through, run as the README runs them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
SPARK_EXAMPLE = ROOT / "examples" / "spark_order_counts.py"


def run_example(
    script: Path, *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment minus Java: an empty PATH and no JAVA_HOME; temp files under tmp_path/tmp."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PATH=str(tmp_path / "bin"), TMPDIR=str(tmp_path / "tmp"), **extra)
    return env


def pyspark_installed() -> bool:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def test_spark_example_without_java_stops_before_any_work(tmp_path: Path) -> None:
    out = run_example(SPARK_EXAMPLE, env=bare_env(tmp_path))
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    if pyspark_installed():
        assert "Spark needs Java 17 or later and found no java (no JAVA_HOME, and PATH)" in lines[0]
        assert "openjdk-17" in lines[0]
    else:
        assert "pyspark is not installed" in lines[0] or "pyarrow is not installed" in lines[0]
    # No cluster was started, no order sent: nothing left in the temp directory.
    assert list((tmp_path / "tmp").iterdir()) == []


def test_spark_example_names_a_wrong_java_home(tmp_path: Path) -> None:
    if not pyspark_installed():
        pytest.skip("pyspark is not installed: the example stops at that first")
    home = tmp_path / "no-such-jdk"
    out = run_example(SPARK_EXAMPLE, env=bare_env(tmp_path, JAVA_HOME=str(home)))
    assert out.returncode == 1 and f"found no java (JAVA_HOME={home})" in out.stderr


def test_spark_example_without_pyspark_says_which_extra(tmp_path: Path) -> None:
    # A pyspark that cannot be imported, first on the path: what a venv without the extra sees.
    stub = tmp_path / "stub" / "pyspark"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError(\"No module named 'pyspark'\")\n")
    env = bare_env(tmp_path, PYTHONPATH=str(tmp_path / "stub"))
    out = run_example(SPARK_EXAMPLE, env=env)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "spark_order_counts.py: pyspark is not installed: pip install -e '.[spark]' (a checkout) "
        "or pip install 'tidemq[spark]'"
    )
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.compat
def test_official_client_example_round_trip(spawn, tmp_path: Path) -> None:
    pytest.importorskip("rocketmq.client")
    server = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        f"127.0.0.1:{free_port()}",
        "--broker-listen",
        f"127.0.0.1:{free_port()}",
    )
    out = run_example(
        ROOT / "examples" / "official_client.py",
        "--namesrv",
        server.addresses["namesrv"],
        env=dict(os.environ),
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "round trip OK" in out.stdout


def test_readme_names_only_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"(?<![\w/.])((?:examples|docs)/[\w./-]+\.(?:py|md|toml))", readme))
    assert {"examples/official_client.py", "docs/configuration.md", "docs/operations.md"} <= paths
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_spark_exactly_once_example_survives_its_driver_kill(tmp_path: Path) -> None:
    """The exactly-once pipeline: a windowed aggregation, its driver killed mid-way and restarted."""
    from tidemq_spark.environment import spark_problem

    problem = spark_problem()
    if problem is not None:
        pytest.skip(problem)
    script = ROOT / "examples" / "spark_exactly_once_orders.py"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    out = run_example(script, "--orders", "1500", env=env, timeout=840)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "killed the driver after" in out.stdout
    assert "exactly once: every (window, region) total present once" in out.stdout


def test_request_reply_traced_example_answers_and_prints_the_trace(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    out = run_example(ROOT / "examples" / "request_reply_traced.py", env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["apple: 120 cents", "pear: 95 cents", "plum: 240 cents"]
    # The request's trace as queryMsgTraceById prints it: the requester's send, the service's consume.
    pub = next(line.split() for line in lines if line.startswith("Pub "))
    sub = next(line.split() for line in lines if line.startswith("Sub "))
    assert pub[1] == "shop" and pub[-2] == "success"
    assert sub[1] == "quote-service" and sub[-1] == "success"
