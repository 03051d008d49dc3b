"""mqadmin's subscription-group, broker-config, maintenance and export commands."""
