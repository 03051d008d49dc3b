"""END_TRANSACTION: the remoting codec over :class:`~tidemq.broker.services.transactions.TransactionService`."""

from __future__ import annotations

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header
from tidemq.broker.processors.answers import answer
from tidemq.broker.services import BrokerServices
from tidemq.broker.services.transactions import TransactionService
from tidemq.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection


class EndTransactionProcessor:
    def __init__(self, service: TransactionService) -> None:
        self.service = service

    async def end_transaction(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        h = Header(request.ext_fields, "END_TRANSACTION")
        kind = h.int("commitOrRollback")
        ending = kind in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)
        outcome = await self.service.end(
            conn.remote_address,
            # Read only when the transaction ends: an UNKNOWN answer may leave them out.
            h.str("producerGroup") if ending else "",
            h.int("tranStateTableOffset") if ending else -1,
            h.int("commitLogOffset") if ending else -1,
            kind,
            h.bool("fromTransactionCheck"),
            h.str("transactionId", ""),
        )
        return answer(request, outcome)


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    register.add(RequestCode.END_TRANSACTION, EndTransactionProcessor(services.transactions).end_transaction)
