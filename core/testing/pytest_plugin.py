"""tidemq's pytest plugin: fixtures for testing tidemq plugins on real files and real sockets.

Installing tidemq registers it (entry point ``pytest11: tidemq``); ``-p no:tidemq`` turns it off.

* ``tidemq_plugins``: the process-wide :class:`~tidemq.plugins.PluginManager`, every installed
  plugin loaded (yours too, once installed).  Register throw-away plugins in your own manager.
* ``tidemq_make_store(name="mmap", *, flush="sync", options=None, ...)``: a loaded, started store
  in a new directory under ``tmp_path``; every store made is shut down at teardown.
* ``tidemq_make_broker(plugins=None, *, options=None, **settings)``: an async context manager
  running a real broker on 127.0.0.1 (port 0, no NameServer) over its own directory; see
  :func:`running_broker`.

The contract suites (``tidemq.testing.*_contract``) take their factories from fixtures you write,
usually on top of these.  Imports of tidemq stay inside the fixtures: every pytest run of a project
with tidemq installed loads this module.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tidemq.broker import Broker
    from tidemq.plugins import PluginManager
    from tidemq.store import MessageStore


@pytest.fixture(scope="session")
def tidemq_plugins() -> PluginManager:
    """The process-wide plugin manager with every installed plugin (built-ins first) loaded."""
    from tidemq.plugins import get_plugin_manager

    return get_plugin_manager()


@pytest.fixture
def tidemq_make_store(tmp_path: Path, tidemq_plugins: PluginManager) -> Iterator[Callable[..., MessageStore]]:
    """Factory of started stores; each in its own directory unless ``data_dir`` is given."""
    from tidemq.testing.store_contract import build_store

    made: list[MessageStore] = []
    numbers = itertools.count()

    def make(
        name: str = "mmap",
        *,
        flush: str = "sync",
        options: Mapping[str, Any] | None = None,
        flush_options: Mapping[str, Any] | None = None,
        index: Any | None = None,
        settings: Mapping[str, Any] | None = None,
        data_dir: Path | str | None = None,
    ) -> MessageStore:
        directory = Path(data_dir) if data_dir is not None else tmp_path / f"store-{name}-{next(numbers)}"
        store = build_store(
            name,
            directory,
            flush=flush,
            store_options=options,
            flush_options=flush_options,
            index=index,
            settings=settings,
            manager=tidemq_plugins,
        )
        assert store.load(), f"store {name!r} could not load {directory}"
        store.start()
        made.append(store)
        return store

    yield make
    for store in reversed(made):
        store.shutdown()


@contextlib.asynccontextmanager
async def running_broker(
    data_dir: Path | str,
    plugins: Mapping[str, str] | None = None,
    *,
    options: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    manager: PluginManager | None = None,
    **settings: Any,
) -> AsyncIterator[Broker]:
    """A broker composed like ``tidemq broker`` does, serving on 127.0.0.1 until the block ends.

    ``plugins`` overrides roles of :data:`tidemq.config.DEFAULT_PLUGINS` (``{"store": "memory"}``),
    ``options`` is the per-plugin tables (``{"store": {"mmap": {...}}}``) and ``settings`` are
    ``[broker]`` keys (``role="SYNC_MASTER"``).  ``broker.address`` is where clients connect.
    """
    from tidemq.broker import Broker
    from tidemq.config import DEFAULT_PLUGINS, BrokerSettings, Config, compose

    table: dict[str, Any] = {"listen": "127.0.0.1:0", "namesrv": [], "data_dir": str(data_dir), **settings}
    config = Config(
        broker=BrokerSettings(**table),
        plugins={**DEFAULT_PLUGINS, **(plugins or {})},
        options={
            role: {name: dict(opts) for name, opts in by_name.items()}
            for role, by_name in (options or {}).items()
        },
        source="<tidemq_make_broker>",
    )
    broker = Broker(compose(config, manager))
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


@pytest.fixture
def tidemq_make_broker(
    tmp_path: Path, tidemq_plugins: PluginManager
) -> Callable[..., contextlib.AbstractAsyncContextManager[Broker]]:
    """``async with tidemq_make_broker(plugins, **settings) as broker:`` a real broker in ``tmp_path``."""
    numbers = itertools.count()

    def make(
        plugins: Mapping[str, str] | None = None, *, options: Any = None, **settings: Any
    ) -> contextlib.AbstractAsyncContextManager[Broker]:
        data_dir = tmp_path / f"broker-{next(numbers)}"
        return running_broker(data_dir, plugins, options=options, manager=tidemq_plugins, **settings)

    return make
