"""mqadmin's consumer-side commands: offsets reset and clone, consumer status and running info."""
