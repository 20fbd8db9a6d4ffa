package testcluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The self-test never needs the real herd binary: the test binary itself,
// re-executed, plays the helper processes. Invoked through a symbolic link
// named "herd" it is a fake herd (server and CLI) implementing the parts of
// the binary's contract that this package relies on; with helperVariable set
// it is a TCP echo server or a one-shot TCP client, run inside network
// namespaces.
const (
	// helperVariable selects a helper: "echo" or "dial".
	helperVariable = "TESTCLUSTER_HELPER"
	// helperAddressVariable is the helper's host:port.
	helperAddressVariable = "TESTCLUSTER_ADDRESS"
	// dialTimeout bounds one connection attempt by the dial helper and the
	// fake herd: short, because a partition drops packets and a blocked
	// connection only fails by timing out.
	dialTimeout = 300 * time.Millisecond
)

func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "herd" {
		os.Exit(fakeHerdMain(os.Args[1:]))
	}
	switch os.Getenv(helperVariable) {
	case "echo":
		os.Exit(echoMain(os.Getenv(helperAddressVariable)))
	case "dial":
		os.Exit(dialMain(os.Getenv(helperAddressVariable)))
	}
	os.Exit(m.Run())
}

// echoMain serves TCP connections on address, echoing what they send.
func echoMain(address string) int {
	listener, err := net.Listen("tcp", address)
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		return 1
	}
	for {
		connection, err := listener.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "echo:", err)
			return 1
		}
		go func() {
			defer connection.Close()
			io.Copy(connection, connection)
		}()
	}
}

// dialMain sends a UDP datagram to address, which must not fail even when
// nothing can arrive, then connects to the echo server there and checks the
// echo; its exit status is 0 when all of that worked.
func dialMain(address string) int {
	datagram, err := net.Dial("udp", address)
	if err == nil {
		_, err = datagram.Write([]byte("ping\n"))
		datagram.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial: sending a UDP datagram:", err)
		return 1
	}
	if err := echoRoundTrip(address); err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	return 0
}

// echoRoundTrip sends a line to the echo server at address and checks that
// it comes back.
func echoRoundTrip(address string) error {
	connection, err := net.DialTimeout("tcp", address, dialTimeout)
	if err != nil {
		return err
	}
	defer connection.Close()
	connection.SetDeadline(time.Now().Add(2 * time.Second))
	const message = "ping\n"
	if _, err := io.WriteString(connection, message); err != nil {
		return err
	}
	reply := make([]byte, len(message))
	if _, err := io.ReadFull(connection, reply); err != nil {
		return err
	}
	if string(reply) != message {
		return fmt.Errorf("echo returned %q", reply)
	}
	return nil
}

// fakeInfo is what the fake herd's `cluster info` prints.
type fakeInfo struct {
	Bind     string `json:"bind"`
	Join     string `json:"join"`
	Zone     string `json:"zone"`
	Capacity string `json:"capacity"`
	// Starts counts the starts on this data directory.
	Starts int `json:"starts"`
	PID    int `json:"pid"`
}

// fakeHerdMain is a fake herd binary: `server` serves /v1/health and a few
// fake endpoints, anything else is the CLI.
func fakeHerdMain(arguments []string) int {
	if len(arguments) > 0 && arguments[0] == "server" {
		return fakeServer(arguments[1:])
	}
	return fakeCLI(arguments)
}

// fakeServer follows the server's contract: the first node (no --join)
// writes DATA/join.token and DATA/admin.token with mode 0600 (and reuses them
// when restarted); a joining node (--join) takes the join token from
// $HERD_JOIN_TOKEN and fails without it. The fake's admin token is "admin-"
// followed by the join token, so that every node knows it. The admin API
// listens with TLS on BIND:7080, under a self-signed certificate made at
// start, and its fake endpoints want "Authorization: Bearer ADMIN-TOKEN". The
// zone "crash" makes it exit with status 7 at once.
func fakeServer(arguments []string) int {
	flags := flag.NewFlagSet("herd server", flag.ContinueOnError)
	data := flags.String("data", "", "")
	bind := flags.String("bind", "", "")
	join := flags.String("join", "", "")
	zone := flags.String("zone", "", "")
	capacity := flags.String("capacity", "", "")
	if err := flags.Parse(arguments); err != nil {
		return 2
	}
	if *zone == "crash" {
		fmt.Fprintln(os.Stderr, "fake herd: crashing as asked")
		return 7
	}
	var joinToken string
	if *join != "" {
		joinToken = os.Getenv(JoinTokenVariable)
		if joinToken == "" {
			fmt.Fprintf(os.Stderr, "fake herd: joining needs the join token in $%s\n", JoinTokenVariable)
			return 1
		}
	} else {
		var err error
		if joinToken, err = fakeFirstNodeTokens(*data); err != nil {
			fmt.Fprintln(os.Stderr, "fake herd:", err)
			return 1
		}
	}
	adminToken := fakeAdminToken(joinToken)
	startsPath := filepath.Join(*data, "starts")
	starts, _ := os.ReadFile(startsPath)
	starts = append(starts, 'x')
	if err := os.WriteFile(startsPath, starts, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	info := fakeInfo{Bind: *bind, Join: *join, Zone: *zone, Capacity: *capacity, Starts: len(starts), PID: os.Getpid()}

	authorized := func(request *http.Request) bool {
		return request.Header.Get("Authorization") == "Bearer "+adminToken
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", func(writer http.ResponseWriter, request *http.Request) {
		io.WriteString(writer, "ok\n")
	})
	mux.HandleFunc("GET /v1/fake/info", func(writer http.ResponseWriter, request *http.Request) {
		if !authorized(request) {
			http.Error(writer, "bad token", http.StatusUnauthorized)
			return
		}
		json.NewEncoder(writer).Encode(info)
	})
	mux.HandleFunc("GET /v1/fake/dial", func(writer http.ResponseWriter, request *http.Request) {
		if !authorized(request) {
			http.Error(writer, "bad token", http.StatusUnauthorized)
			return
		}
		connection, err := net.DialTimeout("tcp", request.URL.Query().Get("address"), dialTimeout)
		if err != nil {
			http.Error(writer, err.Error(), http.StatusBadGateway)
			return
		}
		connection.Close()
		io.WriteString(writer, "ok\n")
	})
	mux.HandleFunc("POST /v1/fake/race", func(writer http.ResponseWriter, request *http.Request) {
		if !authorized(request) {
			http.Error(writer, "bad token", http.StatusUnauthorized)
			return
		}
		provokeRace()
		io.WriteString(writer, "ok\n")
	})
	mux.HandleFunc("POST /v1/fake/exit", func(writer http.ResponseWriter, request *http.Request) {
		if !authorized(request) {
			http.Error(writer, "bad token", http.StatusUnauthorized)
			return
		}
		fmt.Fprintln(os.Stderr, "fake herd: exiting with status 3 as asked")
		os.Exit(3)
	})
	certificate, err := fakeCertificate(*bind)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	listener, err := net.Listen("tcp", net.JoinHostPort(*bind, strconv.Itoa(AdminPort)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fake herd: serving HTTPS on %s\n", listener.Addr())
	server := &http.Server{
		Handler:   mux,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{certificate}},
	}
	fmt.Fprintln(os.Stderr, server.ServeTLS(listener, "", ""))
	return 1
}

// fakeAdminToken is the fake herd's admin token for a join token.
func fakeAdminToken(joinToken string) string { return "admin-" + joinToken }

// fakeFirstNodeTokens returns the join token of the first node whose data
// directory is data: the one in DATA/join.token, or, at the first start, a
// new one written there along with the admin token in DATA/admin.token, both
// with mode 0600.
func fakeFirstNodeTokens(data string) (string, error) {
	joinPath := filepath.Join(data, joinTokenFile)
	if contents, err := os.ReadFile(joinPath); err == nil {
		return strings.TrimSpace(string(contents)), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	joinToken := rand.Text()
	// The admin token first and each file renamed into place, so that a
	// reader never sees a partial token, and join.token marks both done.
	for _, file := range []struct{ name, token string }{
		{tokenFile, fakeAdminToken(joinToken)},
		{joinTokenFile, joinToken},
	} {
		path := filepath.Join(data, file.name)
		if err := os.WriteFile(path+".new", []byte(file.token+"\n"), 0o600); err != nil {
			return "", err
		}
		if err := os.Rename(path+".new", path); err != nil {
			return "", err
		}
	}
	return joinToken, nil
}

// fakeCertificate returns a new self-signed ECDSA certificate for the IP
// address bind.
func fakeCertificate(bind string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "fake herd " + bind},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(bind); ip != nil {
		template.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// fakeCLI follows the CLI's contract: `herd --addr HOST:PORT [--json]
// COMMAND...` over HTTPS, the admin token from $HERD_TOKEN. Being a fake, it
// does not verify the node's certificate. Commands:
// `cluster info` (needs --json), `dial ADDRESS` (the node dials ADDRESS),
// `race` (the node reports a data race, see provokeRace), `exit` (the node
// exits with status 3).
func fakeCLI(arguments []string) int {
	flags := flag.NewFlagSet("herd", flag.ContinueOnError)
	address := flags.String("addr", "", "")
	jsonOutput := flags.Bool("json", false, "")
	if err := flags.Parse(arguments); err != nil {
		return 2
	}
	token := os.Getenv(TokenVariable)
	client := &http.Client{Transport: &http.Transport{
		Proxy:           nil,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	request := func(method, path string) (string, error) {
		httpRequest, err := http.NewRequest(method, "https://"+*address+path, nil)
		if err != nil {
			return "", err
		}
		httpRequest.Header.Set("Authorization", "Bearer "+token)
		response, err := client.Do(httpRequest)
		if err != nil {
			return "", err
		}
		defer response.Body.Close()
		body, err := io.ReadAll(response.Body)
		if response.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", response.Status, strings.TrimSpace(string(body)))
		}
		return string(body), err
	}
	var output string
	var err error
	switch command := strings.Join(flags.Args(), " "); {
	case command == "cluster info" && *jsonOutput:
		output, err = request(http.MethodGet, "/v1/fake/info")
	case strings.HasPrefix(command, "dial "):
		output, err = request(http.MethodGet, "/v1/fake/dial?address="+url.QueryEscape(flags.Arg(1)))
	case command == "race":
		output, err = request(http.MethodPost, "/v1/fake/race")
	case command == "exit":
		output, err = request(http.MethodPost, "/v1/fake/exit")
	default:
		fmt.Fprintf(os.Stderr, "fake herd: unknown command %q\n", command)
		return 2
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	fmt.Print(output)
	return 0
}

// provokeRace makes the fake herd report a data race on its standard error
// and go on running, as a herd binary built with -race does. Under the race
// detector it is a real race: two unsynchronised writes of x. Without it,
// the report is written out; its text is that of a real report (go1.26,
// the same two writes in a small program).
func provokeRace() {
	if raceEnabled {
		var x int
		done := make(chan bool)
		go func() { x = 1; done <- true }()
		x = 2
		<-done
		fmt.Fprintln(os.Stderr, "fake herd: raced, x is", x)
		return
	}
	fmt.Fprint(os.Stderr, `==================
WARNING: DATA RACE
Write at 0x00c000096028 by goroutine 8:
  main.main.func1()
      /tmp/racedemo/main.go:8 +0x33

Previous write at 0x00c000096028 by main goroutine:
  main.main()
      /tmp/racedemo/main.go:9 +0xce

Goroutine 8 (running) created at:
  main.main()
      /tmp/racedemo/main.go:8 +0xc4
==================
`)
}

// fakeBinary returns a symbolic link named herd to the test binary, which
// then runs fakeHerdMain.
func fakeBinary(t *testing.T) string {
	t.Helper()
	executable, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "herd")
	if err := os.Symlink(executable, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// recordingTB records errors instead of failing the test, and turns Fatalf
// into a recorded message plus runtime.Goexit, so that failure paths can be
// tested. Everything else goes to the real test.
type recordingTB struct {
	testing.TB

	// mu guards the following fields.
	mu       sync.Mutex
	messages []string
}

func (r *recordingTB) Errorf(format string, arguments ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.messages = append(r.messages, fmt.Sprintf(format, arguments...))
}

func (r *recordingTB) Fatalf(format string, arguments ...any) {
	r.Errorf(format, arguments...)
	runtime.Goexit()
}

func (r *recordingTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.messages) > 0
}

// recorded returns the messages recorded so far, joined.
func (r *recordingTB) recorded() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.messages, "\n")
}

// runRecorded runs function with a recordingTB in a goroutine of its own
// (so that Fatalf can end it) and returns the recordingTB.
func runRecorded(t *testing.T, function func(testing.TB)) *recordingTB {
	recorder := &recordingTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		function(recorder)
	}()
	<-done
	return recorder
}
