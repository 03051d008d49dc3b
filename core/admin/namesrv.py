"""mqadmin's NameServer commands: KV and order config, NameServer config, broker write permission, topic clusters."""
