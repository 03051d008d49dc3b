"""tidemq_filter_server plugin package."""
