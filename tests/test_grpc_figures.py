"""gRPC clients as the broker's operators see them: the endpoint's counters in Prometheus
(``tidemq_grpc_*``) and GET_BROKER_RUNTIME_INFO (``grpc*``), a v5 producer in
``producerConnection`` like a 4.x one, and both on the console's cluster page."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port, run_admin, runtime_info

grpc = pytest.importorskip("grpc")
pytest.importorskip("prometheus_client")

from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
pytestmark = pytest.mark.timeout(120)


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_grpc_connections_and_calls_in_metrics_runtime_info_and_producer_connections(
    spawn: Any, tmp_path: Path
) -> None:
    namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
    grpc_address = f"127.0.0.1:{free_port()}"
    metrics = f"127.0.0.1:{free_port()}"
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-f"\nlisten = "127.0.0.1:{free_port()}"\nnamesrv = ["{namesrv}"]\n'
        f'data_dir = "{tmp_path / "data"}"\nauto_create_topic = true\n[plugins]\nmetrics = "prometheus"\n'
        f'[metrics.prometheus]\nlisten = "{metrics}"\n[transport.grpc]\nlisten = "{grpc_address}"\n'
    )
    broker = spawn("broker", "-c", str(tmp_path / "broker.toml")).addresses["broker"]
    console = None
    try:
        import starlette  # noqa: F401 - the console extra

        console = spawn("console", "-n", namesrv, "--listen", f"127.0.0.1:{free_port()}").addresses["console"]
    except ImportError:
        pass
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with grpc.aio.insecure_channel(grpc_address) as channel:
            route = channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/QueryRoute",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.QueryRouteResponse.FromString,
            )
            meta = (("x-mq-client-id", "figures@1"),)
            for _ in range(3):
                await route(pb.QueryRouteRequest(topic=pb.Resource(name="Figures")), metadata=meta)
            stream = channel.stream_stream(
                "/apache.rocketmq.v2.MessagingService/Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )(metadata=meta)
            settings = pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Figures")])
            )
            await stream.write(pb.TelemetryCommand(settings=settings))
            await asyncio.wait_for(stream.read(), 10)
            # A producer with its Telemetry stream open: one connection, one open call.
            seen["metrics"] = await asyncio.to_thread(scrape, f"http://{metrics}/metrics")
            seen["info"] = await asyncio.to_thread(runtime_info, broker)
            seen["producers"] = await asyncio.to_thread(
                run_admin,
                namesrv,
                "producerConnection",
                "-g",
                "GRPC_PRODUCER_Figures",
                "-t",
                "Figures",
                cwd=tmp_path,
            )
            if console is not None:
                page = await asyncio.to_thread(urllib.request.urlopen, console, None, 30)
                seen["console"] = page.read().decode()
            stream.cancel()

    asyncio.run(main())
    if console is not None:  # the cluster page: the endpoint's figures and the v5 producer online
        assert "1 connections, 1 open calls, 4 calls served" in seen["console"]
        assert "GRPC_PRODUCER_Figures" in seen["console"] and "figures@1" in seen["console"]
    samples = seen["metrics"]
    assert samples["tidemq_grpc_connections"] == 1 and samples["tidemq_grpc_calls"] == 1
    assert samples["tidemq_grpc_requests_total"] == 4  # three routes and the stream
    assert samples["tidemq_grpc_acl_refusals_total"] == 0
    info = seen["info"]
    assert (info["grpcConnections"], info["grpcCalls"], info["grpcRequestsTotal"]) == ("1", "1", "4")
    # a client that names no language (no user agent, no x-mq-language): OTHER, as the proxy registers it
    assert "figures@1" in seen["producers"].stdout and "OTHER" in seen["producers"].stdout
    after = runtime_info(broker)
    assert after["grpcCalls"] == "0" and after["grpcConnections"] == "0"
