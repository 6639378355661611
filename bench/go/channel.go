// bench_sync's channel twin: ping-pong over two channels.
package main

import (
	"sort"
	"sync"
	"time"
)

var channelSink uint64

// channelOnce is channel_fsched: n one-way messages, (n + 1) / 2 round trips, a ping and
// a pong each, between two goroutines; the main goroutine waits on a WaitGroup.
func channelOnce(capacity int, n uint64) {
	rounds := (n + 1) / 2
	ping, pong := make(chan int, capacity), make(chan int, capacity)
	var wg sync.WaitGroup
	wg.Add(2)
	var sum uint64
	go func() {
		for k := uint64(0); k < rounds; k++ {
			ping <- int(k & 0xffff)
			sum += uint64(<-pong)
		}
		wg.Done()
	}()
	go func() {
		for k := uint64(0); k < rounds; k++ {
			pong <- <-ping + 1
		}
		wg.Done()
	}()
	wg.Wait()
	channelSink += sum
}

// channelTimes times channelOnce with repTimes.
func channelTimes(capacity int, iters uint64, reps int, repMs float64) (uint64, []float64) {
	return repTimes(func(n uint64) { channelOnce(capacity, n) }, iters, reps, repMs)
}

// repTimes is bench_sync's timed(): without iters, the count doubles from 256 (after a
// warm-up at 256) until a call takes a quarter of repMs, the per-operation time is the
// slowest of three calls at that count, and the count is scaled to repMs; a repetition over
// 4 x repMs halves the count of the ones after it. With iters the count is fixed (a warm-up
// of at most 256). Returns the first repetition's count and ns per operation for each
// repetition.
func repTimes(once func(uint64), iters uint64, reps int, repMs float64) (uint64, []float64) {
	runNs := func(n uint64) float64 {
		t0 := time.Now()
		once(n)
		return float64(time.Since(t0).Nanoseconds())
	}
	targetNs := repMs * 1e6
	n := iters
	if n == 0 {
		n = 256
		runNs(n)
		for runNs(n) < targetNs/4 && n < 1<<36 {
			n *= 2
		}
		worst := []float64{runNs(n), runNs(n), runNs(n)}
		sort.Float64s(worst)
		perOp := worst[2] / float64(n)
		if perOp < 0.01 {
			perOp = 0.01
		}
		n = uint64(targetNs / perOp)
		if n < 1 {
			n = 1
		}
	} else if n > 256 {
		runNs(256)
	} else {
		runNs(n)
	}
	work := n
	var samples []float64
	for r := 0; r < reps; r++ {
		ns := runNs(n)
		samples = append(samples, ns/float64(n))
		if iters == 0 && ns > 4*targetNs && n > 1 {
			n /= 2
		}
	}
	return work, samples
}
