// bench_io's twin: an echo server with a goroutine per connection.
package main

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// serveEcho serves bench_io's echo protocol on the listening socket it inherits as fd 3,
// like bench_io's servers: say "ready" on stdout, accept `connections` connections (giving up after 10 s without
// one, as they do), echo whatever each sends until its client closes it, and return once
// every connection has ended. Go's TCPConn has TCP_NODELAY on by default, as bench_io sets.
func serveEcho(connections int) error {
	file := os.NewFile(3, "listener")
	ln, err := net.FileListener(file)
	file.Close() // FileListener works on a dup
	if err != nil {
		return err
	}
	defer ln.Close()
	tcp, ok := ln.(*net.TCPListener)
	if !ok {
		return fmt.Errorf("fd 3 is not a TCP listener")
	}
	// bench_io's start() waits for this line, so that Go's start-up is not in its window.
	fmt.Println("ready")
	var wg sync.WaitGroup
	for i := 0; i < connections; i++ {
		tcp.SetDeadline(time.Now().Add(10 * time.Second))
		conn, err := tcp.Accept()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			buf := make([]byte, 4096)
			for {
				n, err := conn.Read(buf)
				if n > 0 {
					if _, werr := conn.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	return nil
}
