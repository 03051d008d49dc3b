"""Creates the next mapped file ahead of need (RocketMQ's ``AllocateMappedFileService``).

A roll-over to a new commit-log file then takes a file made in the background instead of
waiting on the disk while the store's lock is held.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from pathlib import Path

from tidemq.threads import name_this_thread

from .mapped_file import MappedFile
from .transient_pool import TransientStorePool

log = logging.getLogger(__name__)


class AllocateService:
    """Creates the next mapped file in the background so a roll-over does not wait on the disk.

    Files are made with their blocks reserved (``fallocate`` by default), so a full disk shows up
    as a failed creation, early, and never as SIGBUS on a write into the mapping.
    """

    def __init__(
        self,
        *,
        pool: TransientStorePool | None = None,
        reserve_blocks: bool = False,
        warm_up: bool = False,
        allocate: str = "fallocate",
    ):
        self.pool = pool
        self.reserve_blocks = reserve_blocks
        self.allocate = allocate
        self.warm = warm_up
        self._pending: dict[Path, Future[MappedFile]] = {}
        self._lock = threading.Lock()

    def _create(self, path: Path, size: int) -> MappedFile:
        mf = MappedFile(
            path, size, pool=self.pool, reserve_blocks=self.reserve_blocks, allocate=self.allocate
        )
        if self.warm:
            mf.warm_up()
        return mf

    def _submit(self, path: Path, size: int) -> None:
        fut: Future[MappedFile] = Future()
        self._pending[path] = fut

        def run() -> None:
            name_this_thread()
            try:
                fut.set_result(self._create(path, size))
            except BaseException as exc:  # reported to whoever takes the file
                fut.set_exception(exc)

        threading.Thread(target=run, name=f"allocate-{path.name}", daemon=True).start()

    def get(self, path: Path, next_path: Path, size: int) -> MappedFile:
        """The file at ``path`` (created now or earlier), and start creating ``next_path``."""
        with self._lock:
            fut = self._pending.pop(path, None)
            if next_path not in self._pending and not next_path.exists():
                self._submit(next_path, size)
        if fut is not None:
            try:
                return fut.result()
            except OSError as exc:
                # Made ahead while the disk was full: try again now, the space may be back.
                log.warning("background creation of %s had failed (%s); retrying", path.name, exc)
        return self._create(path, size)

    def shutdown(self) -> None:
        """Drop files created ahead that nobody took (they would be empty files at the tail)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            try:
                fut.result(timeout=30).destroy()
            except Exception:  # a failed pre-allocation has nothing to clean
                pass
