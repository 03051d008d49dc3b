"""The crash-consistency driver: load with acknowledgements, SIGKILL the broker, restart, check."""

from __future__ import annotations

import logging
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from tidemq_store_mmap.verify import verify_store

from .checker import Ack, CheckResult, check, parse_acks, read_topic
from .cluster import LOADGEN, Cluster

log = logging.getLogger(__name__)
TOPIC = "CrashTopic"


@attrs.define
class CrashRun:
    """What N kill-and-restart rounds did and what the final check found."""

    flush: str
    transient: bool
    rounds: int = 0
    kills: int = 0
    acked: int = 0
    check: CheckResult = attrs.field(factory=CheckResult)
    #: per lost ack: how long before the kill it was acknowledged (ms)
    lost_age_ms: list[int] = attrs.field(factory=list)
    torn_tails: int = 0  # rounds whose crashed log ended in a torn record
    repairable_after_crash: int = 0  # findings recovery fixed (queue entries past the end...)
    verify_errors_after_crash: int = 0
    verify_final: dict[str, Any] = attrs.field(factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "flush": self.flush,
            "transient_store_pool": self.transient,
            "rounds": self.rounds,
            "sigkills": self.kills,
            "acknowledged": self.acked,
            **{f"check_{k}": v for k, v in self.check.to_dict().items()},
            "max_lost_age_ms": max(self.lost_age_ms, default=0),
            "torn_tails": self.torn_tails,
            "repairable_after_crash": self.repairable_after_crash,
            "verify_errors_after_crash": self.verify_errors_after_crash,
            "final_verify_ok": self.verify_final.get("ok"),
            "final_records": self.verify_final.get("records"),
            "seconds": round(self.seconds, 1),
        }


def _wait_for_acks(path: Path, proc: subprocess.Popen[bytes], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\nACK ") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"load generator made fewer than {n} acks in {timeout}s: {path.read_text()[-500:]}")


def run_crash_rounds(
    root: Path, rounds: int, *, flush: str, transient: bool = False, seed: int = 0, concurrency: int = 8
) -> CrashRun:
    """``rounds`` times: start the broker, load it, SIGKILL it at a random moment; then check all."""
    rng = random.Random(seed)
    run = CrashRun(flush, transient)
    started = time.monotonic()
    cluster = Cluster(root, flush=flush, transient=transient)
    acks: list[tuple[int, Ack]] = []  # (kill time ms, ack)
    try:
        for rnd in range(rounds):
            cluster.start_broker()
            out_path = root / f"acks-{rnd}.txt"
            with open(out_path, "wb") as out, open(root / f"loadgen-{rnd}.err", "wb") as err:
                lg = subprocess.Popen(
                    [
                        sys.executable,
                        str(LOADGEN),
                        "--namesrv",
                        cluster.namesrv.address,
                        "--topic",
                        TOPIC,
                        "--round",
                        str(rnd),
                        "--concurrency",
                        str(concurrency),
                    ],
                    stdout=out,
                    stderr=err,
                )
                try:
                    _wait_for_acks(out_path, lg, 20, 30)
                    # A random moment: the kill lands anywhere in appends, file rolls, flushes.
                    time.sleep(rng.uniform(0.05, 1.5))
                    cluster.kill_broker()
                    killed_at = time.time_ns() // 1_000_000
                    run.kills += 1
                    time.sleep(0.2)  # responses in flight when it died are not acks
                finally:
                    lg.kill()
                    lg.wait()
            round_acks = parse_acks(out_path.read_bytes())
            acks.extend((killed_at, a) for a in round_acks)
            run.rounds += 1
            crashed = verify_store(cluster.data_dir, strict=False)
            run.verify_errors_after_crash += crashed.error_count
            run.repairable_after_crash += crashed.repairable_count
            run.torn_tails += 1 if crashed.torn_tail_bytes else 0
            if crashed.error_count:
                log.error("round %d: verifier errors after the crash: %s", rnd, crashed.errors[:5])
            log.info("round %d: %d acks, killed; verifier %s", rnd, len(round_acks), crashed.to_dict())
        # Recover once more and read everything back through a real client.
        cluster.start_broker()
        served = read_topic(cluster.namesrv.address, TOPIC)
        run.check = check([a for _, a in acks], served)
        for killed_at, a in acks:
            s = served.get((a.queue_id, a.queue_offset))
            if s is None or (s.msg_id, s.digest) != (a.msg_id, a.digest):
                run.lost_age_ms.append(killed_at - a.at_ms)
        run.acked = len(acks)
        cluster.stop_broker()
        run.verify_final = verify_store(cluster.data_dir, strict=True).to_dict()
    finally:
        cluster.close()
    run.seconds = time.monotonic() - started
    return run
