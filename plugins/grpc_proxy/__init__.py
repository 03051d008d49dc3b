"""``tidemq proxy``: RocketMQ 5's proxy in cluster mode.

One ``apache.rocketmq.v2.MessagingService`` endpoint (gRPC) in front of a NameServer and its broker
groups, speaking remoting to the brokers, so a RocketMQ 5 client sees one endpoint for the whole
cluster.  The RPCs are the transport_grpc plugin's, over a remoting backend
(:class:`~tidemq_grpc_proxy.cluster.ClusterBackend`).  See ``docs/proxy.md``.
"""
