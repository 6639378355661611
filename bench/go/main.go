// The Go twins of fiber_sched's benchmarks (see ../../BENCHMARKS.md, "Machine and method").
//
// One program, one case per run, chosen by the first argument:
//
//	go_twins version
//	go_twins spawn   -n TASKS  -reps N -procs P   empty goroutines from a goroutine + WaitGroup
//	go_twins skynet  -leaves L -reps N -procs P   10 children per node, WaitGroup per node
//	go_twins gosched -n YIELDS -reps N -procs P   two goroutines alternating runtime.Gosched()
//	go_twins chan    -cap C -iters N -reps N -rep-ms MS -procs P   ping-pong over two channels
//	go_twins select  -iters N -reps N -rep-ms MS -procs P   selects over two channels fed by two goroutines
//	go_twins timedrecv -iters N -reps N -rep-ms MS -procs P ping-pong whose receives wait at most 1 s
//	go_twins sleep   -us D -n N [-busy] -procs P   lateness of N (default 2000) time.Sleep(D us), samples in us
//	go_twins echo    -connections C -procs P      echo server on the listening socket at fd 3
//	go_twins http    -procs P                     HTTP/1.1 keep-alive server on fd 3, raw bufio
//	go_twins nethttp -procs P                     the same on net/http
//
// bench_scheduler, bench_sync, bench_toolbox, bench_latency, bench_io and bench_http run it (CMake builds it when it finds `go`) and
// print its figures as rows of their own tables, so each case here is shaped like the C++
// case it sits beside, with the same repetition rule: warm up, then -reps timed
// repetitions. A measuring case prints one line the C++ side parses:
//
//	result <case> unit <unit> work <per repetition> best <b> median <m> samples <s1,s2,...>
//
// Standard library only: it builds without a network.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go_twins version|spawn|skynet|gosched|chan|select|timedrecv|sleep|echo|http|nethttp [flags]  (go_twins CASE -h for the flags)")
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	name := os.Args[1]
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	procs := fs.Int("procs", 2, "GOMAXPROCS")
	reps := fs.Int("reps", 5, "timed repetitions, after one warm-up")
	n := fs.Int("n", 1000000, "spawn: tasks; gosched: yields per goroutine")
	leaves := fs.Int("leaves", 1000000, "skynet: leaves, a power of 10")
	capacity := fs.Int("cap", 0, "chan: channel capacity")
	iters := fs.Int("iters", 0, "chan, select, timedrecv: operations per repetition; 0: calibrate")
	repMs := fs.Float64("rep-ms", 30, "chan, select, timedrecv: calibration target per repetition, ms")
	connections := fs.Int("connections", 100, "echo: connections to accept")
	sleepUs := fs.Float64("us", 100, "sleep: the sleep, microseconds")
	busy := fs.Bool("busy", false, "sleep: keep every P busy meanwhile")
	fs.Parse(os.Args[2:])
	// Set here, not through the environment, so the C++ side names the value it compares.
	runtime.GOMAXPROCS(*procs)
	if *reps < 1 {
		*reps = 1
	}

	switch name {
	case "version":
		fmt.Println("version", runtime.Version())
	case "spawn":
		report("spawn", "M/s", uint64(*n), true, spawnRates(*n, *reps))
	case "skynet":
		report("skynet", "ms", uint64(*leaves), false, skynetTimes(*leaves, *reps))
	case "gosched":
		report("gosched", "ns", uint64(2**n), false, goschedTimes(*n, *reps))
	case "chan":
		work, samples := channelTimes(*capacity, uint64(*iters), *reps, *repMs)
		report("chan", "ns", work, false, samples)
	case "select":
		work, samples := repTimes(selectOnce, uint64(*iters), *reps, *repMs)
		report("select", "ns", work, false, samples)
	case "timedrecv":
		work, samples := repTimes(timedRecvOnce, uint64(*iters), *reps, *repMs)
		report("timedrecv", "ns", work, false, samples)
	case "sleep":
		sleeps := 2000 // -n's default is spawn's million: 17 minutes of 1 ms sleeps
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "n" {
				sleeps = *n
			}
		})
		samples := sleepLateness(time.Duration(*sleepUs*1e3), sleeps, *busy, *procs)
		report("sleep", "us", uint64(len(samples)), false, samples)
	case "echo":
		if err := serveEcho(*connections); err != nil {
			fmt.Fprintln(os.Stderr, "go_twins echo:", err)
			os.Exit(1)
		}
	case "http", "nethttp":
		serve := serveHTTPRaw
		if name == "nethttp" {
			serve = serveNetHTTP
		}
		if err := serve(); err != nil {
			fmt.Fprintln(os.Stderr, "go_twins "+name+":", err)
			os.Exit(1)
		}
	default:
		usage()
	}
}

// median is bench_util.hpp's: the mean of the middle two for an even count.
func median(samples []float64) float64 {
	s := append([]float64(nil), samples...)
	sort.Float64s(s)
	mid := len(s) / 2
	if len(s)%2 == 1 {
		return s[mid]
	}
	return (s[mid-1] + s[mid]) / 2
}

// report prints the result line; best is the highest sample for a rate, the lowest for a time.
func report(name, unit string, work uint64, higherIsBetter bool, samples []float64) {
	if len(samples) == 0 {
		fmt.Fprintln(os.Stderr, "go_twins:", name, "produced no samples")
		os.Exit(1)
	}
	best := samples[0]
	text := make([]string, len(samples))
	for i, s := range samples {
		if (higherIsBetter && s > best) || (!higherIsBetter && s < best) {
			best = s
		}
		text[i] = strconv.FormatFloat(s, 'g', 6, 64)
	}
	fmt.Printf("result %s unit %s work %d best %.6g median %.6g samples %s\n", name, unit, work, best, median(samples),
		strings.Join(text, ","))
}
