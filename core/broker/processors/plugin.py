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
    pull,
    query,
    queue_query,
    reply,
    send,
)
from tidemq.remoting.codes import RequestCode


@hookimpl
def tidemq_register_processors(register: ProcessorRegister) -> None:
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
    ):
        module.register(register)
    broker = register.context
    # Delayed and transactional messages (the broker's schedule and transaction services).
    register.add(RequestCode.GET_ALL_DELAY_OFFSET, broker.schedule.get_all_delay_offset)
    register.add(RequestCode.END_TRANSACTION, broker.transactions.end_transaction)
    register.add(RequestCode.GET_TIMER_CHECK_POINT, broker.timers.get_timer_check_point)  # timer (issue 36)
    register.add(RequestCode.GET_TIMER_METRICS, broker.timers.get_timer_metrics)
    register.add(RequestCode.RECALL_MESSAGE, broker.timers.recall_message)
