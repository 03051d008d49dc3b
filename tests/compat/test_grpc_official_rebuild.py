"""The official RocketMQ 5 Python client (``rocketmq-python-client==5.1.2``) sending while the
broker's duplicate window is rebuilt (issue 37: at a promotion, or at start): its first attempt
outwaits the rebuild (REBUILD_WAIT_S) and is answered HA_NOT_AVAILABLE, a status the client sends
again (it gives up at once only on TOO_MANY_REQUESTS), and the next attempt is stored.  Before,
the endpoint's answer was an exception (gRPC INTERNAL) on every attempt, and the send failed.

An in-process broker with ``[transport.grpc]``; the client in its own venv (tests/compat/v5_venv.py).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import v5_venv

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

from test_grpc_transport import MakeBroker, grpc_broker  # noqa: E402

from tidemq.remoting.protocol import TopicConfig  # noqa: E402

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

V5_WORKER = Path(__file__).with_name("v5_client.py")


@pytest.fixture(scope="module")
def v5_python() -> Path:
    try:
        return v5_venv.v5_python()
    except v5_venv.Unavailable as exc:
        if os.environ.get("TIDEMQ_REQUIRE_SERVERS", "") not in ("", "0"):
            pytest.fail(f"TIDEMQ_REQUIRE_SERVERS is set but {exc}", pytrace=False)
        pytest.skip(str(exc))


def test_the_official_client_sends_again_past_a_window_rebuild(
    tidemq_make_broker: MakeBroker, v5_python: Path
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, _channel):
            from tidemq_transport_grpc import plugin as grpc_plugin

            address = grpc_plugin.server_of(broker).address
            broker.topics.update(TopicConfig("Rebuild", 4, 4))
            window = broker.dedup
            fill = window.fill
            assert fill is not None
            loop = asyncio.get_running_loop()
            release = asyncio.Event()

            def slow_fill(target: object) -> None:
                asyncio.run_coroutine_threadsafe(release.wait(), loop).result(60)
                fill(target)  # type: ignore[arg-type]

            window.fill = slow_fill
            refusals = []
            waited = window.wait_rebuilt

            async def wait_rebuilt(timeout: float = 2.5) -> bool:
                ok = await waited(timeout)
                if not ok:  # this attempt is refused: let the rebuild end for the next one
                    refusals.append(timeout)
                    release.set()
                return ok

            window.wait_rebuilt = wait_rebuilt  # type: ignore[method-assign]
            epoch = [1]
            window.epoch_source = lambda: epoch[0]
            window.built_for_epoch()
            epoch[0] = 2  # a new epoch: the window is rebuilt before it judges sends
            proc = await asyncio.create_subprocess_exec(
                str(v5_python),
                str(V5_WORKER),
                "produce",
                "--endpoints",
                address,
                "--topic",
                "Rebuild",
                "--count",
                "2",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 120)
            lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
            receipts = [line for line in lines if "message_id" in line]
            errors = [line for line in lines if "error" in line or "start_error" in line]
            assert not errors and len(receipts) == 2, (lines, err.decode()[-3000:])
            assert refusals, "no attempt outwaited the rebuild: the test proved nothing"
            stored = [
                b for qid in range(4) for b in broker.store.get_message("g", "Rebuild", qid, 0, 32).buffers
            ]
            assert len(stored) == 2  # each once

    asyncio.run(main())
