package api

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// connectionTestServer serves /auth (a request with a valid token: it
// counts its connection as authenticated), /hold (the same, answered
// once hold is closed) and /open (one without) within limits, over TLS.
func connectionTestServer(t *testing.T, limits ConnectionLimits) (*Server, *httptest.Server) {
	return connectionTestServerHolding(t, limits, nil)
}

func connectionTestServerHolding(t *testing.T, limits ConnectionLimits, hold chan struct{}) (*Server, *httptest.Server) {
	t.Helper()
	s := &Server{logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.SetConnectionLimits(limits)
	mux := http.NewServeMux()
	mux.HandleFunc("/auth", func(w http.ResponseWriter, r *http.Request) {
		if s.authenticatedConnection(w, r) {
			io.WriteString(w, "ok")
		}
	})
	mux.HandleFunc("/open", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		if s.authenticatedConnection(w, r) {
			<-hold
			io.WriteString(w, "ok")
		}
	})
	ts := httptest.NewUnstartedServer(mux)
	ts.Listener = &connectionListener{Listener: ts.Listener, conns: s.conns}
	ts.Config.ConnContext = connContext
	ts.Config.ConnState = s.conns.connState
	ts.StartTLS()
	t.Cleanup(ts.Close)
	return s, ts
}

// keepAliveClient is a client with a connection of its own (keep-alive).
func keepAliveClient(ts *httptest.Server) *http.Client {
	transport := ts.Client().Transport.(*http.Transport).Clone()
	return &http.Client{Transport: transport, Timeout: 10 * time.Second}
}

func get(t *testing.T, client *http.Client, url string) int {
	t.Helper()
	response, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, response.Body)
	response.Body.Close()
	return response.StatusCode
}

func waitUntil(t *testing.T, what string, condition func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !condition() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAdminConnectionCap: connections that carried a valid token are
// capped; one more, while every one is in a request, is answered 503; a
// closed one makes room.
func TestAdminConnectionCap(t *testing.T) {
	hold := make(chan struct{})
	s, ts := connectionTestServerHolding(t, ConnectionLimits{MaxConnections: 2}, hold)
	first, second, third := keepAliveClient(ts), keepAliveClient(ts), keepAliveClient(ts)
	done := make(chan int, 2)
	for _, client := range []*http.Client{first, second} {
		go func() {
			response, err := client.Get(ts.URL + "/hold")
			if err != nil {
				done <- 0
				return
			}
			io.Copy(io.Discard, response.Body)
			response.Body.Close()
			done <- response.StatusCode
		}()
	}
	waitUntil(t, "two authenticated connections in a request", func() bool {
		authenticated, _ := s.AdminConnections()
		return authenticated == 2
	})
	if code := get(t, third, ts.URL+"/auth"); code != http.StatusServiceUnavailable {
		t.Fatalf("a third authenticated connection while two are in a request: %d, want 503", code)
	}
	// Without a token it is served (health, the dashboard's page).
	if code := get(t, third, ts.URL+"/open"); code != http.StatusOK {
		t.Fatalf("a request without a token on the third connection: %d", code)
	}
	close(hold)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Fatalf("a held request: %d", code)
		}
	}
	first.CloseIdleConnections()
	waitUntil(t, "the closed connection to be released", func() bool {
		authenticated, _ := s.AdminConnections()
		return authenticated == 1
	})
	if code := get(t, third, ts.URL+"/auth"); code != http.StatusOK {
		t.Fatalf("the third after one closed: %d", code)
	}
}

// TestAdminIdleConnectionsMakeRoom: a client that opens a new keep-alive
// connection for every call (a monitoring loop making a new client each
// time) never locks operators out: at the bound, the authenticated
// connection idle the longest is closed to admit the new one.
func TestAdminIdleConnectionsMakeRoom(t *testing.T) {
	s, ts := connectionTestServer(t, ConnectionLimits{MaxConnections: 4})
	var clients []*http.Client
	for i := range 20 {
		client := keepAliveClient(ts)
		clients = append(clients, client)
		if code := get(t, client, ts.URL+"/auth"); code != http.StatusOK {
			t.Fatalf("call %d, each on a connection of its own, left idle: %d, want 200", i, code)
		}
		if authenticated, _ := s.AdminConnections(); authenticated > 4 {
			t.Fatalf("%d authenticated connections, bound 4", authenticated)
		}
	}
	// The first client's connection was closed to make room: its next
	// call opens a new one and is served.
	if code := get(t, clients[0], ts.URL+"/auth"); code != http.StatusOK {
		t.Fatalf("the first client again: %d", code)
	}
}

// TestAdminUnauthenticatedPool: silent connections from many addresses
// stay within the pool (the oldest closed to admit new ones) and time
// out; a client with a token gets through all the while.
func TestAdminUnauthenticatedPool(t *testing.T) {
	s, ts := connectionTestServer(t, ConnectionLimits{MaxUnauthenticated: 6, MaxUnauthenticatedPerSource: 2, UnauthenticatedTimeout: 500 * time.Millisecond})
	address := ts.Listener.Addr().String()
	var silent []net.Conn
	for i := range 40 {
		dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("127.0.0.%d", 2+i%8))}}
		conn, err := dialer.Dial("tcp", address)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		silent = append(silent, conn)
	}
	waitUntil(t, "the pool to hold at most 6", func() bool {
		_, unauthenticated := s.AdminConnections()
		return unauthenticated == 6 && s.conns.pool.Evictions() == 34
	})
	client := keepAliveClient(ts)
	if code := get(t, client, ts.URL+"/auth"); code != http.StatusOK {
		t.Fatalf("a client with a token among 40 silent connections: %d", code)
	}
	// The silent ones are closed after the timeout; the authenticated
	// one stays.
	waitUntil(t, "the silent connections to time out", func() bool {
		authenticated, unauthenticated := s.AdminConnections()
		return unauthenticated == 0 && authenticated == 1
	})
	for _, conn := range silent {
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(make([]byte, 1)); err == nil {
			t.Fatal("a silent connection is still open")
		}
	}
	time.Sleep(600 * time.Millisecond)
	if code := get(t, client, ts.URL+"/auth"); code != http.StatusOK {
		t.Fatalf("the authenticated connection after the timeout: %d", code)
	}
	if authenticated, _ := s.AdminConnections(); authenticated != 1 {
		t.Fatalf("the client reconnected: %d authenticated connections", authenticated)
	}
}
