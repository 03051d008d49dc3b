"""Can Spark run here?  One line naming what is missing, found before any work starts.

PySpark fails late and obscurely without its parts: a missing ``pyspark`` is a
``ModuleNotFoundError`` after whatever ran first, a missing Java a "Java gateway process exited"
error when the session starts.  :func:`spark_problem` checks both the way PySpark looks for them
(``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``) without starting a JVM.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess

__all__ = ["JAVA_MIN", "find_java", "java_major", "spark_problem"]

#: Spark 4 runs on Java 17 or later.
JAVA_MIN = 17
_INSTALL_JAVA = "install a JRE 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless) or set JAVA_HOME"


def find_java() -> tuple[str | None, str]:
    """The java PySpark would start, and where it was looked for (for the error)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        path = os.path.join(home, "bin", "java")
        return (path if os.access(path, os.X_OK) else None), f"JAVA_HOME={home}"
    return shutil.which("java"), "no JAVA_HOME, and PATH"


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (8 for "1.8.0_392"), None when it cannot say."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def spark_problem() -> str | None:
    """Why Spark cannot run here, in one line with the fix; None when pyspark, pyarrow and Java 17+ are there."""
    for module in ("pyspark", "pyarrow"):
        try:
            importlib.import_module(module)
        except ImportError:
            return f"{module} is not installed: pip install -e '.[spark]' (a checkout) or pip install 'tidemq[spark]'"
    java, looked = find_java()
    if java is None:
        return f"Spark needs Java {JAVA_MIN} or later and found no java ({looked}): {_INSTALL_JAVA}"
    major = java_major(java)
    if major is None:
        return f"Spark needs Java {JAVA_MIN} or later and `{java} -version` did not say its version: {_INSTALL_JAVA}"
    if major < JAVA_MIN:
        return f"Spark needs Java {JAVA_MIN} or later; {java} is Java {major}: {_INSTALL_JAVA}"
    return None
