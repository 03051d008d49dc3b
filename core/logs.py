"""Where log records go (stderr, a rotated file; text or JSON lines) and progress of long tasks.

Library code only logs through stdlib loggers; :func:`configure` is for the command line, which
installs its handlers on the root logger (and replaces them when a sub-command's flags change
them).  :class:`Progress` reports how far a long walk got (store recovery, ``tidemq store
verify``) at a steady pace, never per record: as log lines, or as a terminal progress bar.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import attrs
import orjson

__all__ = [
    "AUTO",
    "FORMATS",
    "JsonFormatter",
    "LogSettings",
    "Progress",
    "ProgressFactory",
    "RichBars",
    "configure",
    "human_bytes",
    "log_progress",
    "parse_size",
    "progress_interval",
    "use_default_file",
]

#: ``--log-file`` value meaning "the command's default location" (see :func:`use_default_file`).
AUTO = "auto"
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5
#: Seconds between two progress lines (``TIDEMQ_PROGRESS_EVERY`` overrides it).
PROGRESS_EVERY_S = 2.0


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, exception text."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=str).decode()


def parse_size(text: str | int) -> int:
    """``"64MiB"``, ``"10m"``, ``"4096"`` -> bytes (``KB``/``KiB``... are all powers of 1024)."""
    if isinstance(text, int):
        return text
    s = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    for suffix, factor in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)):
        if s.endswith(suffix):
            s, scale = s[:-1], factor
            break
    try:
        value = float(s) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a size (examples: 1048576, 64MiB, 1G)") from None
    if value < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value)


@attrs.define
class LogSettings:
    """What the ``--log-*`` flags (or ``TIDEMQ_LOG_*``) chose."""

    level: str = "INFO"
    #: A path, :data:`AUTO` (the command's default location) or ``None`` (stderr only).
    file: str | None = None
    format: str = "text"
    max_bytes: int = DEFAULT_MAX_BYTES  # 0: never rotate
    backups: int = DEFAULT_BACKUPS


class _Stderr(logging.StreamHandler[Any]):
    """Writes to whatever ``sys.stderr`` is now, so a progress bar that redirects it keeps its place."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


_ours: list[logging.Handler] = []
_settings = LogSettings()
#: The file :func:`configure` opened, once :data:`AUTO` has been resolved.
current_file: Path | None = None


def _level(name: str) -> int:
    value = logging.getLevelName(name.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level {name!r} (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    return value


#: Libraries that log every request at INFO (the controller's etcd keepalive, once a second):
#: they log at WARNING and above unless the level asked for is DEBUG.
CHATTY_LOGGERS = ("httpx", "httpcore")


def configure(settings: LogSettings, default_file: Path | None = None) -> Path | None:
    """Install the handlers ``settings`` ask for on the root logger, replacing ours from before.

    Without a file, records go to stderr.  With one, every record goes to the file (rotated at
    ``max_bytes``, keeping ``backups`` old files) and stderr keeps WARNING and above, so a
    failure to start still shows where it was started.  :data:`AUTO` waits for
    :func:`use_default_file` (stderr only until then).  Returns the log file in use.
    """
    global _settings, current_file
    level = _level(settings.level)
    if settings.format not in FORMATS:
        raise ValueError(f"unknown log format {settings.format!r} (text or json)")
    formatter: logging.Formatter = (
        JsonFormatter() if settings.format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    path: Path | None = None
    if settings.file == AUTO:
        path = default_file
    elif settings.file:
        path = Path(settings.file).expanduser()
    handlers: list[logging.Handler] = []
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=settings.max_bytes, backupCount=settings.backups, encoding="utf-8"
        )
        file_handler.setFormatter(formatter)
        handlers.append(file_handler)
    stderr = _Stderr()
    stderr.setFormatter(formatter)
    if path is not None:
        stderr.setLevel(max(level, logging.WARNING))
    handlers.append(stderr)
    root = logging.getLogger()
    for old in _ours:
        root.removeHandler(old)
        old.close()
    _ours[:] = handlers
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    _settings = settings
    current_file = path
    return path


def use_default_file(path: Path) -> Path | None:
    """A command that knows its default log location (``<data_dir>/logs/broker.log``) tells it here.

    Only takes effect when ``--log-file`` asked for the default (:data:`AUTO`); returns the file
    in use.
    """
    if _settings.file != AUTO:
        return current_file
    return configure(_settings, path)


def settings() -> LogSettings:
    """The settings last applied."""
    return _settings


# ---------------------------------------------------------------------------- progress


def human_bytes(n: float) -> str:
    """``1.8 GiB``, ``512.0 KiB``, ``17 B``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _amount(n: float, unit: str) -> str:
    return human_bytes(n) if unit == "bytes" else f"{int(n)} {unit}"


def progress_interval() -> float:
    """Seconds between progress lines: ``TIDEMQ_PROGRESS_EVERY`` or :data:`PROGRESS_EVERY_S`."""
    try:
        return max(0.0, float(os.environ.get("TIDEMQ_PROGRESS_EVERY", PROGRESS_EVERY_S)))
    except ValueError:
        return PROGRESS_EVERY_S


class Bar(Protocol):
    """Where a :class:`Progress` draws itself besides the log (a rich task)."""

    def show(self, done: int, total: int, line: str) -> None: ...

    def close(self, done: int, total: int) -> None: ...


class Progress:
    """Work done against a total (an estimate is fine), reported every ``every`` seconds.

    :meth:`update` is cheap (one clock read) but still meant to be called every few thousand
    records, not per record.  Without a bar each report is an INFO line on ``logger``:
    ``"<what>: 512.0 MiB of 1.8 GiB (28%), 310.2 MiB/s, about 4 s left"``.
    """

    def __init__(
        self,
        what: str,
        total: int = 0,
        *,
        unit: str = "bytes",
        logger: logging.Logger | None = None,
        every: float | None = None,
        bar: Bar | None = None,
    ) -> None:
        self.what = what
        self.total = total
        self.unit = unit
        self.done = 0
        #: Counters the caller keeps for its summary (records, files).
        self.items = 0
        self.files = 0
        self.prefix = ""  # before ``what`` in log lines
        #: More for the log line, asked only when a line is written ("1234 records").
        self.detail: Callable[[], str] | None = None
        self.logger = logger or logging.getLogger("tidemq.progress")
        self.every = progress_interval() if every is None else every
        self.bar = bar
        self.started = time.monotonic()
        self._next = self.started + self.every
        self.reports = 0

    def add_total(self, n: int) -> None:
        self.total += n

    def advance(self, n: int) -> None:
        self.update(self.done + n)

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every
            self.report(now)

    def rate(self, now: float | None = None) -> float:
        elapsed = (now or time.monotonic()) - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """Where the work is: done, of total, percent, rate, time left."""
        total = max(self.total, self.done)
        text = f"{self.prefix}{self.what}: "
        if self.unit == "bytes":
            text += human_bytes(self.done) + (f" of {human_bytes(total)}" if total else "")
        else:
            text += f"{self.done} of {total} {self.unit}" if total else f"{self.done} {self.unit}"
        if total:
            text += f" ({self.done * 100 // total}%)"
        rate = self.rate(now)
        if rate > 0:
            per_s = human_bytes(rate) if self.unit == "bytes" else f"{rate:.0f} {self.unit}"
            text += f", {per_s}/s"
            left = (total - self.done) / rate
            if left >= 1:
                text += f", about {left:.0f} s left"
        if self.detail is not None:
            text += f"; {self.detail()}"
        return text

    def report(self, now: float | None = None) -> None:
        self.reports += 1
        if self.bar is not None:
            self.bar.show(self.done, max(self.total, self.done), self.line(now))
        else:
            self.logger.info("%s", self.line(now))

    def finish(self) -> float:
        """Close the bar; the seconds it took (the caller logs its own summary)."""
        if self.bar is not None:
            self.bar.close(self.done, max(self.total, self.done))
        return time.monotonic() - self.started


#: Makes the :class:`Progress` of one phase: ``(what, total, unit)``.
ProgressFactory = Callable[[str, int, str], Progress]


def log_progress(logger: logging.Logger, prefix: str = "") -> ProgressFactory:
    """Progress reported as log lines on ``logger``, each starting with ``prefix``."""

    def make(what: str, total: int, unit: str) -> Progress:
        progress = Progress(what, total, unit=unit, logger=logger)
        progress.prefix = prefix
        return progress

    return make


class _RichTask:
    """One phase's bar in a :class:`RichBars`."""

    def __init__(self, bars: Any, task: Any, unit: str) -> None:
        self.bars = bars
        self.task = task
        self.unit = unit

    def _fields(self, done: int, total: int) -> dict[str, Any]:
        amount = f"{_amount(done, self.unit)} / {_amount(total, self.unit)}"
        return {"completed": done, "total": total or None, "amount": amount}

    def show(self, done: int, total: int, line: str) -> None:
        self.bars.update(self.task, **self._fields(done, total))

    def close(self, done: int, total: int) -> None:
        fields = self._fields(done, total)
        if not total:  # nothing to do: a full bar, not a pulsing one
            fields.update(completed=1, total=1)
        self.bars.update(self.task, **fields)
        self.bars.stop_task(self.task)


class RichBars:
    """Progress bars on stderr (rich), one per phase; use as a context manager.

    Amounts are what the phase measures (bytes present in the files, entries), never the
    files' allocated size.
    """

    #: Seconds between two redraws of a bar.
    EVERY = 0.1

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._bars = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[amount]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )

    def __enter__(self) -> RichBars:
        self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bars.stop()

    def factory(self) -> ProgressFactory:
        def make(what: str, total: int, unit: str) -> Progress:
            task = self._bars.add_task(what, total=total or None, amount="")
            return Progress(what, total, unit=unit, every=self.EVERY, bar=_RichTask(self._bars, task, unit))

        return make
