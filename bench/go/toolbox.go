// bench_toolbox's twins: select over two channels, and a receive with a timeout.
package main

import (
	"sync"
	"time"
)

var toolboxSink uint64

// selectOnce is select_fsched: two goroutines each send n/2 values (n rounded up to even)
// on a channel of their own (capacity 1); the receiver runs n selects over both.
func selectOnce(n uint64) {
	half := (n + 1) / 2
	a, b := make(chan int, 1), make(chan int, 1)
	var wg sync.WaitGroup
	wg.Add(3)
	send := func(c chan int) {
		for k := uint64(0); k < half; k++ {
			c <- int(k & 0xffff)
		}
		wg.Done()
	}
	go send(a)
	go send(b)
	var sum uint64
	go func() {
		for k := uint64(0); k < 2*half; k++ {
			select {
			case v := <-a:
				sum += uint64(v)
			case v := <-b:
				sum += uint64(v)
			}
		}
		wg.Done()
	}()
	wg.Wait()
	toolboxSink += sum
}

// timedRecvOnce is timed_receive_fsched: a ping-pong over two unbuffered channels in which
// every receive may give up after a second (it never does): a timer per goroutine, Reset
// before each wait and stopped after it, the idiom that allocates nothing per receive.
func timedRecvOnce(n uint64) {
	rounds := (n + 1) / 2
	ping, pong := make(chan int), make(chan int)
	var wg sync.WaitGroup
	wg.Add(2)
	receive := func(c chan int, t *time.Timer) int {
		t.Reset(time.Second)
		select {
		case v := <-c:
			if !t.Stop() {
				<-t.C
			}
			return v
		case <-t.C:
			panic("go_twins timedrecv: a receive timed out")
		}
	}
	var sum uint64
	go func() {
		t := time.NewTimer(time.Hour)
		t.Stop()
		for k := uint64(0); k < rounds; k++ {
			ping <- int(k & 0xffff)
			sum += uint64(receive(pong, t))
		}
		wg.Done()
	}()
	go func() {
		t := time.NewTimer(time.Hour)
		t.Stop()
		for k := uint64(0); k < rounds; k++ {
			pong <- receive(ping, t) + 1
		}
		wg.Done()
	}()
	wg.Wait()
	toolboxSink += sum
}
