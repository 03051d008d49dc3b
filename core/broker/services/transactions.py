"""The end of a transaction (END_TRANSACTION): commit or roll back a half message; and the seam
through which the broker's transaction check reaches a producer that is not on a remoting
connection (:class:`TransactionCheckTarget`, given a :class:`TransactionCheck`)."""

from __future__ import annotations

from tidemq.broker.context import BrokerContext
from tidemq.broker.services.status import DONE, Outcome, Status
from tidemq.broker.transaction import TransactionCheck, TransactionCheckTarget

__all__ = ["TransactionCheck", "TransactionCheckTarget", "TransactionService"]


class TransactionService:
    """Ends the transactions producers opened with half messages (RocketMQ's EndTransactionProcessor)."""

    def __init__(self, broker: BrokerContext) -> None:
        self.broker = broker

    async def end(
        self,
        peer_address: str,
        producer_group: str,
        tran_state_offset: int,
        commit_log_offset: int,
        kind: int,
        from_check: bool,
        transaction_id: str,
    ) -> Outcome:
        """Commit (``kind`` TRANSACTION_COMMIT_TYPE) or roll back (TRANSACTION_ROLLBACK_TYPE) the
        half message at ``commit_log_offset``; any other kind leaves it pending (the check service
        asks the producer again later).  A slave refuses."""
        b = self.broker
        if not b.is_master:
            return Outcome(Status.SLAVE_NOT_AVAILABLE, "the broker is a slave: end transaction is forbidden")
        error = await b.transactions.end(
            peer_address,
            producer_group,
            tran_state_offset,
            commit_log_offset,
            kind,
            from_check,
            transaction_id,
        )
        return DONE if error is None else Outcome(Status.SYSTEM_ERROR, error)
