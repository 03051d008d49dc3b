"""The etcd records of controller mode: a member's registration, the group's master state, the
in-sync set and a campaign's result, with their JSON forms (:mod:`.election` writes and reads them,
:mod:`.status` reads them)."""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from tidemq_controller.etcd import ControllerError, KeyValue

__all__ = ["CampaignResult", "MasterState", "Member", "SyncSet", "group_prefix"]


def group_prefix(cluster: str, broker_name: str) -> bytes:
    """The etcd prefix of one broker group."""
    for label, name in (("cluster", cluster), ("broker name", broker_name)):
        if not name or "/" in name:
            raise ValueError(f"{label} {name!r}: must be non-empty and contain no '/'")
    return f"/tidemq/{cluster}/{broker_name}/".encode()


@attrs.frozen
class Member:
    """One replica's registration."""

    broker_id: int
    addr: str
    ha_addr: str = ""
    offset: int = 0
    epoch: int = 0

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "brokerId": self.broker_id,
                "addr": self.addr,
                "haAddr": self.ha_addr,
                "offset": self.offset,
                "epoch": self.epoch,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Member:
        raw = _fields(data, cls)
        try:
            return cls(
                int(raw["brokerId"]),
                str(raw["addr"]),
                str(raw.get("haAddr", "")),
                int(raw.get("offset", 0)),
                int(raw.get("epoch", 0)),
            )
        except (KeyError, TypeError, ValueError):
            raise ControllerError(f"unreadable member record in etcd: {data[:200]!r}") from None


@attrs.frozen
class MasterState:
    """The group's master (None: no master right now) and the latest epoch."""

    master: Member | None
    epoch: int


@attrs.frozen
class SyncSet:
    """The in-sync replica set written by the master of ``epoch`` (broker ids, master included)."""

    epoch: int
    brokers: tuple[int, ...]

    def to_json(self) -> bytes:
        return orjson.dumps({"epoch": self.epoch, "brokers": list(self.brokers)})

    @classmethod
    def from_kv(cls, kv: KeyValue | None) -> SyncSet | None:
        if kv is None:
            return None
        raw = _record(kv)
        try:
            brokers = raw["brokers"]
            if not isinstance(brokers, list) or not all(isinstance(b, int) for b in brokers):
                raise TypeError
            return cls(int(raw["epoch"]), tuple(sorted(set(brokers))))
        except (KeyError, TypeError, ValueError):
            raise ControllerError(f"unreadable in-sync set in etcd: {kv.value[:200]!r}") from None


@attrs.frozen
class CampaignResult:
    """Whether the campaign won, the epoch it won (or the current one), and why it lost.

    ``sync_set``: the in-sync set the winner starts with (SYNC groups; empty otherwise).
    """

    won: bool
    epoch: int
    reason: str = ""
    sync_set: tuple[int, ...] = ()


def _fields(data: bytes, cls: type) -> dict[str, Any]:
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ControllerError(f"unreadable {cls.__name__} record in etcd: {exc}") from None
    if not isinstance(raw, dict):
        raise ControllerError(f"unreadable {cls.__name__} record in etcd: {raw!r:.100}")
    return raw


def _record(kv: KeyValue | None) -> dict[str, Any]:
    if kv is None:
        return {}
    try:
        raw = orjson.loads(kv.value)
    except orjson.JSONDecodeError:
        raise ControllerError(f"unreadable record {kv.key.decode(errors='replace')} in etcd") from None
    return raw if isinstance(raw, dict) else {}
