"""What a consumer registered with a :class:`~tidemq.client.ClientInstance` may answer about itself
when a broker relays an operator's request to it (RocketMQ's ClientRemotingProcessor): typed
:class:`~typing.Protocol` s the instance dispatches on, each checked at run time.

* :class:`HoldsOffsets`: a consumer with its own offset table (push and pull consumers) answers
  GET_CONSUMER_STATUS_FROM_CLIENT (221) with it.  Any other consumer answers an empty table, as
  RocketMQ's ``MQClientInstance.getConsumerStatus`` does for a consumer that holds no offsets (a
  POP consumer: the broker keeps its group's offsets).
* :class:`ReportsRunningInfo`: a consumer that answers GET_CONSUMER_RUNNING_INFO (307) for itself.
* :class:`SpeaksForClients`: a member registered for several clients, each under its own client id
  (``tidemq proxy``'s v5 consumers): GET_CONSUMER_RUNNING_INFO names the client, and it answers for
  that one, or None when it does not have it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tidemq.queues import MessageQueue


@runtime_checkable
class HoldsOffsets(Protocol):
    """A consumer with its own offset table (GET_CONSUMER_STATUS_FROM_CLIENT)."""

    group: str

    def consumer_status(self, topic: str) -> dict[MessageQueue, int]:
        """The offsets it holds for ``topic`` (RocketMQ's ``cloneOffsetTable``)."""
        ...


@runtime_checkable
class ReportsRunningInfo(Protocol):
    """A consumer that reports its own ConsumerRunningInfo (GET_CONSUMER_RUNNING_INFO)."""

    group: str

    def running_info(self, with_jstack: bool = False) -> dict[str, Any]:
        """Its ConsumerRunningInfo: ``properties``, ``subscriptionSet``, ``mqTable``, ``statusTable``
        (and ``jstack`` when asked); the instance adds the name server, consume type and version."""
        ...

    def heartbeat_data(self) -> dict[str, Any]:
        """Its heartbeat entry (ConsumerData: ``consumeType``...)."""
        ...


@runtime_checkable
class SpeaksForClients(Protocol):
    """A member of a group registered for several clients under their own ids (tidemq proxy)."""

    group: str

    def running_info_of(self, client_id: str, with_jstack: bool) -> dict[str, Any] | None:
        """The ConsumerRunningInfo of ``client_id``, complete, as that client; None when it is not
        one of the group's clients here ("not online")."""
        ...
