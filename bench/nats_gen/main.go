// nats_gen: the JetStream publish generator of bench/compare.py, in Go with the nats.go client.
//
// compare_load.py (Python) could not drive nats-server as hard as redis-benchmark (C) drives
// Redis, so NATS's produce figures were generator-bound.  This speaks the same line protocol as
// compare_load.py: a JSON spec on stdin, "ready", wait for "go", run, write the JSON result to
// spec.out, print "done".  Built at bench time from Debian's golang-go and
// golang-github-nats-io-go-nats-dev (GOPATH mode); nothing is downloaded.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

type spec struct {
	Addr     string  `json:"addr"`
	Op       string  `json:"op"`
	Size     int     `json:"size"`
	Subject  string  `json:"subject"`
	Batch    int     `json:"batch"`
	Requests int     `json:"requests"`
	Inflight int     `json:"inflight"`
	WindowS  float64 `json:"window_s"`
	Out      string  `json:"out"`
}

var logStep = math.Log(1.02)

// bucket matches compare_load.bucket: 2 %-wide log buckets of microseconds.
func bucket(d time.Duration) int {
	us := float64(d.Nanoseconds()) / 1e3
	if us <= 1.0 {
		return 0
	}
	return int(math.Log(us) / logStep)
}

type recorder struct {
	mu        sync.Mutex
	start     time.Time
	window    float64
	ok        int
	errors    int
	bytes     int
	hist      map[string]map[string]int
	lastError string
}

func (r *recorder) done(err error, latency time.Duration, messages, size int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.errors += messages
		r.lastError = err.Error()
		return
	}
	r.ok += messages
	r.bytes += messages * size
	w := strconv.Itoa(int(time.Since(r.start).Seconds() / r.window))
	h, found := r.hist[w]
	if !found {
		h = map[string]int{}
		r.hist[w] = h
	}
	h[strconv.Itoa(bucket(latency))]++
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "nats_gen: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil {
		fail("no spec on stdin: %v", err)
	}
	var s spec
	if err := json.Unmarshal(line, &s); err != nil {
		fail("bad spec: %v", err)
	}
	if s.Op != "produce" {
		fail("only op=produce is supported, not %q", s.Op)
	}
	if s.Batch < 1 {
		s.Batch = 1
	}
	if s.WindowS <= 0 {
		s.WindowS = 1e9
	}
	nc, err := nats.Connect("nats://" + s.Addr)
	if err != nil {
		fail("connect %s: %v", s.Addr, err)
	}
	js, err := nc.JetStream(nats.PublishAsyncMaxPending(s.Inflight * s.Batch * 2))
	if err != nil {
		fail("jetstream: %v", err)
	}
	payload := make([]byte, s.Size)
	for i := range payload {
		payload[i] = 'x'
	}
	fmt.Println("ready")
	if _, err := in.ReadBytes('\n'); err != nil {
		fail("no go: %v", err)
	}
	rec := &recorder{start: time.Now(), window: s.WindowS, hist: map[string]map[string]int{}}
	t0 := float64(time.Now().UnixNano()) / 1e9
	cpu0 := cpuSeconds()
	sem := make(chan struct{}, s.Inflight)
	var wg sync.WaitGroup
	for i := 0; i < s.Requests; i++ {
		sem <- struct{}{}
		sent := time.Now()
		futures := make([]nats.PubAckFuture, 0, s.Batch)
		var perr error
		for j := 0; j < s.Batch; j++ {
			f, err := js.PublishAsync(s.Subject, payload)
			if err != nil {
				perr = err
				break
			}
			futures = append(futures, f)
		}
		wg.Add(1)
		// A request is answered when every message of it is acknowledged, as in compare_load.
		go func(futures []nats.PubAckFuture, sent time.Time, perr error) {
			defer wg.Done()
			defer func() { <-sem }()
			err := perr
			for _, f := range futures {
				select {
				case <-f.Ok():
				case e := <-f.Err():
					err = e
				case <-time.After(30 * time.Second):
					err = fmt.Errorf("no publish ack in 30 s")
				}
			}
			rec.done(err, time.Since(sent), s.Batch, s.Size)
		}(futures, sent, perr)
	}
	wg.Wait()
	t1 := float64(time.Now().UnixNano()) / 1e9
	cpu := cpuSeconds() - cpu0
	nc.Close()
	out, _ := json.Marshal(map[string]interface{}{
		"ok": rec.ok, "errors": rec.errors, "bytes": rec.bytes, "t0": t0, "t1": t1, "cpu": cpu,
		"skipped": 0, "last_error": rec.lastError, "hist": rec.hist,
	})
	if err := os.WriteFile(s.Out, out, 0o644); err != nil {
		fail("write %s: %v", s.Out, err)
	}
	fmt.Println("done")
}
