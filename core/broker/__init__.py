"""The broker: request processors over the message store, after RocketMQ's BrokerController.

:class:`Broker` is built from :class:`tidemq.config.Components`; its modules each own one thing:
:mod:`.topics` (topics.json), :mod:`.offsets` (consumerOffset.json), :mod:`.subscriptions`
(subscriptionGroup.json), :mod:`.clients` (producer/consumer connections), :mod:`.hold`
(long polling), :mod:`.registration` (NameServer registration) and one module per processor group.
"""

from tidemq.broker.broker import Broker

__all__ = ["Broker"]
