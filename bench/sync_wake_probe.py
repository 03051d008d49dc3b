"""How long a sleeping thread takes to wake on this machine (syncp50, session 12): the flush worker's
wake-up (a condition variable signalled under its mutex, as ``_round.pyx``'s ``post`` did, or after
it, as it does now) and the loop's (an eventfd it polls, as the worker's completion).

    python bench/sync_wake_probe.py [--runs 2]

Compiles a small C probe with ``cc`` (no Python in the timed path): one thread signals every
400 µs (the waiter asleep again, as between rounds at 2 000 msg/s), the other records when it
woke; prints the p50 / p90 / p99 of each way, in µs, as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

SOURCE = r"""
// One-way wake latency: thread A records t0 and signals; thread B (sleeping in cond_wait or read(eventfd))
// records t1 on wake. Reports p50/p90/p99 of t1-t0 for condvar, eventfd(+poll), and a spin baseline.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <poll.h>
static inline int64_t now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}
#define N 3000
static pthread_mutex_t mu=PTHREAD_MUTEX_INITIALIZER; static pthread_cond_t cv=PTHREAD_COND_INITIALIZER;
static volatile int64_t t0; static int flag; static int64_t lat[N]; static int efd; static int mode; static volatile int done_i;
static void* waiter(void*a){
  for(int i=0;i<N;i++){
    if(mode==0||mode==2||mode==3){pthread_mutex_lock(&mu);while(!flag)pthread_cond_wait(&cv,&mu);flag=0;int64_t t=now();pthread_mutex_unlock(&mu);lat[i]=t-t0;}
    else {struct pollfd p={efd,POLLIN,0};poll(&p,1,-1);uint64_t v;read(efd,&v,8);lat[i]=now()-t0;}
    __atomic_store_n(&done_i,i+1,__ATOMIC_SEQ_CST);
  }
  return 0;}
static int cmp(const void*a,const void*b){int64_t x=*(int64_t*)a,y=*(int64_t*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  efd=eventfd(0,0);
  for(mode=0;mode<4;mode++){
    done_i=0;pthread_t th;pthread_create(&th,0,waiter,0);
    for(int i=0;i<N;i++){
      usleep(400); // the waiter is asleep again (as between rounds at 2000/s)
      t0=now();
      if(mode==0||mode==2){pthread_mutex_lock(&mu);flag=1;pthread_cond_signal(&cv);pthread_mutex_unlock(&mu);} else if(mode==3){pthread_mutex_lock(&mu);flag=1;pthread_mutex_unlock(&mu);pthread_cond_signal(&cv);}
      else {uint64_t one=1;write(efd,&one,8);}
      while(__atomic_load_n(&done_i,__ATOMIC_SEQ_CST)<i+1) usleep(50);
    }
    pthread_join(th,0);
    qsort(lat,N,8,cmp);
    printf("%s wake us p50 %.1f p90 %.1f p99 %.1f\n",mode==1?"eventfd+poll":mode==3?"condvar signal after unlock":mode==2?"condvar signal under mutex again":"condvar signal under mutex",lat[N/2]/1e3,lat[N*9/10]/1e3,lat[N*99/100]/1e3);
  }
}
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c, exe = Path(tmp) / "wake.c", Path(tmp) / "wake"
        c.write_text(SOURCE)
        subprocess.run(["cc", "-O2", "-o", str(exe), str(c), "-lpthread"], check=True)
        rows = []
        for _ in range(args.runs):
            out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                name, _, rest = line.partition(" wake us ")
                f = rest.split()
                rows.append({"way": name, "p50": float(f[1]), "p90": float(f[3]), "p99": float(f[5])})
    print(json.dumps({"wake_us": rows}, indent=2))


if __name__ == "__main__":
    main()
