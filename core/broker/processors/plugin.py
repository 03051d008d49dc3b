"""The built-in request processors as a plugin (entry point ``broker_processors``)."""

from __future__ import annotations

from tidemq import hookimpl
from tidemq.broker.context import ProcessorRegister
from tidemq.broker.processors import (
    admin,
    broker_config,
    client_manage,
    consumer_control,
    consumer_manage,
    filter_server,
    groups,
    maintenance,
    monitoring,
    pop,
    pull,
    query,
    queue_query,
    reply,
    send,
    transaction,
)
from tidemq.broker.services import BrokerServices
from tidemq.remoting.codes import RequestCode


@hookimpl
def tidemq_register_processors(register: ProcessorRegister) -> None:
    # One set of services for every processor (the codecs over them); the composition root may
    # build it once for every transport instead.
    services = BrokerServices(register.context)
    for module in (
        send,
        pull,
        client_manage,
        consumer_manage,
        query,
        admin,
        filter_server,
        groups,
        broker_config,
        maintenance,
        consumer_control,
        monitoring,
        queue_query,
        reply,
        transaction,
        pop,  # POP consumption (RocketMQ 5, issue 39)
    ):
        module.register(register, services)
    # Delayed messages (the broker's schedule service).
    register.add(RequestCode.GET_ALL_DELAY_OFFSET, register.context.schedule.get_all_delay_offset)
    # Timer messages (RocketMQ 5, issue 36): the timer engine answers these itself.
    register.add(RequestCode.GET_TIMER_CHECK_POINT, services.timers.get_timer_check_point)
    register.add(RequestCode.GET_TIMER_METRICS, services.timers.get_timer_metrics)
    register.add(RequestCode.RECALL_MESSAGE, services.timers.recall_message)
