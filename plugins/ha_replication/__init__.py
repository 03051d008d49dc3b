"""tidemq_ha_replication plugin package."""
