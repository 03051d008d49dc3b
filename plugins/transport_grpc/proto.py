"""The generated protobuf module, or a clear error saying how to get it."""

from __future__ import annotations

from types import ModuleType

from tidemq.errors import ConfigError


def load() -> ModuleType:
    """``tidemq_rocketmq_v2_pb2`` (grpcio and protobuf imported first, so a missing extra is named)."""
    try:
        import google.protobuf  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"[transport.grpc] needs grpcio and protobuf ({exc.name} is not installed): "
            "pip install 'tidemq[grpc]'"
        ) from exc
    try:
        from . import tidemq_rocketmq_v2_pb2 as pb
    except ImportError as exc:
        raise ConfigError(
            "[transport.grpc]: the protobuf module tidemq_rocketmq_v2_pb2 was not generated at build time "
            "(grpcio-tools was missing); reinstall tidemq with grpcio-tools installed "
            f"(pip install grpcio-tools && pip install -e .): {exc}"
        ) from exc
    except Exception as exc:  # protobuf's VersionError: a runtime older than the protoc that generated it
        raise ConfigError(
            f"[transport.grpc]: the installed protobuf cannot load the generated module ({exc}); "
            "pip install -U protobuf"
        ) from exc
    return pb
