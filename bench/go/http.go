// bench_http's twins: an HTTP/1.1 keep-alive server with a goroutine per connection, twice.
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
)

// httpResponse is the one response every bench_http server sends, byte for byte.
const httpResponse = "HTTP/1.1 200 OK\r\nServer: bench\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, world!"

// inheritedListener is the listening socket bench_http passes as fd 3; "ready" goes to
// stdout once it is open, so that Go's start-up is not in the measured window.
func inheritedListener() (net.Listener, error) {
	file := os.NewFile(3, "listener")
	ln, err := net.FileListener(file)
	file.Close() // FileListener works on a dup
	if err != nil {
		return nil, err
	}
	fmt.Println("ready")
	return ln, nil
}

// serveHTTPRaw is the fair twin of bench_http's servers: a goroutine per connection on
// Go's netpoller, bufio on the socket, a request is everything up to its empty line (the
// benchmark sends GETs without bodies), and the response is flushed once no further
// request is already buffered (so pipelined requests share a write, as in the C++ servers).
// It serves until it is killed.
func serveHTTPRaw() error {
	ln, err := inheritedListener()
	if err != nil {
		return err
	}
	response := []byte(httpResponse)
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go func(c net.Conn) {
			defer c.Close()
			r := bufio.NewReaderSize(c, 4096)
			w := bufio.NewWriterSize(c, 4096)
			for {
				for {
					line, err := r.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(line) <= 2 { // "\r\n": the end of the request's head
						break
					}
				}
				w.Write(response)
				if r.Buffered() == 0 {
					if w.Flush() != nil {
						return
					}
				}
			}
		}(conn)
	}
}

// serveNetHTTP is the same on net/http, what a Go programmer would write first: it parses
// every header and adds a Date header, so it does more work per request than the others.
func serveNetHTTP() error {
	ln, err := inheritedListener()
	if err != nil {
		return err
	}
	body := []byte("Hello, world!")
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h["Server"] = []string{"bench"}
		h["Content-Type"] = []string{"text/plain"}
		h["Content-Length"] = []string{"13"}
		w.Write(body)
	})
	return http.Serve(ln, handler)
}
