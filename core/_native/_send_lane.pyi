"""Types of core/_native/_send_lane.pyx (the send lane's prepare step, issue 38)."""

from collections.abc import Callable

from tidemq.broker.services.put import Send
from tidemq.message_types import HostPort
from tidemq.remoting.command import RemotingCommand

def lane_counts() -> tuple[int, int]: ...
def uses_direct_objects() -> dict[str, bool]: ...
def send_recipe(cls: type) -> list[tuple[str, tuple[object, ...]]] | None: ...
def prepare_sends(
    requests: list[RemotingCommand],
    writable_queues: Callable[[str], int],
    cluster: str,
    max_batch: int,
    born_host: HostPort,
    store_host: HostPort,
) -> list[Send] | None: ...
def prepare_frames(
    frames: list[tuple[object, ...]],
    writable_queues: Callable[[str], int],
    cluster: str,
    max_batch: int,
    born_host: HostPort,
    store_host: HostPort,
) -> list[Send] | None: ...
def settle_sends(
    broker: object,
    sends: list[Send],
    done: list[bool],
    put_outcome: Callable[..., object],
    fill: Callable[..., None],
) -> None: ...
def put_sends(service: object, sends: list[Send]) -> None: ...
