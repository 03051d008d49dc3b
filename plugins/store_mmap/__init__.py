"""tidemq_store_mmap plugin package."""
