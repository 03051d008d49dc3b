"""The ``tidemq`` command line: run a NameServer, a broker or both; list plugins; admin tools.

Public for plugins that add a long-running command through ``tidemq_add_commands`` (``tidemq
filtersrv`` does): :func:`run_service` runs the command's coroutine as ``tidemq broker`` does, and
:func:`serve_until_signalled` starts services, prints their ``listening on`` lines and stops them
on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import importlib.util
import logging
import os
import signal
import socket
import sys
import tomllib
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import attrs
import click

from tidemq import __version__, _native, logs
from tidemq.address import split_address
from tidemq.config import DEFAULT_HOME, Config, check_broker, load_config, parse_address
from tidemq.datadir import files_umask, make_private
from tidemq.errors import TidemqError
from tidemq.plugins import ROLES, get_plugin_manager

log = logging.getLogger("tidemq")

__all__ = ["cli", "main", "run_service", "serve_until_signalled"]


def _fail(exc: Exception | str) -> None:
    click.echo(f"tidemq: error: {exc}", err=True)
    sys.exit(2)


def run_service(main: Callable[[], Coroutine[Any, Any, None]], *, listen_hint: str = "") -> None:
    """Run ``main`` on uvloop when it is installed, turning config mistakes into one-line errors.

    ``listen_hint`` names the flags or keys that choose the command's ports, for the error a
    port already in use gets.
    """
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # uvloop is the optional `fast` extra
        factory = None
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(main())
    except TidemqError as exc:
        _fail(exc)
    except OSError as exc:  # a port already taken, a data directory we may not write...
        if exc.errno == errno.EADDRINUSE:
            _fail(_address_in_use(exc, listen_hint))
        _fail(exc)
    except KeyboardInterrupt:
        pass


def _address_in_use(exc: OSError, listen_hint: str) -> str:
    """One line for EADDRINUSE: which address, the likely cause, how to pick another port."""
    what = exc.strerror or str(exc)
    hint = f"; or choose another port with {listen_hint}" if listen_hint else "; or choose another port"
    return (
        f"{what}: another tidemq (or another program) is listening there, "
        f"stop it (`ss -ltnp` shows which process){hint}"
    )


async def serve_until_signalled(services: list[tuple[str, Any]]) -> None:
    """Start services in order, announce them, wait for SIGINT/SIGTERM, stop in reverse order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    started: list[tuple[str, Any]] = []
    try:
        for what, service in services:
            await service.start()
            started.append((what, service))
            # The CLI's own output: tests and operators wait for this line.
            click.echo(f"tidemq {what} listening on {service.address}")
            metrics_url = getattr(service, "metrics_url", "")
            if metrics_url:
                click.echo(f"tidemq {what} metrics on {metrics_url}")
            # Endpoints its plugins serve (a broker's gRPC), after the line scripts wait for.
            for name, address in getattr(service, "endpoints", {}).items():
                click.echo(f"tidemq {name} listening on {address}")
        sys.stdout.flush()
        tune_gc()
        await stop.wait()
        log.info("signal received, shutting down")
    finally:
        for what, service in reversed(started):
            try:
                await service.stop()
            except Exception:  # keep stopping the others
                log.exception("error while stopping %s", what)


#: Young-generation threshold of a serving process (CPython's default is 700); 0 leaves the
#: collector as it is.  ``TIDEMQ_GC_GEN0`` overrides it.
GC_GEN0 = 50_000


def tune_gc() -> None:
    """Once serving: freeze what start-up allocated and collect the young generation less often.

    A broker allocates a few short-lived objects per request (headers, results, coroutines);
    reference counting frees nearly all of them, yet every 700 allocations the collector walked
    the young generation, and each full collection walked everything start-up built (plugins,
    config, queue tables).  ``gc.freeze`` moves the latter out of the collector's sight;
    a larger gen-0 threshold makes collections rarer (cycles still get collected).
    """
    gen0 = int(os.environ.get("TIDEMQ_GC_GEN0", GC_GEN0))
    if gen0 <= 0:
        return
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)
    log.info("gc: %d start-up objects frozen, gen-0 threshold %d", gc.get_freeze_count(), gen0)


def _listen_flag(value: str, flag: str) -> str:
    """A HOST:PORT flag to listen on, checked like the config's ``listen`` but naming the flag."""
    parse_address(value, flag, allow_port_zero=True)
    return value


def _apply_broker_overrides(
    cfg: Config,
    listen: str | None,
    namesrv: str | None,
    data_dir: str | None,
    listen_flag: str = "--listen",
) -> Config:
    broker = cfg.broker
    if listen:
        broker = attrs.evolve(broker, listen=_listen_flag(listen, listen_flag))
    if namesrv:
        addresses = [a for a in namesrv.replace(",", ";").split(";") if a]
        for address in addresses:
            parse_address(address, "--namesrv")
        broker = attrs.evolve(broker, namesrv=addresses)
    if data_dir:
        broker = attrs.evolve(broker, data_dir=data_dir)
    return attrs.evolve(cfg, broker=broker)


def _make_namesrv(cfg: Config, *, with_metrics: bool = True) -> Any:
    from tidemq.namesrv import NameServer

    manager = get_plugin_manager()
    transport = manager.create("transport", cfg.plugins["transport"], options=cfg.plugin_options("transport"))
    namesrv = NameServer(cfg.namesrv, transport)
    exporter = cfg.plugins.get("metrics", "none")
    if not with_metrics or exporter == "none":
        return namesrv
    return _WithMetrics(namesrv, manager.create("metrics", exporter, options=cfg.plugin_options("metrics")))


class _WithMetrics:
    """A service and its metrics exporter (role ``metrics``): started after it, stopped before it."""

    def __init__(self, service: Any, exporter: Any) -> None:
        self.service = service
        self.exporter = exporter
        self.metrics_url = ""

    @property
    def address(self) -> str:
        return str(self.service.address)

    async def start(self) -> None:
        await self.service.start()
        try:
            self.metrics_url = await self.exporter.start(self.service)
        except BaseException:
            await self.service.stop()
            raise

    async def stop(self) -> None:
        await self.exporter.stop()
        await self.service.stop()


#: ``tidemq standalone``'s metrics endpoint when its config names none (a taken port only warns).
STANDALONE_METRICS = {"listen": "127.0.0.1:5557", "required": False}


def _standalone_metrics(cfg: Config) -> Config:
    """Turn the Prometheus endpoint on, on loopback, unless the config chose (``metrics = "none"``)."""
    if "metrics" in cfg.plugins:
        return cfg
    options = {role: dict(tables) for role, tables in cfg.options.items()}
    table = options.setdefault("metrics", {})
    table["prometheus"] = {**STANDALONE_METRICS, **table.get("prometheus", {})}
    return attrs.evolve(cfg, plugins={**cfg.plugins, "metrics": "prometheus"}, options=options)


#: ``tidemq standalone``'s gRPC endpoint (RocketMQ 5 clients) when its config has no
#: ``[transport.grpc]`` table: the RocketMQ proxy's default address.
STANDALONE_GRPC = "127.0.0.1:8081"


def _standalone_grpc(cfg: Config, listen: str | None, off: bool) -> tuple[Config, str]:
    """Serve gRPC unless ``--no-grpc`` or the config chose; ``(config, why it is not served)``.

    ``--grpc-listen`` or a ``[transport.grpc]`` table is a request: a busy port then fails the
    start.  The default address is an offer: without grpcio, or with 8081 taken, the broker
    starts without it and the returned line says why."""
    options = {role: dict(tables) for role, tables in cfg.options.items()}
    transports = options.setdefault("transport", {})
    if off:
        transports.pop("grpc", None)
        return attrs.evolve(cfg, options=options), ""
    table = dict(transports.get("grpc") or {})
    if listen is not None:
        table["listen"] = _listen_flag(listen, "--grpc-listen")
    elif "grpc" not in transports:  # the default: only if it can be served
        if importlib.util.find_spec("grpc") is None:
            return cfg, "grpcio is not installed (pip install 'tidemq[grpc]'; --no-grpc hides this line)"
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds
            probe.bind(split_address(STANDALONE_GRPC))
        except OSError as exc:
            return cfg, (
                f"{STANDALONE_GRPC} is taken ({exc.strerror}); --grpc-listen HOST:PORT picks another "
                "address, --no-grpc turns it off"
            )
        finally:
            probe.close()
        table["listen"] = STANDALONE_GRPC
        table["required"] = False  # taken between the probe and the bind: a warning, not a failed start
    transports["grpc"] = table
    return attrs.evolve(cfg, options=options), ""


def _make_broker(cfg: Config) -> Any:
    from tidemq.broker import Broker

    # The checks `tidemq check-config` runs, then the broker from the plugins they built.
    return Broker(check_broker(cfg))


class _PluginCommands(click.Group):
    """Adds commands contributed by plugins (``tidemq_add_commands``) the first time they are needed."""

    _loaded = False

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            try:
                from tidemq.admin import admin

                self.add_command(admin)
            except ImportError:
                pass
            get_plugin_manager().hook.tidemq_add_commands(cli=self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load()
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _add_log_options(cmd)
        return cmd


# ---------------------------------------------------------------------------- logging set-up

LOG_FILE_HELP = (
    "Also log to this file, rotated (see --log-max-bytes, --log-backups); stderr then keeps WARNING "
    "and above. 'auto' (or --log-file without a value after the sub-command) is the command's "
    "default: <data dir>/logs/broker.log for broker, <data dir>/logs/standalone.log for "
    "standalone, <[namesrv] data_dir or ~/.tidemq>/logs/namesrv.log for namesrv (or $TIDEMQ_LOG_FILE)."
)


def _check_level(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not isinstance(logging.getLevelName(value.upper()), int):
        raise click.BadParameter(f"{value!r} is not a level (DEBUG, INFO, WARNING, ERROR, CRITICAL)")
    return value


def _check_size(_ctx: click.Context, _param: click.Parameter, value: str | int | None) -> int | None:
    if value is None:
        return None
    try:
        return logs.parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _apply_log_settings(settings: logs.LogSettings) -> None:
    try:
        logs.configure(settings)
    except (OSError, ValueError) as exc:  # a log directory we may not create or write
        _fail(f"cannot log to {settings.file}: {exc}")


def _override_log(field: str, check: Callable[..., Any] | None = None) -> Callable[..., None]:
    """A sub-command's --log-* flag: replaces what the group's flag (or variable) chose."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None:
            return
        if check is not None:
            value = check(ctx, param, value)
        _apply_log_settings(attrs.evolve(logs.settings(), **{field: value}))

    return callback


#: Commands with a default log location (``--log-file`` without a value after them).
_SERVICES = ("namesrv", "broker", "standalone")


def _log_options(service: bool) -> list[click.Option]:
    """The group's --log-* flags again, for after a sub-command (values only when given)."""
    file_help = (
        "Log to PATH, rotated; without PATH, the command's default location (see tidemq --help)."
        if service
        else "Log to PATH, rotated."
    )
    return [
        click.Option(
            ["--log-level"],
            expose_value=False,
            callback=_override_log("level", _check_level),
            help="Logging level (as before the sub-command).",
        ),
        click.Option(
            ["--log-file"],
            is_flag=False,
            flag_value=logs.AUTO if service else None,
            metavar="[PATH]" if service else "PATH",
            expose_value=False,
            callback=_override_log("file"),
            help=file_help,
        ),
        click.Option(
            ["--log-format"],
            type=click.Choice(logs.FORMATS),
            expose_value=False,
            callback=_override_log("format"),
            help="text or json (one object per line).",
        ),
        click.Option(
            ["--log-max-bytes"],
            expose_value=False,
            callback=_override_log("max_bytes", _check_size),
            help="Rotate the log file at this size.",
        ),
        click.Option(
            ["--log-backups"],
            type=click.IntRange(0),
            expose_value=False,
            callback=_override_log("backups"),
            help="Rotated log files kept.",
        ),
    ]


def _add_log_options(cmd: click.Command) -> None:
    """Give ``cmd`` (and a group's sub-commands) the --log-* flags, once, unless it has its own."""
    if getattr(cmd, "_tidemq_log_options", False):
        return
    cmd._tidemq_log_options = True  # type: ignore[attr-defined]
    taken = {opt for param in cmd.params for opt in param.opts}
    options = _log_options(cmd.name in _SERVICES)
    cmd.params.extend(opt for opt in options if not taken.intersection(opt.opts))
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _add_log_options(sub)


def _default_log_file(directory: Path, name: str) -> None:
    """``--log-file auto``: log to ``<directory>/logs/<name>``; say where on stdout."""
    path = logs.use_default_file(directory.expanduser() / "logs" / name)
    if path is not None and logs.settings().file == logs.AUTO:
        click.echo(f"tidemq log file {path}")


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the version and which compiled extensions run (a bug report's first lines)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"tidemq, version {__version__}\ncodec: {_native.DESCRIPTION}")
    try:  # the hash index plugin's own extension; a build without the plugin has none
        from tidemq_index_hash import native as index_native

        click.echo(f"hash index: {index_native.DESCRIPTION}")
    except ImportError:
        pass
    try:  # the request lanes the mmap store offers (issue 38)
        from tidemq_store_mmap.lane import describe as lanes_description

        click.echo(f"request lanes: {lanes_description()}")
    except ImportError:
        pass
    try:  # the Spark sources' column builder (tidemq_spark), which a build may leave out too
        from tidemq_spark.schema import native_description

        click.echo(f"spark columns: {native_description()}")
    except ImportError:
        pass
    try:  # the mmap store's PULL_MESSAGE lane (issue 38)
        from tidemq_store_mmap.pull_lane import describe as pull_lane_description

        click.echo(f"pull lane: {pull_lane_description()}")
    except ImportError:
        pass
    try:  # the sync flush policy's compiled rounds (issue 38)
        from tidemq_flush.native_rounds import describe as flush_rounds_description

        click.echo(f"sync flush rounds: {flush_rounds_description()}")
    except ImportError:
        pass
    try:  # the mmap store's put of a call's groups (issue 38)
        from tidemq_store_mmap.group_put import describe as group_put_description

        click.echo(f"store group put: {group_put_description()}")
    except ImportError:
        pass
    ctx.exit()


@click.group(cls=_PluginCommands)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and whether the compiled extensions are active, then exit.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    envvar="TIDEMQ_LOG_LEVEL",
    callback=_check_level,
    help="Logging level: DEBUG, INFO, WARNING, ERROR (or $TIDEMQ_LOG_LEVEL).",
)
@click.option("--log-file", metavar="PATH|auto", envvar="TIDEMQ_LOG_FILE", help=LOG_FILE_HELP)
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS),
    default="text",
    show_default=True,
    envvar="TIDEMQ_LOG_FORMAT",
    help="text, or json: one object per line with time, level, logger, message, exception (or $TIDEMQ_LOG_FORMAT).",
)
@click.option(
    "--log-max-bytes",
    default="100MiB",
    show_default=True,
    envvar="TIDEMQ_LOG_MAX_BYTES",
    callback=_check_size,
    help="Rotate the log file at this size (64MiB, 1G...; 0 never rotates) (or $TIDEMQ_LOG_MAX_BYTES).",
)
@click.option(
    "--log-backups",
    type=click.IntRange(0),
    default=logs.DEFAULT_BACKUPS,
    show_default=True,
    envvar="TIDEMQ_LOG_BACKUPS",
    help="Rotated log files kept: FILE.1 ... FILE.N (or $TIDEMQ_LOG_BACKUPS).",
)
def cli(log_level: str, log_file: str | None, log_format: str, log_max_bytes: int, log_backups: int) -> None:
    """tidemq: a RocketMQ-compatible message broker built from plugins.

    The --log-* options may also follow the sub-command (tidemq broker --log-level DEBUG ...);
    there they win over the ones before it.
    """
    settings = logs.LogSettings(log_level, log_file or None, log_format, log_max_bytes, log_backups)
    _apply_log_settings(settings)


@cli.command()
@click.option(
    "-c", "--config", "config_path", type=click.Path(dir_okay=False), help="TOML file with a [namesrv] table."
)
@click.option("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9876).")
def namesrv(config_path: str | None, listen: str | None) -> None:
    """Run a NameServer."""

    async def main() -> None:
        cfg = load_config(config_path)
        if listen:
            cfg = attrs.evolve(
                cfg, namesrv=attrs.evolve(cfg.namesrv, listen=_listen_flag(listen, "--listen"))
            )
        os.umask(files_umask())  # kvConfig.json and the log: 0600 (tidemq.datadir)
        _default_log_file(Path(cfg.namesrv.data_dir or DEFAULT_HOME), "namesrv.log")
        await serve_until_signalled([("namesrv", _make_namesrv(cfg))])

    run_service(main, listen_hint="--listen HOST:PORT (or [namesrv] listen)")


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="Broker TOML file.")
@click.option("--listen", help="HOST:PORT to listen on (overrides [broker] listen).")
@click.option("--namesrv", "namesrv_addr", help="NameServer addresses, separated by ';'.")
@click.option("--data-dir", help="Store directory (overrides [broker] data_dir).")
def broker(
    config_path: str | None, listen: str | None, namesrv_addr: str | None, data_dir: str | None
) -> None:
    """Run a broker composed from the plugins its config names."""

    async def main() -> None:
        cfg = _apply_broker_overrides(load_config(config_path), listen, namesrv_addr, data_dir)
        os.umask(files_umask(cfg.broker.data_dir_mode))  # store files 0600 under a 0700 directory
        _default_log_file(cfg.broker.store_path, "broker.log")
        await serve_until_signalled([("broker", _make_broker(cfg))])

    run_service(main, listen_hint="--listen HOST:PORT (or [broker] listen)")


@cli.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="Optional TOML file.")
@click.option(
    "--data-dir",
    default=str(DEFAULT_HOME / "standalone"),
    show_default=True,
    help="Store directory of the embedded broker.",
)
@click.option("--namesrv-listen", default="127.0.0.1:9876", show_default=True)
@click.option("--broker-listen", default="127.0.0.1:10911", show_default=True)
@click.option(
    "--grpc-listen",
    default=None,
    help=f"HOST:PORT of the gRPC endpoint for RocketMQ 5 clients [default: {STANDALONE_GRPC}, "
    "skipped with a line saying why when it is taken or grpcio is missing].",
)
@click.option("--no-grpc", is_flag=True, help="Serve no gRPC endpoint (RocketMQ 5 clients).")
def standalone(
    config_path: str | None,
    data_dir: str,
    namesrv_listen: str,
    broker_listen: str,
    grpc_listen: str | None,
    no_grpc: bool,
) -> None:
    """Run a NameServer and a broker in one process with the default plugins, and the gRPC
    endpoint RocketMQ 5 clients use."""

    async def main() -> None:
        cfg = load_config(config_path)
        _listen_flag(broker_listen, "--broker-listen")  # before the NameServer starts
        cfg = attrs.evolve(
            cfg, namesrv=attrs.evolve(cfg.namesrv, listen=_listen_flag(namesrv_listen, "--namesrv-listen"))
        )
        os.umask(files_umask(cfg.broker.data_dir_mode))  # store files 0600 under a 0700 directory
        make_private(Path(data_dir).expanduser(), cfg.broker.data_dir_mode)
        _default_log_file(Path(data_dir), "standalone.log")
        cfg = _standalone_metrics(cfg)
        cfg, no_grpc_reason = _standalone_grpc(cfg, grpc_listen, no_grpc)
        if no_grpc_reason:
            click.echo(f"tidemq grpc not serving: {no_grpc_reason}")
        # One metrics endpoint for the process: the broker's, with the NameServer's figures in it.
        ns = _make_namesrv(cfg, with_metrics=False)
        # The broker registers with the NameServer it runs beside, wherever that really listens.
        await ns.start()
        click.echo(f"tidemq namesrv listening on {ns.address}")
        try:
            cfg = _apply_broker_overrides(cfg, broker_listen, ns.address, data_dir, "--broker-listen")
            click.echo(f"tidemq data directory {cfg.broker.store_path}")
            broker = _make_broker(cfg)
            broker.metrics_companions.append(ns)
            await serve_until_signalled([("broker", broker)])
        finally:
            await ns.stop()

    run_service(main, listen_hint="--namesrv-listen HOST:PORT and --broker-listen HOST:PORT")


@cli.command()
def plugins() -> None:
    """List installed plugins by role."""
    try:
        catalogue = get_plugin_manager().catalogue()
    except TidemqError as exc:
        _fail(exc)
        return
    for role in ROLES:
        click.echo(f"{role}:")
        entries = catalogue[role]
        if not entries:
            click.echo("  (none installed)")
        for info in entries:
            origin = (
                info.plugin if info.distribution == "tidemq" else f"{info.plugin}, from {info.distribution}"
            )
            click.echo(f"  {info.name:<20} {info.summary}  [{origin}]")


@cli.command("check-config")
@click.argument("config_path", type=click.Path(dir_okay=False), required=False)
@click.option(
    "--show", is_flag=True, help="Also print the effective configuration: every key, defaults filled in."
)
def check_config(config_path: str | None, show: bool) -> None:
    """Validate a broker config file as `tidemq broker` does, starting nothing; print the plugins it selects.

    Without CONFIG_PATH the defaults are checked (and shown with --show).  Protected mode is
    checked for the broker, its HA port and the [namesrv] table: an open listener beyond loopback
    is an error, and one left open with ``insecure = true`` is printed as a ``warning:`` line.
    """
    from tidemq.config_reference import show as show_config
    from tidemq.namesrv.auth import load_namesrv_auth
    from tidemq.protected import check_namesrv_settings, issued_warnings

    try:
        cfg = load_config(config_path)
        check_broker(cfg)
        # The [namesrv] table too: protected mode and its credentials file (defaults pass).
        if cfg.namesrv.credentials_file:
            load_namesrv_auth(cfg.namesrv.credentials_file)
        check_namesrv_settings(cfg.namesrv)
        warnings = issued_warnings()
        given = tomllib.loads(Path(config_path).read_text()) if config_path else {}
        text = show_config(cfg, given) if show else ""
    except TidemqError as exc:
        _fail(exc)
        return
    if text:
        click.echo(text, nl=False)
    else:
        for role, name in cfg.plugins.items():
            click.echo(f"{role} = {name}")
    for line in warnings:  # listeners left open on purpose (insecure = true)
        click.echo(f"warning: {line}")


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="tidemq")
