"""A real Spark standalone cluster and a two-broker tidemq cluster, each node its own process.

Used by ``tests/test_spark_cluster.py`` and ``examples/spark_cluster.py``:

* :class:`SparkStandalone` starts a master and N workers with the ``bin/spark-class`` launcher
  pyspark ships (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), on free
  loopback ports, every log and work directory under one root, and waits until the master's
  JSON status lists every worker ALIVE (or leaves that to :meth:`SparkStandalone.wait_workers`).
* :class:`TidemqCluster` starts ``tidemq namesrv`` and one ``tidemq broker`` per broker name.

Every process is started in a session (process group) of its own, so :meth:`stop` also ends what
it spawned (a worker's executor JVMs and their Python workers) and ``leftovers()`` can check
that nothing of it is still running.  A process that does not come up fails with
:class:`ClusterStartError` naming it, with the tail of its log.  No pytest import: the example
uses this module too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

#: Slow shared CI machines: a JVM daemon can take half a minute to come up there.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


class ClusterStartError(RuntimeError):
    """A cluster process did not come up (or died); the message names it and ends with its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (``bin/``, ``jars/``)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@attrs.define
class Proc:
    """One started process: its name (for errors), the Popen and the file its output goes to."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    def failure(self, what: str, waited: float | None = None) -> ClusterStartError:
        """``<name> did not <what> (exited with 1 | still running after 120 s); log <path>: <tail>``."""
        if self.alive():
            state = "still running" + (f" after {waited:.0f} s" if waited is not None else "")
        else:
            state = f"exited with {self.popen.returncode}"
        return ClusterStartError(f"{self.name} did not {what} ({state}); log {self.log}:\n{self.tail()}")


def launch(name: str, argv: Sequence[str], log: Path, env: dict[str, str], cwd: Path) -> Proc:
    """Start ``argv`` in a new session, stdout and stderr to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:  # the child keeps its own descriptor
        popen = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True,
        )  # fmt: skip
    return Proc(name, popen, log)


def wait_until(proc: Proc, what: str, check: Callable[[], Any], timeout: float) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``proc`` if it dies or time runs out.

    Errors while polling count as "not yet" (a port not open yet).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception:
            pass
        if not proc.alive():
            raise proc.failure(what)
        if time.monotonic() > deadline:
            raise proc.failure(what, timeout)
        time.sleep(0.25)


def group_members(pgids: set[int]) -> list[int]:
    """Live processes (not zombies) whose process group is one of ``pgids``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")".
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            found.append(int(entry.name))
    return sorted(found)


def stop_all(procs: Sequence[Proc], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM each process's whole group, wait, then SIGKILL what is left."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # The group leader may be gone while its children (executors, Python workers) linger.
    while group_members({p.pid for p in procs}) and time.monotonic() < deadline:
        time.sleep(0.2)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        proc.popen.wait()


def _signal_group(proc: Proc, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the leader's pid
    except ProcessLookupError:
        pass


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


class SparkStandalone:
    """A Spark standalone master and ``workers`` workers (``cores`` cores each) under ``root``."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port = free_port()
        self.webui_port = free_port()
        self.procs: list[Proc] = []
        home = spark_home()
        self.spark_class = str(home / "bin" / "spark-class")
        self.env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(root / "logs"),
            "SPARK_WORKER_DIR": str(root / "work"),
            "SPARK_DAEMON_MEMORY": "256m",  # master and worker JVMs; executors get their own
            # Executors start their Python workers with this interpreter (tidemq, pyarrow installed).
            "PYSPARK_PYTHON": sys.executable,
        }

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def worker_dir(self, i: int) -> Path:
        """Worker ``i``'s work directory: its executors run in ``<dir>/<app id>/<executor id>``."""
        return self.root / f"worker-{i}"

    def status(self) -> dict[str, Any]:
        """The master's JSON status (workers, applications)."""
        return dict(http_json(self.status_url))

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.status()["workers"] if w["state"] == "ALIVE"]

    def start(self, timeout: float = START_TIMEOUT_S, wait: bool = True) -> SparkStandalone:
        """Start the master, then the workers; with ``wait``, return once every worker registered.

        Without ``wait`` the workers' JVMs boot while the caller does something else (a driver
        JVM starting); :meth:`wait_workers` then checks on them.
        """
        try:
            master = self._launch(
                "spark master",
                "org.apache.spark.deploy.master.Master",
                ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.webui_port)],
            )
            wait_until(
                master, f"serve {self.status_url}", lambda: self.status()["status"] == "ALIVE", timeout
            )
            for i in range(1, self.workers + 1):
                self.worker_dir(i).mkdir(parents=True, exist_ok=True)
                args = [self.master_url, "--cores", str(self.cores), "--memory", self.memory]
                args += ["--host", "127.0.0.1", "--webui-port", str(free_port())]
                args += ["--work-dir", str(self.worker_dir(i))]
                self._launch(f"spark worker-{i}", "org.apache.spark.deploy.worker.Worker", args)
            if wait:
                self.wait_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_workers(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until the master lists every worker ALIVE; fail naming a worker that died, or all with
        their log tails when time runs out."""
        workers = self.procs[1:]
        deadline = time.monotonic() + timeout
        while len(self.alive_workers()) < self.workers:
            for proc in workers:
                if not proc.alive():
                    raise proc.failure(f"register with {self.master_url}")
            if time.monotonic() > deadline:
                names = [w["webuiaddress"] for w in self.alive_workers()]
                raise ClusterStartError(
                    f"only {len(names)} of {self.workers} Spark workers registered with "
                    f"{self.master_url} within {timeout:.0f} s ({names}); worker logs:\n"
                    + "\n".join(f"--- {p.name}:\n{p.tail(1500)}" for p in workers)
                )
            time.sleep(0.25)

    def _launch(self, name: str, main_class: str, args: list[str]) -> Proc:
        log = self.root / "logs" / f"{name.split()[-1]}.log"
        proc = launch(name, [self.spark_class, main_class, *args], log, self.env, self.root)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Workers (with their executors) first, then the master."""
        stop_all(self.procs[1:])
        stop_all(self.procs[:1])

    def leftovers(self) -> list[int]:
        """Processes of this cluster still running after :meth:`stop` (should be none)."""
        return group_members({p.pid for p in self.procs})

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TidemqCluster:
    """``tidemq namesrv`` plus one ``tidemq broker`` per name, as subprocesses under ``root``."""

    def __init__(self, root: Path, brokers: Sequence[str] = ("broker-a", "broker-b")) -> None:
        self.root = root
        self.broker_names = list(brokers)
        self.procs: list[Proc] = []
        self.namesrv = ""
        self.brokers: dict[str, str] = {}  # broker name -> address
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def _tidemq(self, name: str, *args: str, timeout: float) -> str:
        """Start ``python -m tidemq ARGS``; the address from its ``tidemq X listening on ADDR`` line."""
        log = self.root / "logs" / f"{name}.log"
        argv = [sys.executable, "-m", "tidemq", "--log-level", "INFO", *args]
        proc = launch(name, argv, log, self.env, self.root)
        self.procs.append(proc)

        def address() -> str | None:
            for line in proc.log.read_text(errors="replace").splitlines():
                if line.startswith("tidemq ") and " listening on " in line:
                    return line.rsplit(" ", 1)[1].strip()
            return None

        return str(wait_until(proc, "print its 'listening on' line", address, timeout))

    def start(self, timeout: float = START_TIMEOUT_S) -> TidemqCluster:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.namesrv = self._tidemq("namesrv", "namesrv", "--listen", "127.0.0.1:0", timeout=timeout)
            for name in self.broker_names:
                config = self.root / f"{name}.toml"
                config.write_text(
                    f'[broker]\nname = "{name}"\nlisten = "127.0.0.1:0"\nnamesrv = ["{self.namesrv}"]\n'
                    f'data_dir = "{self.root / name}"\nregister_interval_s = 2.0\n\n'
                    "[store.mmap]\ncommitlog_file_size = 16777216\n"
                )
                self.brokers[name] = self._tidemq(name, "broker", "-c", str(config), timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def admin(self, *args: str, timeout: float = 60.0) -> str:
        """``tidemq admin ARGS -n NAMESRV``; its stdout, or an error with its stderr."""
        argv = [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv]
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=self.root, env=self.env
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"tidemq admin {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}"
            )
        return out.stdout

    def create_topic(self, topic: str, queues: int, timeout: float = 60.0) -> None:
        """``topic`` with ``queues`` queues on every broker; returns once the route shows all of them."""
        for addr in self.brokers.values():
            self.admin("updateTopic", "-t", topic, "-b", addr, "-r", str(queues), "-w", str(queues))
        deadline = time.monotonic() + timeout
        while True:
            try:
                route = json.loads(self.admin("topicRoute", "-t", topic))
                have = {q["brokerName"]: q["readQueueNums"] for q in route["queueDatas"]}
                if have == dict.fromkeys(self.brokers, queues):
                    return
            except RuntimeError:
                have = {}
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"topic {topic!r}: the NameServer route lists {have}, not {queues} queues on each of "
                    f"{sorted(self.brokers)} after {timeout:.0f} s"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        """Brokers first (a clean stop: no abort file), then the NameServer."""
        stop_all(self.procs[1:])
        stop_all(self.procs[:1])

    def leftovers(self) -> list[int]:
        return group_members({p.pid for p in self.procs})

    def __enter__(self) -> TidemqCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def where_am_i() -> Callable[[Any], tuple[int, str, str, int]]:
    """A Python UDF body: (partition, worker, executor, pid) of the task that evaluates it.

    An executor runs in ``<worker work dir>/<app id>/<executor id>`` and its Python workers inherit
    that directory, so the directory names the worker and the executor.  Use it as
    ``F.udf(where_am_i(), WHERE_AM_I).asNondeterministic()`` (a plain UDF: ``mapInArrow`` needs
    pandas).  Built inside a function so cloudpickle ships it by value (executors cannot import
    this module).
    """

    def where(_: Any) -> tuple[int, str, str, int]:
        import os
        from pathlib import Path

        from pyspark import TaskContext

        ctx = TaskContext.get()
        cwd = Path(os.getcwd())
        return (ctx.partitionId() if ctx is not None else -1, cwd.parent.parent.name, cwd.name, os.getpid())

    return where


#: :func:`where_am_i`'s return type, as DDL.
WHERE_AM_I = "struct<partition: int, worker: string, executor: string, pid: long>"
