"""tidemq_transport_tcp plugin package."""
