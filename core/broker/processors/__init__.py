"""Request processors, one module per group of request codes (as RocketMQ's broker has them).

Each module's ``register(register)`` adds its handlers to a
:class:`~tidemq.broker.context.ProcessorRegister`; :mod:`tidemq.broker.processors.plugin` calls them
from the ``tidemq_register_processors`` hook, through the same entry-point group a third party uses.
"""
