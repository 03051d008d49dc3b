"""Many concurrent gRPC streams: the endpoint's caps answer RESOURCE_EXHAUSTED, the broker's memory
stays bounded, and other clients (gRPC and remoting) keep being served.

The caps: ``max_concurrent_streams`` per connection (HTTP/2: a grpc client queues the streams
beyond it) and ``max_concurrent_calls`` for the whole endpoint (beyond it: RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, run_admin, runtime_info

grpc = pytest.importorskip("grpc")

from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
WORKER = Path(__file__).with_name("grpc_streams_worker.py")
SERVICE = "/apache.rocketmq.v2.MessagingService/"
#: The details of each gRPC status a stream ended with (for the assertion messages).
DETAILS: dict[str, str] = {}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def telemetry(channel: Any, client_id: str) -> Any:
    return channel.stream_stream(
        SERVICE + "Telemetry",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.TelemetryCommand.FromString,
    )(metadata=(("x-mq-client-id", client_id),))


async def open_stream(channel: Any, client_id: str) -> tuple[Any, str]:
    """A producer's Telemetry stream, established (settings answered): ``(stream, status name)``."""
    stream = telemetry(channel, client_id)
    settings = pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Many")])
    )

    async def establish() -> Any:
        await stream.write(pb.TelemetryCommand(settings=settings))
        return await stream.read()

    try:
        answer = await asyncio.wait_for(establish(), 120)
        return stream, pb.Code.Name(answer.status.code)
    except grpc.aio.AioRpcError as exc:
        # A write to a call the server already ended fails with grpc's own INTERNAL ("Internal
        # error from Core"): the call's status says what the server answered.
        code = await stream.code() if exc.code() is grpc.StatusCode.INTERNAL else exc.code()
        DETAILS[code.name] = (await stream.details()) or exc.details() or ""
        return stream, code.name
    except TimeoutError:
        return stream, "TIMEOUT"


async def query_route(channel: Any, topic: str) -> tuple[str, float]:
    """``(outcome, seconds)`` of one QueryRoute."""
    rpc = channel.unary_unary(
        SERVICE + "QueryRoute",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.QueryRouteResponse.FromString,
    )
    started = time.monotonic()
    try:
        answer = await rpc(
            pb.QueryRouteRequest(topic=pb.Resource(name=topic)),
            metadata=(("x-mq-client-id", "other@1"),),
            timeout=30,
        )
        outcome = pb.Code.Name(answer.status.code)
    except grpc.aio.AioRpcError as exc:
        outcome = exc.code().name
    return outcome, time.monotonic() - started


def test_the_endpoint_cap_answers_resource_exhausted_and_frees_with_the_streams(
    tidemq_make_broker: Any,
) -> None:
    async def main() -> None:
        options = {"transport": {"grpc": {"listen": "127.0.0.1:0", "max_concurrent_calls": 20}}}
        async with tidemq_make_broker(options=options, auto_create_topic=True) as broker:
            from tidemq_transport_grpc import plugin as grpc_plugin

            address = grpc_plugin.server_of(broker).address
            async with grpc.aio.insecure_channel(address) as hog, grpc.aio.insecure_channel(address) as other:
                opened = [await open_stream(hog, f"hog-{i}") for i in range(20)]
                assert {status for _, status in opened} == {"OK"}
                assert (await query_route(other, "Capped"))[0] == "RESOURCE_EXHAUSTED"
                _, refused = await open_stream(hog, "hog-20")
                assert refused == "RESOURCE_EXHAUSTED"
                for stream, _ in opened[:5]:
                    stream.cancel()
                await asyncio.sleep(0.5)
                assert (await query_route(other, "Capped"))[0] == "OK"  # served again
                for stream, _ in opened[5:]:
                    stream.cancel()

    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ten_thousand_streams_keep_memory_bounded_and_other_clients_served(
    spawn: Any, tmp_path: Path
) -> None:
    """10 000 Telemetry streams from 10 client processes over 100 connections (the per-connection
    cap is 100) against a broker subprocess whose endpoint takes 10 050 calls: its RSS is measured,
    a remoting send and a gRPC call of another client are served meanwhile, and the calls beyond
    the cap are refused."""
    streams = int(os.environ.get("TIDEMQ_GRPC_STREAMS", "10000"))
    per_channel = 100
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    grpc_address = f"127.0.0.1:{free_port()}"
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-streams"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = ["{namesrv}"]\n'
        f'data_dir = "{tmp_path / "data"}"\n[transport.grpc]\nlisten = "{grpc_address}"\n'
        f"max_concurrent_streams = {2 * per_channel}\nmax_concurrent_calls = {streams + 50}\n"
    )
    broker = spawn("broker", "-c", str(tmp_path / "broker.toml"))
    pid = broker.proc.pid
    run_admin(namesrv, "updateTopic", "-t", "Many", "-r", "1", "-w", "1", cwd=tmp_path)
    figures: dict[str, Any] = {}
    figures["rss_before"] = rss_bytes(pid)
    # Client processes of 1 000 streams each (one Python process with 10 000 streams hits
    # "Internal error from Core" in its own grpc), 10 connections each.
    started = time.monotonic()
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), grpc_address, str(per_worker), f"w{n}-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n, per_worker in enumerate(
            [1000] * (streams // 1000) + ([streams % 1000] if streams % 1000 else [])
        )
    ]
    try:
        reports = [json.loads(w.stdout.readline() or "{}") for w in workers]  # type: ignore[union-attr]
        figures["open_s"] = round(time.monotonic() - started, 1)
        assert sum(r.get("ok", 0) for r in reports) == streams, reports
        figures["rss_open"] = rss_bytes(pid)

        async def others() -> None:
            own = [("grpc.use_local_subchannel_pool", 1)]
            async with grpc.aio.insecure_channel(grpc_address, options=own) as other:
                # Another client is served while they are open (the cap is not reached)...
                outcome, seconds = await query_route(other, "Many")
                figures["other_call_s"] = round(seconds, 3)
                assert outcome == "OK" and seconds < 5
                sent = await asyncio.to_thread(
                    run_admin, namesrv, "sendMessage", "-t", "Many", "-p", "remoting", cwd=tmp_path
                )
                assert "SEND_OK" in sent.stdout
                # ... and beyond the endpoint's cap calls are refused at once.
                extra = [await open_stream(other, f"x{i}@streams") for i in range(100)]  # one by one
                outcomes = [status for _, status in extra]
                # The cap's headroom (50) is served, then every stream is refused at once:
                # RESOURCE_EXHAUSTED, or grpc's client-side INTERNAL when its first write met the
                # refusal (the client ends the call itself then).
                summary = "".join(o[0] for o in outcomes)
                assert summary.startswith("O" * 40) and summary.count("O") <= 50, (summary, DETAILS)
                refused = summary[summary.index("R") :]
                assert set(refused) <= {"R", "I"} and refused.count("R") > len(refused) // 2, (
                    summary,
                    DETAILS,
                )
                figures["rss_full"] = rss_bytes(pid)
                for stream, _ in extra:
                    stream.cancel()

        asyncio.run(others())
    finally:
        for w in workers:
            w.communicate("", timeout=60)  # stdin closed: the worker closes its streams
    time.sleep(3)
    figures["rss_closed"] = rss_bytes(pid)
    assert runtime_info(broker.addresses["broker"])["grpcCalls"] == "0"
    mib = {k: round(v / 2**20, 1) for k, v in figures.items() if k.startswith("rss")}
    per_stream = (figures["rss_open"] - figures["rss_before"]) / streams
    print(
        f"\n{streams} streams: open in {figures['open_s']} s, RSS MiB {mib}, {per_stream / 1024:.1f} KiB per stream"
    )
    assert per_stream < 64 * 1024, (per_stream, mib)  # bounded: tens of KiB a stream, not more
