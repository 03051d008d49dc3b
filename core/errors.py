"""Exceptions shared by the kernel and plugins."""


class TidemqError(Exception):
    """Base class of every error tidemq raises on purpose."""


class ConfigError(TidemqError):
    """A configuration file or value is wrong; the message is one line naming the key."""


class PluginError(TidemqError):
    """A plugin is missing, unknown, duplicated or failed to load."""


class StoreError(TidemqError):
    """The message store refused an operation (corrupt file, size limit, disk full...)."""


class MessageTooLargeError(StoreError):
    """A message body or the whole encoded message is over the configured limit."""


class CorruptDataError(StoreError):
    """Stored bytes failed validation (bad magic code, size or CRC)."""
