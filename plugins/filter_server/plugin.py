"""Entry point of the filter_server plugin: registers the ``TAG`` filter type."""

from __future__ import annotations

from tidemq import hookimpl
from tidemq.errors import ConfigError
from tidemq.filter import EXPRESSION_TAG
from tidemq.plugins import PluginContext, Register

from .tag import TagFilterFactory


def create_tag(ctx: PluginContext) -> TagFilterFactory:
    if ctx.options:
        raise ConfigError(f"[filter.TAG] takes no options, got: {', '.join(sorted(ctx.options))}")
    return TagFilterFactory()


@hookimpl
def tidemq_register_filters(register: Register) -> None:
    register.add(EXPRESSION_TAG, create_tag, "tags joined by '||' or '*', matched by tag code then exact tag")
