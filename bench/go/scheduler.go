// bench_scheduler's twins: spawn, skynet, and yield as runtime.Gosched().
package main

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"
)

// spawnOnce is bench_scheduler's spawn_fsched_go: one goroutine starts n empty goroutines
// and waits for them on a WaitGroup; the clock runs from before that goroutine starts
// until the main goroutine sees it finish. (Our other spawn case, a batch handed over from
// the main thread, has no twin: Go has no batch submission, and its main goroutine is an
// ordinary goroutine on one of the Ps, so `go f()` from main is this case again.)
func spawnOnce(n int) float64 {
	t0 := time.Now()
	var finished sync.WaitGroup
	finished.Add(1)
	go func() {
		var wg sync.WaitGroup
		wg.Add(n)
		for i := 0; i < n; i++ {
			go func() { wg.Done() }()
		}
		wg.Wait()
		finished.Done()
	}()
	finished.Wait()
	return time.Since(t0).Seconds()
}

// spawnRates: one warm-up, then reps repetitions; M tasks/s each (spawn_rates).
func spawnRates(n, reps int) []float64 {
	spawnOnce(n)
	var samples []float64
	for r := 0; r < reps; r++ {
		samples = append(samples, float64(n)/spawnOnce(n)/1e6)
	}
	return samples
}

// skynetNode is SkynetChild: the parent's frame holds its 10 children in an array.
type skynetNode struct {
	num, leaves, result uint64
}

// skynet is skynet_fsched: a node starts its 10 children, each a goroutine, and blocks on
// a WaitGroup until they are done; a leaf's result is its number.
func skynet(node *skynetNode) {
	if node.leaves == 1 {
		node.result = node.num
		return
	}
	var children [10]skynetNode
	var wg sync.WaitGroup
	wg.Add(10)
	step := node.leaves / 10
	for i := range children {
		child := &children[i]
		*child = skynetNode{num: node.num + uint64(i)*step, leaves: step}
		go func() {
			skynet(child)
			wg.Done()
		}()
	}
	wg.Wait()
	var sum uint64
	for _, c := range children {
		sum += c.result
	}
	node.result = sum
}

// skynetTimes: one warm-up, then reps trees, each started as a goroutine that the main
// goroutine waits for (skynet_fsched_run); ms each, the total checked.
func skynetTimes(leaves, reps int) []float64 {
	expected := uint64(leaves) * uint64(leaves-1) / 2
	var samples []float64
	for r := -1; r < reps; r++ { // r == -1: warm-up
		t0 := time.Now()
		root := skynetNode{leaves: uint64(leaves)}
		var finished sync.WaitGroup
		finished.Add(1)
		go func() {
			skynet(&root)
			finished.Done()
		}()
		finished.Wait()
		ms := time.Since(t0).Seconds() * 1e3
		if root.result != expected {
			fmt.Fprintf(os.Stderr, "go_twins skynet: wrong total %d, expected %d\n", root.result, expected)
			os.Exit(1)
		}
		if r >= 0 {
			samples = append(samples, ms)
		}
	}
	return samples
}

var goschedSink uint64

// goschedOnce is yield_fsched: two goroutines each yield n times with runtime.Gosched()
// while the main goroutine waits on a WaitGroup; seconds. On GOMAXPROCS=1 they alternate.
// Each keeps its own count (they are not on one thread in Go's model, whatever GOMAXPROCS).
func goschedOnce(n int) float64 {
	var wg sync.WaitGroup
	wg.Add(2)
	var counts [2]uint64
	body := func(count *uint64) {
		for i := 0; i < n; i++ {
			*count++
			runtime.Gosched()
		}
		wg.Done()
	}
	t0 := time.Now()
	go body(&counts[0])
	go body(&counts[1])
	wg.Wait()
	s := time.Since(t0).Seconds()
	goschedSink = counts[0] + counts[1]
	return s
}

// goschedTimes: a warm-up of a tenth, then reps repetitions; ns per yield (yield_times).
func goschedTimes(perGoroutine, reps int) []float64 {
	goschedOnce(perGoroutine/10 + 1)
	var samples []float64
	for r := 0; r < reps; r++ {
		samples = append(samples, goschedOnce(perGoroutine)*1e9/float64(2*perGoroutine))
	}
	return samples
}
