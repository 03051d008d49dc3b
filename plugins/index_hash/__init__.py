"""tidemq_index_hash plugin package."""
