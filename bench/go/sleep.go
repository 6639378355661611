// bench_latency's twin: how late time.Sleep returns, on an idle runtime and on one whose
// Ps are all busy.
package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

var sleepSink uint64

// sleepLateness is bench_latency.cpp's sleep_fsched and sleep_thread: one goroutine sleeps `d` n times
// and returns each sleep's lateness (elapsed minus d) in microseconds. With `busy`, procs
// goroutines meanwhile compute in slices of about 20 us and call runtime.Gosched()
// between them (the C++ case's busy fibers yield the same way).
func sleepLateness(d time.Duration, n int, busy bool, procs int) []float64 {
	var stop atomic.Bool
	var wg sync.WaitGroup
	if busy {
		for i := 0; i < procs; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := uint64(1)
				for !stop.Load() {
					end := time.Now().Add(20 * time.Microsecond)
					for time.Now().Before(end) {
						for k := 0; k < 64; k++ {
							x = x*6364136223846793005 + 1442695040888963407
						}
					}
					runtime.Gosched()
				}
				atomic.AddUint64(&sleepSink, x)
			}()
		}
	}
	for i := 0; i < n/10+1; i++ { // warm-up
		time.Sleep(d)
	}
	late := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		t0 := time.Now()
		time.Sleep(d)
		late = append(late, float64(time.Since(t0)-d)/1e3)
	}
	stop.Store(true)
	wg.Wait()
	return late
}
