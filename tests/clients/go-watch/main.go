// go-watch: a watch client built by each Go toolchain of the Go release matrix (`cargo xtask
// setup`, `xtask/src/gomatrix.rs`), twice: with the standard library's HTTP/2 client
// (`transport_std.go`) and with golang.org/x/net/http2's (`transport_xnet.go`, beside the
// standard library's own copy in the same binary). Over an HTTP/2 TLS
// connection it watches nodes (re-watching when a watch ends) and, once the file named by its
// second argument exists, over a new connection (one that begins under the agent's probes, as
// a new process's would), pods with `timeoutSeconds=3` and a label selector (whose value must
// never leave the agent). Its bearer token comes from the environment, `GO_WATCH_TOKEN`, so
// that no command line holds it. It exits when a request fails or is not HTTP/2.
//
// With `GO_WATCH_FLOOD=N` it is a noisy neighbour instead: N goroutines send `GET /version`
// over one HTTP/2 connection as fast as the server answers, and it prints the requests of
// each second (`rate N`).
//
// With `GO_WATCH_STREAMS=N` it is another: it opens N watches of nodes that stay open (an
// hour's timeoutSeconds), 1,000 a second over as many HTTP/2 connections as the server's
// stream limit takes (with x/net's transport; net/http's bundled one dials a connection for
// each request that waits while all are full, and closes the extras: a connect storm), and
// prints how many have their response headers each second (`open N`).
//
// With `GO_WATCH_CANCEL=N` it stops its own watches: over one HTTP/2 connection (made at once
// with a `GET /version`, `connected`), once the trigger file exists, it opens a watch of nodes
// N times (`open I` once its response headers came) and closes each response body 3 s later
// (`GO_WATCH_HOLD_MS`), before the server ends it (`cancelled I`): the transport resets the
// stream (RST_STREAM, CANCEL) and keeps the connection. Then it prints `done` and stays,
// connected and idle.
//
//	GO_WATCH_TOKEN=... [GO_WATCH_FLOOD=N | GO_WATCH_STREAMS=N | GO_WATCH_CANCEL=N [GO_WATCH_HOLD_MS=MS]] go-watch https://HOST:PORT TRIGGER-FILE
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: GO_WATCH_TOKEN=... go-watch https://HOST:PORT TRIGGER-FILE")
		os.Exit(2)
	}
	server, trigger, token := os.Args[1], os.Args[2], os.Getenv("GO_WATCH_TOKEN")
	// Each client its own transport, so its own connection.
	newClient := func() *http.Client {
		return &http.Client{Transport: newTransport()}
	}
	watch := func(client *http.Client, path string) {
		resp := get(client, server, token, path)
		if resp.ProtoMajor != 2 {
			fail(fmt.Errorf("%s answered %s, not HTTP/2", server, resp.Proto))
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n, err := strconv.Atoi(os.Getenv("GO_WATCH_FLOOD")); err == nil && n > 0 {
		flood(newClient(), server, token, n)
	}
	if n, err := strconv.Atoi(os.Getenv("GO_WATCH_STREAMS")); err == nil && n > 0 {
		streams(newClient(), server, token, n)
	}
	if n, err := strconv.Atoi(os.Getenv("GO_WATCH_CANCEL")); err == nil && n > 0 {
		hold := 3 * time.Second
		if ms, err := strconv.Atoi(os.Getenv("GO_WATCH_HOLD_MS")); err == nil && ms > 0 {
			hold = time.Duration(ms) * time.Millisecond
		}
		cancelling(newClient(), server, token, trigger, n, hold)
	}
	go func() {
		nodes := newClient()
		for {
			watch(nodes, "/api/v1/nodes?watch=true&timeoutSeconds=60")
		}
	}()
	waitFor(trigger)
	fmt.Println("watching pods")
	watch(newClient(), "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=3&labelSelector=app%3Dsecret-selector-xyz")
	select {}
}

// waitFor returns once the file `trigger` exists.
func waitFor(trigger string) {
	for {
		if _, err := os.Stat(trigger); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cancelling(client *http.Client, server, token, trigger string, n int, hold time.Duration) {
	resp := get(client, server, token, "/version")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println("connected")
	waitFor(trigger)
	for i := 1; i <= n; i++ {
		resp := get(client, server, token, "/api/v1/nodes?watch=true&timeoutSeconds=3600")
		fmt.Println("open", i)
		time.Sleep(hold)
		resp.Body.Close()
		fmt.Println("cancelled", i)
	}
	fmt.Println("done")
	select {}
}

func flood(client *http.Client, server, token string, workers int) {
	var sent atomic.Int64
	for i := 0; i < workers; i++ {
		go func() {
			for {
				resp := get(client, server, token, "/version")
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				sent.Add(1)
			}
		}()
	}
	fmt.Println("flooding")
	for {
		time.Sleep(time.Second)
		fmt.Println("rate", sent.Swap(0))
	}
}

func streams(client *http.Client, server, token string, n int) {
	var open atomic.Int64
	go func() {
		for {
			time.Sleep(time.Second)
			fmt.Println("open", open.Load())
		}
	}()
	for i := 0; i < n; i++ {
		go func() {
			resp := get(client, server, token, "/api/v1/nodes?watch=true&timeoutSeconds=3600")
			open.Add(1)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			open.Add(-1)
		}()
		time.Sleep(time.Millisecond)
	}
	select {}
}

// get sends `GET path` with the bearer token; a failure ends the program.
func get(client *http.Client, server, token, path string) *http.Response {
	req, err := http.NewRequest("GET", server+path, nil)
	if err != nil {
		fail(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		fail(err)
	}
	return resp
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "go-watch:", err)
	os.Exit(1)
}
