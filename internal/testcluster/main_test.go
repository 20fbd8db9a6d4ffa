package testcluster

import (
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
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

// fakeServer follows the server's contract: the first node (no --join, no
// token) writes DATA/cluster.token with mode 0600; others take --token or
// $HERD_TOKEN; the admin API listens on BIND:7080. The zone "crash" makes it
// exit with status 7 at once.
func fakeServer(arguments []string) int {
	flags := flag.NewFlagSet("herd server", flag.ContinueOnError)
	data := flags.String("data", "", "")
	bind := flags.String("bind", "", "")
	join := flags.String("join", "", "")
	zone := flags.String("zone", "", "")
	token := flags.String("token", "", "")
	capacity := flags.String("capacity", "", "")
	if err := flags.Parse(arguments); err != nil {
		return 2
	}
	if *zone == "crash" {
		fmt.Fprintln(os.Stderr, "fake herd: crashing as asked")
		return 7
	}
	secret := *token
	if secret == "" {
		secret = os.Getenv(TokenVariable)
	}
	tokenPath := filepath.Join(*data, tokenFile)
	if secret == "" {
		if contents, err := os.ReadFile(tokenPath); err == nil {
			secret = strings.TrimSpace(string(contents))
		} else {
			secret = rand.Text()
			if err := os.WriteFile(tokenPath, []byte(secret+"\n"), 0o600); err != nil {
				fmt.Fprintln(os.Stderr, "fake herd:", err)
				return 1
			}
		}
	}
	startsPath := filepath.Join(*data, "starts")
	starts, _ := os.ReadFile(startsPath)
	starts = append(starts, 'x')
	if err := os.WriteFile(startsPath, starts, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	info := fakeInfo{Bind: *bind, Join: *join, Zone: *zone, Capacity: *capacity, Starts: len(starts), PID: os.Getpid()}

	authorized := func(request *http.Request) bool {
		return request.Header.Get("Authorization") == "Bearer "+secret
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
		connection, err := net.DialTimeout("tcp", request.URL.Query().Get("address"), dialTimeout)
		if err != nil {
			http.Error(writer, err.Error(), http.StatusBadGateway)
			return
		}
		connection.Close()
		io.WriteString(writer, "ok\n")
	})
	mux.HandleFunc("POST /v1/fake/exit", func(writer http.ResponseWriter, request *http.Request) {
		fmt.Fprintln(os.Stderr, "fake herd: exiting with status 3 as asked")
		os.Exit(3)
	})
	listener, err := net.Listen("tcp", net.JoinHostPort(*bind, strconv.Itoa(AdminPort)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake herd:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "fake herd: serving on %s\n", listener.Addr())
	fmt.Fprintln(os.Stderr, http.Serve(listener, mux))
	return 1
}

// fakeCLI follows the CLI's contract: `herd --addr HOST:PORT [--token T]
// [--json] COMMAND...`, the token also from $HERD_TOKEN. Commands:
// `cluster info` (needs --json), `dial ADDRESS` (the node dials ADDRESS),
// `exit` (the node exits with status 3).
func fakeCLI(arguments []string) int {
	flags := flag.NewFlagSet("herd", flag.ContinueOnError)
	address := flags.String("addr", "", "")
	token := flags.String("token", os.Getenv(TokenVariable), "")
	jsonOutput := flags.Bool("json", false, "")
	if err := flags.Parse(arguments); err != nil {
		return 2
	}
	request := func(method, path string) (string, error) {
		httpRequest, err := http.NewRequest(method, "http://"+*address+path, nil)
		if err != nil {
			return "", err
		}
		httpRequest.Header.Set("Authorization", "Bearer "+*token)
		response, err := http.DefaultClient.Do(httpRequest)
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
