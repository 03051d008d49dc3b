"""Entry point of the acl plugin: registers access validators ``plain`` and ``none``, and the broker's
ACL administration requests."""

from __future__ import annotations

from pathlib import Path

from tidemq import hookimpl
from tidemq.acl import AllowAll
from tidemq.config import parse_options
from tidemq.context import ProcessorRegister
from tidemq.plugins import PluginContext, Register
from tidemq_acl.validator import PlainAccessValidator, PlainAclOptions


def create_plain(ctx: PluginContext) -> PlainAccessValidator:
    opts = parse_options(PlainAclOptions, ctx.options, "[acl.plain]")
    path = Path(opts.file).expanduser()
    if not path.is_absolute():
        path = ctx.data_dir / path
    return PlainAccessValidator(
        path,
        reload_check_s=opts.reload_check_s,
        extra_admin_codes=frozenset(opts.extra_admin_codes),
        # Built after the store (BUILD_ORDER): read to check the topic of a message named by offset.
        store=ctx.components.get("store"),
    )


def create_none(ctx: PluginContext) -> AllowAll:
    return AllowAll()


@hookimpl
def tidemq_register_acl_validators(register: Register) -> None:
    register.add("plain", create_plain, "RocketMQ 4.x plain ACL: plain_acl.yml accounts, HmacSHA1 signatures")
    register.add("none", create_none, "no access control (the default)")


@hookimpl
def tidemq_register_processors(register: ProcessorRegister) -> None:
    # ACL administration (50-54): served on every broker, answered "not enabled" without the plain ACL.
    # Imported here: it pulls in the broker's modules, which a CLI command that only loads plugins
    # (tidemq admin ...) should not pay for.
    from tidemq_acl import admin

    admin.register(register)
