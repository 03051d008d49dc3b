"""A v5 SendMessage while the broker's duplicate window is being rebuilt (after a promotion, or at
start) is answered as the remoting path answers it: it waits for the rebuild (REBUILD_WAIT_S) and
is stored once the window serves, or is answered with a status the v5 clients send again, never
INTERNAL_SERVER_ERROR from an exception.  In-process broker, raw gRPC calls."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from test_dedup_promotion import hold_rebuild  # noqa: E402
from test_grpc_transport import META, MakeBroker, call, grpc_broker, pb  # noqa: E402

from tidemq.broker.dedup import REBUILD_WAIT_S  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def message(topic: str, message_id: str) -> Any:
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=b"during the rebuild",
        system_properties=pb.SystemProperties(message_id=message_id, message_type=pb.NORMAL),
    )


def test_a_grpc_send_during_the_window_rebuild_waits_or_is_answered_retryable(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            send = call(channel, "SendMessage", "SendMessageResponse")
            window = broker.dedup
            release = hold_rebuild(window)

            # A rebuild slower than REBUILD_WAIT_S: answered HA_NOT_AVAILABLE (the broker cannot
            # take writes yet), which the v5 clients send again; nothing stored.
            started = time.monotonic()
            refused = await send(pb.SendMessageRequest(messages=[message("Rebuilt", "01AA")]), metadata=META)
            assert refused.status.code == pb.HA_NOT_AVAILABLE, refused.status
            assert "rebuilt" in refused.status.message
            assert time.monotonic() - started >= REBUILD_WAIT_S * 0.9

            # A send that comes while it runs and outlasts it is served once the window serves.
            waiting = asyncio.ensure_future(
                send(pb.SendMessageRequest(messages=[message("Rebuilt", "01AB")]), metadata=META)
            )
            await asyncio.sleep(0.3)
            assert not waiting.done()
            release.set()
            served = await waiting
            assert served.status.code == pb.OK, served.status
            assert await window.wait_rebuilt(30)
            bodies = [
                m
                for qid in range(broker.topics.get("Rebuilt").write_queue_nums)
                for m in broker.store.get_message("g", "Rebuilt", qid, 0, 32).buffers
            ]
            assert len(bodies) == 1  # the refused one was not stored, the served one once

    asyncio.run(main())
