"""mqadmin's subscription-group, broker-config, permission, KV and ACL commands."""
