"""Options of the ``mmap`` store: the ``[store.mmap]`` table."""

from __future__ import annotations

import math

import attrs

from tidemq.address import split_address
from tidemq.config import INT32_MAX, number
from tidemq.message import local_ip


def parse_host(address: str) -> tuple[str, int]:
    """``ip:port`` for STOREHOSTADDRESS; a wildcard or name becomes this machine's IP."""
    host, port = split_address(address, default_port=0)
    try:
        import ipaddress

        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            host = local_ip()
    except ValueError:
        host = local_ip()
    return host, port


def _positive(_inst: object, attribute: attrs.Attribute, value: float) -> None:
    if not 0 < value < math.inf:  # also refuses nan
        raise ValueError(f"{attribute.name} must be a finite number > 0, got {value!r}")


def _ratio(_inst: object, attribute: attrs.Attribute, value: int) -> None:
    if not 10 <= value <= 95:
        raise ValueError(f"{attribute.name} must be between 10 and 95 (percent), got {value!r}")


def _hours(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    try:
        hours = [int(h) for h in value.split(";") if h.strip()]
    except ValueError:
        raise ValueError(
            f'{attribute.name} must be hours separated by \';\' like "04" or "01;13", got {value!r}'
        ) from None
    if not hours or any(not 0 <= h <= 23 for h in hours):
        raise ValueError(f"{attribute.name} must list hours 0-23 separated by ';', got {value!r}")


@attrs.define
class MmapStoreOptions:
    """Names follow RocketMQ's MessageStoreConfig in snake case."""

    #: Bytes per commit-log file (mappedFileSizeCommitLog).
    commitlog_file_size: int = number(1024 * 1024 * 1024, ge=1, le=INT32_MAX)
    #: Entries per ConsumeQueue file (mappedFileSizeConsumeQueue / 20).
    consumequeue_entries: int = number(300_000, ge=1, le=INT32_MAX // 20)
    #: Largest body accepted; 0 takes the broker's ``max_message_size``.
    max_message_size: int = number(0, ge=0, le=INT32_MAX)
    #: ``ip:port`` written as STOREHOSTADDRESS (and into msgIds); "" takes the broker's address.
    store_host: str = ""
    #: Check body CRCs while recovering (checkCRCOnRecover).
    check_crc_on_recover: bool = True
    #: Check the body CRC of every record served; a damaged one is logged and skipped, never served.
    check_crc_on_read: bool = True
    #: Compress bodies at rest ("none" by default: RocketMQ 4.x clients only understand zlib).
    compression: str = attrs.field(default="none", metadata={"choices": ("none", "lz4", "zstd")})
    #: Bodies at least this large are compressed (compressMsgBodyOverHowmuch).
    compression_min_size: int = attrs.field(default=4096, validator=_positive)
    #: Create the next commit-log file in the background (AllocateMappedFileService).
    preallocate: bool = True
    #: How a new store file gets its blocks.  Nothing is written through the mapping where blocks
    #: are not reserved (pwrite elsewhere), so a full disk is an ENOSPC error the put reports,
    #: never a SIGBUS, either way: "sparse" (default) takes space as the file fills, reserving
    #: 4 MiB ahead at a time; "fallocate" reserves the whole file when it is created (in the
    #: background for the commit log), so a full disk fails the creation early
    #: (CREATE_MAPPED_FILE_FAILED), at the cost of the file's full size up front.
    file_allocation: str = attrs.field(default="sparse", metadata={"choices": ("fallocate", "sparse")})
    #: Older switch: true forces file_allocation = "fallocate".
    reserve_blocks: bool = False
    #: Touch every page of a new commit-log file before use (warmMapedFileEnable).
    warm_up: bool = False
    #: Write into an off-map buffer, commit it into the mapping, then flush (transientStorePoolEnable).
    transient_store_pool: bool = False
    #: Buffers in the pool, each ``commitlog_file_size`` bytes, resident (transientStorePoolSize).
    transient_store_pool_size: int = attrs.field(default=5, validator=_positive)
    #: Keep commit-log files this long after their last write (fileReservedTime).
    file_reserved_hours: float = attrs.field(default=72.0, validator=_positive)
    #: Hours of the day when expired files are deleted (deleteWhen).
    delete_when: str = attrs.field(default="04", validator=_hours)
    #: Delete expired files at any hour once the disk is this full (diskMaxUsedSpaceRatio).
    disk_max_used_space_ratio: int = attrs.field(default=75, validator=_ratio)
    #: Delete the oldest files even when not expired once the disk is this full.
    disk_clean_forcibly_ratio: int = attrs.field(default=85, validator=_ratio)
    #: Refuse writes with DISK_FULL while the disk is fuller than this (diskSpaceWarningLevelRatio).
    disk_space_warning_ratio: int = attrs.field(default=90, validator=_ratio)
    #: Files deleted per cleanup round at most (deleteCommitLogFilesInterval's batch).
    delete_files_batch_max: int = attrs.field(default=10, validator=_positive)
    #: How often the cleanup checks run.
    clean_interval_ms: int = attrs.field(default=10_000, validator=_positive)
    #: How often the ConsumeQueues and the checkpoint are flushed.
    cq_flush_interval_ms: int = attrs.field(default=1000, validator=_positive)
    #: A queue is flushed only once this many 4 KiB pages of it are dirty, except in a thorough
    #: flush (flushConsumeQueueLeastPages): fewer ``fdatasync`` calls beside the commit log's.
    cq_flush_least_pages: int = number(2, ge=0, le=INT32_MAX)
    #: How often every queue is flushed whatever it holds (flushConsumeQueueThoroughInterval); the
    #: checkpoint's logics time advances only then, so a crash re-dispatches at most this much.
    cq_flush_thorough_interval_ms: int = attrs.field(default=60_000, validator=_positive)
    #: How often the key index's files are made durable and the checkpoint's index time advanced.
    #: Between two, a crash costs only a longer re-dispatch of the commit log at restart (keys are
    #: rebuilt from it); each flush writes back every slot page the keys touched, randomly spread,
    #: which every second cost ~6 % of a loaded broker's CPU.  RocketMQ flushes an index file only
    #: when it is full.
    index_flush_interval_ms: int = attrs.field(default=10_000, validator=_positive)
    #: Offer the compiled request lane for SEND_MESSAGE(_V2) and SEND_BATCH_MESSAGE (issue 38): a
    #: read's plain sends are prepared in one compiled call; anything else (send hooks, delay,
    #: timer, transaction, a retry topic...) is the Python handler's.  Also the PULL_MESSAGE lane:
    #: a pull that finds records is walked and answered without an object per message (consume
    #: hooks, SQL92, a pull that waits... are the Python handler's).  Off: the Python handlers
    #: serve every send and pull, for comparison.  ``TIDEMQ_NO_EXTENSIONS=1`` turns it off too.
    request_lanes: bool = True
