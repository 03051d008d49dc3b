"""Master election through a real etcd (issue 25): one winner, epochs, the lag bound, fencing.

etcd runs as a subprocess on loopback free ports (Debian package ``etcd-server``); the tests skip
with a line naming it when the binary is missing.  Partitions from etcd go through a TCP proxy in
the test that stops forwarding (a black hole, not a refused connection: requests hang, as with a
cut network).  Timing: lease TTL 2 s (etcd's minimum), renewal every 0.4 s, fencing margin 0.6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from conftest import free_port
from controller_support import EtcdServer, etcd_fixture  # noqa: F401  (the etcd fixture)

pytest.importorskip(
    "httpx", reason="httpx is not installed (the controller extra: pip install tidemq[controller])"
)

from tidemq_controller.election import (  # noqa: E402
    Election,
    ElectionConfig,
    FenceReason,
    MasterState,
    Member,
)
from tidemq_controller.etcd import ControllerError, EtcdClient  # noqa: E402
from tidemq_controller.status import cluster_status  # noqa: E402

CONFIG = ElectionConfig(
    ttl=2, keepalive_interval=0.4, fence_margin=0.6, max_lag_bytes=1000, request_timeout=0.3
)


class BlackHoleProxy:
    """A TCP proxy to etcd that can be cut (connections stay open, nothing gets through) and healed."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.cut:
            return  # accepted, never answered
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if not self.cut:
                    dst.write(data)
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    def heal(self) -> None:
        """Forward again; the connections that lost data are closed so clients open new ones."""
        self.cut = False
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def close(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.close()


_group_counter = iter(range(1_000_000))


def group() -> str:
    return f"g{next(_group_counter)}-{os.getpid()}"


async def _replica(
    url: str, name: str, broker_id: int, config: ElectionConfig = CONFIG, **callbacks
) -> Election:
    election = Election(
        EtcdClient([url], timeout=config.request_timeout),
        "c",
        name,
        Member(broker_id, f"127.0.0.1:{10911 + broker_id}", f"127.0.0.1:{10912 + broker_id}"),
        config,
        **callbacks,
    )
    await election.start()
    return election


async def _close(*elections: Election) -> None:
    for election in elections:
        await election.close()
        await election.client.close()


async def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def _collect(observer: AsyncIterator[MasterState], into: list[tuple[float, MasterState]]) -> None:
    async for state in observer:
        into.append((asyncio.get_running_loop().time(), state))


def test_the_client_moves_past_a_dead_endpoint_and_names_every_endpoint_when_all_fail(
    etcd: EtcdServer,
) -> None:
    async def main() -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        client = EtcdClient([dead, etcd.url], timeout=0.5)
        try:
            await client.put(b"/tidemq-test/k", b"v")
            kvs, revision = await client.get(b"/tidemq-test/", prefix=True)
            assert [kv.value for kv in kvs] == [b"v"] and revision > 0
        finally:
            await client.close()
        client = EtcdClient([dead, f"http://127.0.0.1:{free_port()}"], timeout=0.5)
        try:
            with pytest.raises(ControllerError) as failed:
                await client.get(b"/tidemq-test/")
            assert str(failed.value).startswith("etcd unreachable (") and dead in str(failed.value)
        finally:
            await client.close()

    asyncio.run(main())
    with pytest.raises(ValueError, match="keepalive interval 1.5: must be below ttl - fence margin"):
        ElectionConfig(ttl=2, keepalive_interval=1.5, fence_margin=0.6)
    with pytest.raises(ValueError, match="expected http://host:port"):
        EtcdClient(["127.0.0.1:2379"])


def test_a_quiet_watch_reopens_without_losing_or_repeating_changes(etcd: EtcdServer) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url], timeout=0.5)
        seen: list[tuple[str, bytes]] = []

        async def follow() -> None:
            async for event in client.watch(
                b"/tidemq-watch/", prefix=True, retry_delay=0.05, idle_timeout=0.2
            ):
                seen.append((event.type, event.kv.value))

        task = asyncio.get_running_loop().create_task(follow())
        try:
            await asyncio.sleep(0.3)
            await client.put(b"/tidemq-watch/a", b"1")
            await asyncio.sleep(0.8)  # several idle re-opens, each resuming after revision of "1"
            await client.put(b"/tidemq-watch/a", b"2")
            await client.delete(b"/tidemq-watch/a")
            await _wait(lambda: len(seen) >= 3, timeout=3)
            await asyncio.sleep(0.3)
            assert seen == [("PUT", b"1"), ("PUT", b"2"), ("DELETE", b"")]
        finally:
            task.cancel()
            await client.close()

    asyncio.run(main())


def test_concurrent_campaigns_have_one_winner_and_each_election_adds_one_epoch(etcd: EtcdServer) -> None:
    async def main() -> None:
        name = group()
        replicas = [await _replica(etcd.url, name, i) for i in range(4)]
        try:
            winners = []
            for round_ in range(1, 4):
                results = await asyncio.gather(*(r.campaign(0) for r in replicas))
                won = [(r, res) for r, res in zip(replicas, results, strict=True) if res.won]
                assert len(won) == 1, results
                winner, result = won[0]
                assert result.epoch == round_  # exactly one more than the previous election
                assert winner.is_master and sum(r.is_master for r in replicas) == 1
                state = await replicas[0].state()
                assert state.master is not None and state.master.broker_id == winner.me.broker_id
                assert state.epoch == round_
                losers = [res for res in results if not res.won]
                assert all(res.epoch in (round_ - 1, round_) for res in losers)
                # The master exists: nobody else can win until it resigns.
                again = await asyncio.gather(*(r.campaign(0) for r in replicas if r is not winner))
                assert not any(res.won for res in again)
                await winner.resign()
                assert not winner.is_master
                winners.append(winner.me.broker_id)
            assert [m.broker_id for m in await replicas[0].members()] == [0, 1, 2, 3]
        finally:
            await _close(*replicas)

    asyncio.run(main())


def test_a_candidate_beyond_the_lag_bound_cannot_win(etcd: EtcdServer) -> None:
    async def main() -> None:
        name = group()
        a, b, c = [await _replica(etcd.url, name, i) for i in range(3)]
        try:
            assert (await a.campaign(0)).won
            await a.report(10_000)  # the master's acknowledged offset
            assert await b.confirmed_offset() == 10_000
            await b.client.revoke(a.lease)  # the master's lease ends (as after a crash, but at once)
            behind = await b.campaign(8_999)
            assert not behind.won and "1001 bytes behind the confirmed 10000" in behind.reason
            assert not b.is_master
            caught_up = await c.campaign(9_000)  # exactly max_lag_bytes behind: in the synchronous set
            assert caught_up.won and caught_up.epoch == 2
            await b.report(7_999)
            groups = await cluster_status(b.client, "c", max_lag_bytes=CONFIG.max_lag_bytes)
            (status,) = [g for g in groups if g.broker_name == name]  # other tests' groups share etcd
            assert (status.broker_name, status.epoch, status.confirmed) == (name, 2, 9_000)
            assert status.master is not None and status.master.broker_id == 2
            lags = {m.member.broker_id: (m.lag, m.in_sync, m.master) for m in status.members}
            assert lags[1] == (1_001, False, False) and lags[2] == (0, True, True)
            assert 1 not in status.sync_set and 2 in status.sync_set
            # A deposed master's late report cannot move the bound the next election checks.
            with contextlib.suppress(ControllerError):  # its lease may be known gone already
                await a.report(50_000)
            assert not a.is_master
            assert await c.confirmed_offset() == 9_000
        finally:
            await _close(a, b, c)

    asyncio.run(main())


def test_a_master_cut_off_from_etcd_is_fenced_before_its_lease_can_expire(etcd: EtcdServer) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        proxy = BlackHoleProxy(etcd.client_port)
        await proxy.start()
        name = group()
        fenced: list[tuple[float, FenceReason]] = []
        resumed: list[int] = []
        a = await _replica(
            proxy.url, name, 0, on_fenced=lambda r: fenced.append((loop.time(), r)), on_resumed=resumed.append
        )
        b = await _replica(etcd.url, name, 1)
        states: list[tuple[float, MasterState]] = []
        watcher = loop.create_task(_collect(b.observe(), states))
        try:
            assert (await a.campaign(0)).won
            await _wait(lambda: bool(states) and states[-1][1].master is not None)
            proxy.cut = True
            cut_at = loop.time()
            await _wait(lambda: bool(states) and states[-1][1].master is None, timeout=8)
            gone_at = states[-1][0]  # etcd expired the lease and deleted the leader key
            assert fenced and fenced[0][1] is FenceReason.ETCD_UNREACHABLE
            fenced_at = fenced[0][0]
            # The fence came at the last renewal + ttl - margin: before etcd could expire the lease.
            assert fenced_at < gone_at, (fenced_at - cut_at, gone_at - cut_at)
            assert fenced_at - cut_at <= CONFIG.ttl - CONFIG.fence_margin + 0.3
            assert not a.is_master
            won = await b.campaign(0)
            assert won.won and won.epoch == 2
            await _wait(lambda: states[-1][1].master is not None and states[-1][1].epoch == 2)
            proxy.heal()
            # Back in touch: its lease is gone, so it stays deposed and registers again.
            await _wait(lambda: a.lease != 0 and not a.is_master)
            deadline = loop.time() + 3 * CONFIG.keepalive_interval + CONFIG.request_timeout
            while loop.time() < deadline and 0 not in [m.broker_id for m in await b.members()]:
                await asyncio.sleep(0.1)
            assert 0 in [m.broker_id for m in await b.members()]
            assert not a.is_master and resumed == [] and len(fenced) == 1
            state = await b.state()
            assert state.master is not None and state.master.broker_id == 1 and state.epoch == 2
        finally:
            watcher.cancel()
            await _close(a, b)
            await proxy.close()

    asyncio.run(main())


def test_a_revoked_lease_fences_the_master_and_the_next_candidate_wins(etcd: EtcdServer) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        name = group()
        fenced: list[tuple[float, FenceReason]] = []
        a = await _replica(etcd.url, name, 0, on_fenced=lambda r: fenced.append((loop.time(), r)))
        b = await _replica(etcd.url, name, 1)
        try:
            assert (await a.campaign(0)).won
            revoked_at = loop.time()
            await b.client.revoke(a.lease)  # an operator, or etcd expiring it
            await _wait(lambda: bool(fenced), timeout=3)
            assert fenced[0][1] is FenceReason.LEASE_LOST
            assert fenced[0][0] - revoked_at <= CONFIG.keepalive_interval + CONFIG.request_timeout + 0.2
            won = await b.campaign(0)
            assert won.won and won.epoch == 2
            # The old master re-registered under a new lease, as a candidate, never as master.
            await _wait(lambda: a.lease != 0)
            assert not a.is_master and not (await a.campaign(0)).won
        finally:
            await _close(a, b)

    asyncio.run(main())


# keep_serving_without_etcd = "never": under -m slow for the default suite's time budget; the
# default run keeps the in_sync mode's etcd-cut test above.
@pytest.mark.slow
def test_without_etcd_no_election_happens_and_the_master_resumes_when_it_returns(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path)
    server.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        name = group()
        fenced: list[tuple[float, FenceReason]] = []
        resumed: list[int] = []
        a = await _replica(
            server.url,
            name,
            0,
            on_fenced=lambda r: fenced.append((loop.time(), r)),
            on_resumed=resumed.append,
        )
        b = await _replica(server.url, name, 1)
        states: list[tuple[float, MasterState]] = []
        watcher = loop.create_task(_collect(b.observe(), states))
        try:
            assert (await a.campaign(0)).won
            await _wait(lambda: bool(states) and states[-1][1].epoch == 1)
            stopped_at = loop.time()
            await loop.run_in_executor(None, server.stop)
            # The master cannot tell an etcd outage from a partition: it stops acknowledging.
            await _wait(lambda: bool(fenced), timeout=3)
            assert fenced[0][1] is FenceReason.ETCD_UNREACHABLE
            assert fenced[0][0] - stopped_at <= CONFIG.ttl - CONFIG.fence_margin + 0.3
            with pytest.raises(ControllerError, match="etcd unreachable"):
                await b.campaign(0)  # no quorum, no election
            await loop.run_in_executor(None, server.start)
            # etcd renews every lease when it comes back: the master's key is still its own.
            await _wait(lambda: resumed == [1], timeout=5)
            assert a.is_master and (await b.state()).epoch == 1
            await a.resign()
            won = await b.campaign(0)
            assert won.won and won.epoch == 2
            # The watch reopened across the restart and saw the new master.
            await _wait(lambda: states[-1][1].master is not None and states[-1][1].master.broker_id == 1)
            assert states[-1][1].epoch == 2
        finally:
            watcher.cancel()
            await _close(a, b)

    try:
        asyncio.run(main())
    finally:
        server.stop()


SYNC = attrs.evolve(CONFIG, sync_set=True)


def test_only_a_member_of_the_in_sync_set_wins_and_the_old_master_leaves_the_set(etcd: EtcdServer) -> None:
    async def main() -> None:
        name = group()
        a, b, c = [await _replica(etcd.url, name, i, config=SYNC) for i in range(3)]
        try:
            first = await a.campaign(0)
            assert first.won and first.sync_set == (0,)  # the first master starts alone
            assert await a.update_sync_set((0, 1))  # broker 1 caught up; broker 2 did not
            await b.report(5_000, confirm=False)
            await c.client.revoke(a.lease)  # the master dies
            outsider = await c.campaign(10**9)  # even far ahead: not in the set, not electable
            assert not outsider.won and "not in the in-sync set [0, 1]" in outsider.reason
            won = await b.campaign(5_000)
            assert won.won and won.epoch == 2 and won.sync_set == (1,)
            (status,) = [g for g in await cluster_status(b.client, "c") if g.broker_name == name]
            assert (
                status.sync_set == (1,) and status.in_sync_set is not None and status.in_sync_set.epoch == 2
            )
            # The deposed master cannot change the set any more (and learns it is deposed).
            assert not await a.update_sync_set((0, 1, 2))
            assert (await b.sync_set()).brokers == (1,)  # type: ignore[union-attr]
        finally:
            await _close(a, b, c)

    asyncio.run(main())


def test_a_sync_master_cut_off_from_etcd_serves_on_until_etcd_says_it_was_deposed(etcd: EtcdServer) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        proxy = BlackHoleProxy(etcd.client_port)
        await proxy.start()
        name = group()
        fenced: list[FenceReason] = []
        serving = attrs.evolve(SYNC, keep_serving=True)
        a = await _replica(proxy.url, name, 0, config=serving, on_fenced=fenced.append)
        b = await _replica(etcd.url, name, 1, config=serving)
        try:
            assert (await a.campaign(0)).won and await a.update_sync_set((0, 1))
            proxy.cut = True
            cut_at = loop.time()
            # Past the fencing deadline and the lease itself: still master (its set keeps it honest).
            while loop.time() - cut_at < CONFIG.ttl + 0.5:
                await asyncio.sleep(0.1)
            assert a.is_master and a.etcd_unconfirmed and fenced == []
            with pytest.raises(ControllerError):
                await a.update_sync_set((0,))  # the set cannot shrink without etcd
            won = await b.campaign(0)  # a's lease expired: b, a member, may win
            assert won.won and won.sync_set == (1,)
            proxy.heal()
            await _wait(lambda: bool(fenced), timeout=5)  # etcd's answer: the leader key is not ours
            assert fenced == [FenceReason.LEASE_LOST] and not a.is_master
        finally:
            await _close(a, b)
            await proxy.close()

    asyncio.run(main())


@pytest.mark.slow
def test_twenty_failovers_never_have_two_masters_at_once(etcd: EtcdServer) -> None:
    """Each round cuts the master off from etcd; the others campaign as soon as they see no master.

    A sampler checks every 5 ms that at most one replica holds ``is_master`` (the fencing
    deadline against etcd's expiry), and each round's winner has exactly the next epoch.
    """

    async def main() -> None:
        loop = asyncio.get_running_loop()
        name = group()
        proxies = [BlackHoleProxy(etcd.client_port) for _ in range(3)]
        for proxy in proxies:
            await proxy.start()
        replicas = [await _replica(proxy.url, name, i) for i, proxy in enumerate(proxies)]
        overlaps: list[float] = []
        times: list[float] = []

        async def sample() -> None:
            while True:
                if sum(r.is_master for r in replicas) > 1:
                    overlaps.append(loop.time())
                await asyncio.sleep(0.005)

        async def candidate(replica: Election) -> None:
            while True:
                try:
                    async for state in replica.observe():
                        if state.master is None:
                            await replica.campaign(replica.me.offset)
                except ControllerError:
                    await asyncio.sleep(0.2)  # cut off: try again once healed

        tasks = [loop.create_task(sample())] + [loop.create_task(candidate(r)) for r in replicas]
        try:
            await _wait(lambda: sum(r.is_master for r in replicas) == 1)
            for _ in range(20):
                master = next(r for r in replicas if r.is_master)
                epoch = master.epoch
                index = replicas.index(master)
                cut_at = loop.time()
                proxies[index].cut = True
                await _wait(lambda: any(r.is_master and r.epoch == epoch + 1 for r in replicas), timeout=10)  # noqa: B023
                times.append(loop.time() - cut_at)
                assert not master.is_master
                proxies[index].heal()
            assert not overlaps, f"two masters at loop times {overlaps[:5]}"
            assert max(r.epoch for r in replicas) == 21
        finally:
            for task in tasks:
                task.cancel()
            await _close(*replicas)
            for proxy in proxies:
                await proxy.close()
        print(
            f"failover times (s): min {min(times):.2f} max {max(times):.2f} mean {sum(times) / len(times):.2f}"
        )

    asyncio.run(main())


@pytest.mark.slow
def test_a_three_member_etcd_elects_with_a_quorum_and_never_without(tmp_path: Path) -> None:
    """One etcd member down: the clients move on, the master stays; two down: no quorum, no
    election, the master is fenced; a member back: the master resumes on its epoch."""
    members = [EtcdServer(tmp_path / name, name) for name in ("m0", "m1", "m2")]
    for member in members:
        member.directory.mkdir()
        member.initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
        member.launch()
    config = ElectionConfig(ttl=6, keepalive_interval=0.5, fence_margin=2.0, request_timeout=0.5)
    urls = [m.url for m in members]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        fenced: list[tuple[float, FenceReason]] = []
        resumed: list[int] = []
        replicas = []
        for broker_id in (0, 1):
            election = Election(
                EtcdClient(urls, timeout=config.request_timeout),
                "c",
                "quorum",
                Member(broker_id, f"127.0.0.1:{10911 + broker_id}"),
                config,
                on_fenced=(lambda r: fenced.append((loop.time(), r))) if broker_id == 0 else None,
                on_resumed=resumed.append if broker_id == 0 else None,
            )
            await election.start()
            replicas.append(election)
        a, b = replicas
        try:
            assert (await a.campaign(0)).won
            await loop.run_in_executor(None, members[0].stop)  # the endpoint both clients used
            await asyncio.sleep(config.ttl)  # a raft leader election may happen meanwhile
            assert fenced == [] and a.is_master  # two of three: renewals go on through m1
            assert not (await b.campaign(0)).won  # and the master is still known to be there
            await loop.run_in_executor(None, members[1].stop)  # one of three: no quorum
            stopped_at = loop.time()
            await _wait(lambda: bool(fenced), timeout=config.ttl)
            assert fenced[0][1] is FenceReason.ETCD_UNREACHABLE
            # ttl - margin after the last renewal, and the member left alone (leader, or made leader
            # by m1's shutdown) still renews leases (no raft round) until it notices it lost its
            # quorum and steps down: measured 1.0-1.5 s.
            assert fenced[0][0] - stopped_at <= config.ttl + 1.0
            with pytest.raises(ControllerError):
                await b.campaign(0)  # m2 alone cannot commit anything
            await loop.run_in_executor(None, members[0].start)  # quorum again
            await _wait(lambda: resumed == [1], timeout=15)
            assert a.is_master
            await a.resign()
            won = await b.campaign(0)
            assert won.won and won.epoch == 2
        finally:
            await _close(a, b)

    try:
        for member in members:
            member.wait_healthy()
        asyncio.run(main())
    finally:
        for member in members:
            member.stop()
