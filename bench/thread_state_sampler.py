"""Sample one thread's state (and its kernel stack while in disk sleep) from /proc, from outside.

    python bench/thread_state_sampler.py PID TID SECONDS

Used by ``sync_round_trace.py --sampler``: a thread stalled in the kernel (a page fault inside a
copy) may hold the GIL, so only another process can see where it waits.  Prints the count of
samples per state (R running or runnable, S sleeping, D disk sleep) and the most frequent kernel
stacks seen in D.  Needs read access to /proc/PID/task/TID/stack (root).
"""

from __future__ import annotations

import collections
import sys
import time


def main() -> None:
    pid, tid, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    base = f"/proc/{pid}/task/{tid}"
    counts: collections.Counter[str] = collections.Counter()
    states: collections.Counter[str] = collections.Counter()
    end = time.time() + secs
    n = 0
    while time.time() < end:
        try:
            with open(base + "/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
            states[st] += 1
            if st == "D":
                with open(base + "/stack") as f:
                    frames = f.read().split("\n")[:8]
                counts[" < ".join(x.split("]", 1)[1].split("+")[0].strip() for x in frames if "]" in x)] += 1
        except OSError:
            break
        n += 1
        time.sleep(0.0005)
    print("samples", n, dict(states))
    for k, v in counts.most_common(8):
        print(v, k)


if __name__ == "__main__":
    main()
