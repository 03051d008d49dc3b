"""Answers the brokers' transaction check-backs for an exactly-once sink from its commit log.

The exactly-once sink's driver side starts one :class:`TransactionChecker` per query in the
process that commits micro-batches (Spark keeps that process for the query's life), so a half
message the driver neither committed nor rolled back is resolved from the commit log kept in the
checkpoint (:func:`tidemq_spark.txnlog.decide`).  Deployers who want check-backs answered while no
query runs can start one on its own::

    python -m tidemq_spark.checker --namesrv 127.0.0.1:9876 --checkpoint /ckpt/orders
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections import Counter
from typing import Any

from tidemq.client import LocalTransactionState, LoopThread, Message, MessageExt, TransactionProducer

from .client_options import ClientOptions
from .txnlog import TXN_PROPERTY, Decision, SinkTransactionLog, TxnTag, decide, local_path, query_key

log = logging.getLogger(__name__)

_STATE = {
    Decision.COMMIT: LocalTransactionState.COMMIT,
    Decision.ROLLBACK: LocalTransactionState.ROLLBACK,
    Decision.UNKNOWN: LocalTransactionState.UNKNOWN,
}


def client_kwargs(client: ClientOptions) -> dict[str, Any]:
    """Producer/consumer keyword arguments for the passthrough options (ACL keys, transport options)."""
    out: dict[str, Any] = {}
    if client.credentials is not None:
        out["credentials"] = client.credentials
    if client.transport_options:
        out["transport_options"] = dict(client.transport_options)
    return out


class _Listener:
    def __init__(self, query: str, txlog: SinkTransactionLog, answers: Counter[str]) -> None:
        self.query = query
        self.txlog = txlog
        self.answers = answers

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN  # never called: the checker sends nothing itself

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        tag = TxnTag.parse(msg.properties.get(TXN_PROPERTY))
        decision = decide(tag, self.query, self.txlog)
        self.answers[decision.value] += 1
        log.info(
            "transaction check of %s (%s): %s",
            msg.uniq_key or msg.msg_id,
            tag and tag.render(),
            decision.value,
        )
        return _STATE[decision]


class TransactionChecker:
    """A transactional producer of ``group`` that only answers check-backs, on its own loop thread."""

    def __init__(
        self,
        namesrv: str,
        group: str,
        query: str,
        txlog: SinkTransactionLog,
        client: ClientOptions | None = None,
    ) -> None:
        self.group = group
        self.query = query
        self.answers: Counter[str] = Counter()
        self._loop = LoopThread(f"tidemq-spark-checker-{query}")
        listener = _Listener(query, txlog, self.answers)
        self._producer = TransactionProducer(
            group, listener, namesrv, **client_kwargs(client or ClientOptions())
        )
        try:
            self._loop.run(self._producer.start(), 30)
        except BaseException:
            self._loop.stop()
            raise
        log.info("exactly-once sink: answering transaction checks of group %s from %s", group, txlog.dir)

    def close(self) -> None:
        try:
            self._loop.run(self._producer.shutdown(), 10)
        finally:
            self._loop.stop()


_checkers: dict[tuple[str, str, str], TransactionChecker] = {}
_lock = threading.Lock()


def ensure_checker(
    namesrv: str, group: str, query: str, txlog: SinkTransactionLog, client: ClientOptions | None = None
) -> TransactionChecker:
    """The process's checker for this query, started on first use (one per namesrv, group and query)."""
    key = (namesrv, group, query)
    with _lock:
        checker = _checkers.get(key)
        if checker is None:
            checker = _checkers[key] = TransactionChecker(namesrv, group, query, txlog, client)
        return checker


def main(argv: list[str] | None = None) -> None:
    from .sink_exactly_once import default_group, log_dir

    ap = argparse.ArgumentParser(prog="python -m tidemq_spark.checker", description=__doc__.split("\n")[0])
    ap.add_argument("--namesrv", required=True)
    ap.add_argument("--checkpoint", required=True, help="the query's checkpointLocation, as given to Spark")
    ap.add_argument("--transaction-log", help="the sink's transactionLog option, when one was given")
    ap.add_argument("--producer-group", help="the sink's producerGroup option, when one was given")
    ap.add_argument("--access-key")
    ap.add_argument("--secret-key")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    query = query_key(args.checkpoint)
    txlog = SinkTransactionLog(
        local_path(args.transaction_log) if args.transaction_log else log_dir(args.checkpoint)
    )
    client = ClientOptions(access_key=args.access_key, secret_key=args.secret_key)
    checker = TransactionChecker(
        args.namesrv, args.producer_group or default_group(query), query, txlog, client
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        checker.close()
        log.info("answers given: %s", dict(checker.answers))


if __name__ == "__main__":  # pragma: no cover
    main()
