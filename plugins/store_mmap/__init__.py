"""tidemq_store_mmap: the default message store (CommitLog + ConsumeQueue on mmap'd files)."""

from .store import MmapMessageStore

__all__ = ["MmapMessageStore"]
