"""RocketMQ 5's gRPC service (``apache.rocketmq.v2.MessagingService``) inside the broker's process.

Enabled by a ``[transport.grpc]`` table in the broker's TOML file (``listen``, default
``127.0.0.1:8081``, the RocketMQ proxy's default); it serves beside the remoting transport, not
instead of it.  ``grpcio`` is the ``grpc`` extra; the protobuf module is generated at build time
from ``tidemq_rocketmq_v2.proto`` (setup.py).  See ``docs/grpc.md``.

Other plugins import only ``tidemq_transport_grpc.api`` (``tidemq proxy`` serves the same RPCs over
remoting through it: ``docs/proxy.md``).
"""
