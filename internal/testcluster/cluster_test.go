package testcluster

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests drive Start and the node controls against the fake herd in
// main_test.go; tests of the real binary live with the packages they test.

// info returns the fake herd's `cluster info` of a node.
func info(t *testing.T, c *Cluster, index int) fakeInfo {
	t.Helper()
	var result fakeInfo
	if err := c.HerdJSON(t.Context(), index, &result, "cluster", "info"); err != nil {
		t.Fatal(err)
	}
	return result
}

func TestClusterLoopback(t *testing.T) {
	c := Start(t, Options{Nodes: 3, Zones: []string{"a", "b"}, Capacity: "1G", binary: fakeBinary(t)})
	if c.Token() == "" || c.JoinToken() == "" {
		t.Fatalf("admin token %q, join token %q, want both set", c.Token(), c.JoinToken())
	}
	if c.Token() == c.JoinToken() {
		t.Errorf("the admin token is the join token")
	}
	for file, want := range map[string]string{tokenFile: c.Token(), joinTokenFile: c.JoinToken()} {
		path := filepath.Join(c.Node(0).DataDir(), file)
		fileInfo, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if mode := fileInfo.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s mode %v, want 0600", file, mode)
		}
		if contents, err := os.ReadFile(path); err != nil || strings.TrimSpace(string(contents)) != want {
			t.Errorf("%s holds %q (%v), want the token %q", file, contents, err, want)
		}
	}
	for _, node := range c.Nodes()[1:] {
		for _, file := range []string{tokenFile, joinTokenFile} {
			if _, err := os.Stat(filepath.Join(node.DataDir(), file)); err == nil {
				t.Errorf("joining node %d wrote %s", node.Index(), file)
			}
		}
	}
	first := c.Node(0).Address()
	if !strings.HasPrefix(first, "127.") || strings.HasPrefix(first, "127.0.0.") {
		t.Errorf("node 0 address %s, want 127.A.B.1 away from 127.0.0.x", first)
	}
	for index, node := range c.Nodes() {
		got := info(t, c, index)
		want := fakeInfo{Bind: node.Address(), Zone: []string{"a", "b"}[index%2], Capacity: "1G", Starts: 1, PID: node.PID()}
		if index > 0 {
			want.Join = first
		}
		if got != want {
			t.Errorf("node %d: cluster info %+v, want %+v", index, got, want)
		}
	}
	if _, stderr, err := c.Herd(t.Context(), 0, "no", "such", "command"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("Herd(no such command) = %v (stderr %q), want an error quoting stderr", err, stderr)
	}

	// Kill and restart on the same data directory and arguments.
	killed := c.Node(2)
	oldPID := killed.PID()
	killed.Kill()
	if killed.Running() {
		t.Fatal("node 2 runs after Kill")
	}
	if err := killed.Health(t.Context()); err == nil {
		t.Fatal("node 2 is healthy after Kill")
	}
	killed.Restart()
	if got := info(t, c, 2); got.Starts != 2 || got.Join != first || got.PID == oldPID || got.PID != killed.PID() {
		t.Errorf("node 2 after Restart: %+v, want a second start with --join %s and a new pid", got, first)
	}

	// Pause and resume.
	paused := c.Node(1)
	paused.Pause()
	if !paused.Paused() || !paused.Running() {
		t.Errorf("Paused() = %v, Running() = %v after Pause, want true, true", paused.Paused(), paused.Running())
	}
	if running := runningThreads(t, paused.PID()); len(running) > 0 {
		t.Errorf("threads of node 1 not stopped after Pause (thread: state): %v", running)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := paused.Health(ctx); err == nil {
		t.Error("a paused node answered /v1/health")
	}
	paused.Resume()
	WaitFor(t, 10*time.Second, "node 1 to answer after Resume", func() (bool, error) {
		err := paused.Health(t.Context())
		return err == nil, err
	})

	// Stop works on a paused node too.
	paused.Pause()
	paused.Stop()
	if paused.Running() {
		t.Fatal("node 1 runs after Stop")
	}

	// A new node joins through every running node (0 and 2).
	added := c.AddNode()
	if added.Index() != 3 {
		t.Errorf("AddNode index %d, want 3", added.Index())
	}
	if got, want := info(t, c, 3).Join, first+","+c.Node(2).Address(); got != want {
		t.Errorf("added node joined %q, want %q", got, want)
	}
	if got := info(t, c, 3).Zone; got != "b" {
		t.Errorf("added node zone %q, want b (Zones[3%%2])", got)
	}
}

// TestClusterReportsCrash checks that a node exiting on its own fails the
// test and prints its log.
func TestClusterReportsCrash(t *testing.T) {
	binary := fakeBinary(t)
	t.Setenv("HERD_TEST_LOGS", t.TempDir()) // where the failed cleanup keeps the logs
	var c *Cluster
	recorder := runRecorded(t, func(tb testing.TB) {
		c = Start(tb, Options{Nodes: 1, binary: binary})
		if _, _, err := c.Herd(t.Context(), 0, "exit"); err == nil {
			tb.Errorf("exit answered")
		}
		WaitFor(tb, 10*time.Second, "node 0 to exit", func() (bool, error) { return !c.Node(0).Running(), nil })
		c.cleanup()
	})
	if got := recorder.recorded(); !strings.Contains(got, "node 0") || !strings.Contains(got, "exited without being asked to: exit status 3") {
		t.Errorf("recorded %q, want a report of node 0's crash", got)
	}
}

// TestClusterReportsDataRace checks that a race report in a node's log
// fails the test with the report, though the node never exited, and that a
// node log without one fails nothing.
func TestClusterReportsDataRace(t *testing.T) {
	binary := fakeBinary(t)
	t.Setenv("HERD_TEST_LOGS", t.TempDir()) // where the failed cleanup keeps the logs
	recorder := runRecorded(t, func(tb testing.TB) {
		c := Start(tb, Options{Nodes: 2, binary: binary})
		if _, _, err := c.Herd(t.Context(), 1, "race"); err != nil {
			tb.Errorf("race: %v", err)
		}
		c.cleanup()
	})
	got := recorder.recorded()
	for _, want := range []string{"node 1 reported 1 data race(s)", "WARNING: DATA RACE", "Previous write at", "Goroutine"} {
		if !strings.Contains(got, want) {
			t.Errorf("recorded %q, want it to contain %q", got, want)
		}
	}
	if strings.Contains(got, "node 0 reported") {
		t.Errorf("recorded %q: node 0 had no race", got)
	}
}

func TestRaceReports(t *testing.T) {
	report := func(where string) string {
		return "==================\nWARNING: DATA RACE\nWrite at 0x00c000096028 by goroutine 8:\n  " + where +
			"()\n      /x.go:8 +0x33\n\nPrevious write at 0x00c000096028 by main goroutine:\n  main.main()\n==================\n"
	}
	for _, test := range []struct {
		name, log string
		count     int
		first     []string // lines the excerpt has
		not       []string // text it must not have
	}{
		{name: "empty"},
		{name: "no race", log: "=== testcluster: starting node 0\ntime=... level=INFO msg=\"WARNING: DATA RACE\" inside a line\n"},
		{name: "one", log: "start\n" + report("main.first") + "after\n", count: 1,
			first: []string{"WARNING: DATA RACE", "main.first()", "Previous write at"}, not: []string{"start", "after"}},
		{name: "two", log: report("main.first") + "between\n" + report("main.second"), count: 2,
			first: []string{"main.first()"}, not: []string{"main.second", "between"}},
		{name: "cut short by a kill", log: "==================\nWARNING: DATA RACE\nWrite at 0x1 by goroutine 8:", count: 1,
			first: []string{"Write at 0x1 by goroutine 8:"}},
		{name: "long line", log: strings.Repeat("x", 2<<20) + "\n" + report("main.after"), count: 1, first: []string{"main.after()"}},
	} {
		t.Run(test.name, func(t *testing.T) {
			count, first, err := raceReports(strings.NewReader(test.log))
			if err != nil || count != test.count {
				t.Fatalf("raceReports = %d, %v; want %d reports", count, err, test.count)
			}
			if test.count > 0 && !strings.HasPrefix(first, raceReportFrame+"\n"+raceReportStart) {
				t.Errorf("excerpt %q does not start with the report", first)
			}
			for _, want := range test.first {
				if !strings.Contains(first, want) {
					t.Errorf("excerpt %q lacks %q", first, want)
				}
			}
			for _, unwanted := range test.not {
				if strings.Contains(first, unwanted) {
					t.Errorf("excerpt %q has %q, which is outside the first report", first, unwanted)
				}
			}
		})
	}
	// An endless report is cut.
	endless := "WARNING: DATA RACE\n" + strings.Repeat("  frame\n", 10*raceExcerptLines)
	if _, first, _ := raceReports(strings.NewReader(endless)); strings.Count(first, "\n")+1 != raceExcerptLines {
		t.Errorf("excerpt of an endless report has %d lines, want %d", strings.Count(first, "\n")+1, raceExcerptLines)
	}
}

// TestClusterStartFailure checks that a node exiting during its start fails
// Start with the exit status and the end of the node's log.
func TestClusterStartFailure(t *testing.T) {
	binary := fakeBinary(t)
	t.Setenv("HERD_TEST_LOGS", t.TempDir()) // where the failed cleanup keeps the logs
	recorder := runRecorded(t, func(tb testing.TB) {
		Start(tb, Options{Nodes: 1, Zones: []string{"crash"}, binary: binary})
		tb.Errorf("Start returned")
	})
	got := recorder.recorded()
	for _, want := range []string{"node 0", "did not become healthy", "exit status 7", "fake herd: crashing as asked"} {
		if !strings.Contains(got, want) {
			t.Errorf("Start failure %q lacks %q", got, want)
		}
	}
}

// TestClusterNamespaces checks Partition and Heal through the fake herd's
// dial command: the CLI runs in the root namespace, the dial from inside a
// node's namespace.
func TestClusterNamespaces(t *testing.T) {
	requireNamespaces(t)
	binary := fakeBinary(t)
	var prefix string
	t.Run("cluster", func(t *testing.T) {
		c := Start(t, Options{Nodes: 3, Namespaces: true, binary: binary})
		prefix = c.network.prefix
		for _, node := range c.Nodes() {
			if node.Namespace() == "" || !strings.HasPrefix(node.Address(), "10.") {
				t.Errorf("node %d: namespace %q, address %s, want a namespace and a 10.x address", node.Index(), node.Namespace(), node.Address())
			}
		}
		reaches := func(from, to int) bool {
			_, _, err := c.Herd(t.Context(), from, "dial", c.Node(to).AdminAddr())
			return err == nil
		}
		check := func(when string, open, cut [][2]int) {
			t.Helper()
			for _, pair := range open {
				if !reaches(pair[0], pair[1]) {
					t.Errorf("%s: node %d cannot reach node %d", when, pair[0], pair[1])
				}
			}
			for _, pair := range cut {
				if reaches(pair[0], pair[1]) {
					t.Errorf("%s: node %d reaches node %d, want it cut off", when, pair[0], pair[1])
				}
			}
		}
		all := [][2]int{{0, 1}, {1, 0}, {1, 2}, {2, 0}}
		check("before Partition", all, nil)
		c.Partition([]int{0}, []int{1, 2})
		check("after Partition({0}, {1, 2})", [][2]int{{1, 2}, {2, 1}}, [][2]int{{0, 1}, {1, 0}, {2, 0}})
		c.Heal()
		check("after Heal", all, nil)

		// A node restarted in its namespace keeps its address.
		c.Node(1).Kill()
		c.Node(1).Restart()
		check("after restarting node 1", [][2]int{{0, 1}}, nil)
		added := c.AddNode()
		if !slices.Contains(c.Nodes(), added) || added.Namespace() == "" {
			t.Errorf("added node %d has no namespace", added.Index())
		}
	})
	if prefix != "" {
		checkNothingLeft(t, prefix)
	}
}

func TestServerArguments(t *testing.T) {
	got := serverArguments("/d", "127.1.2.3", []string{"127.1.2.1", "127.1.2.2"}, "z1", "10G", []string{"--log-level", "debug"})
	want := []string{"server", "--data", "/d", "--bind", "127.1.2.3", "--join", "127.1.2.1,127.1.2.2",
		"--zone", "z1", "--capacity", "10G", "--log-level", "debug"}
	if !slices.Equal(got, want) {
		t.Errorf("serverArguments = %q, want %q", got, want)
	}
	if got := serverArguments("/d", "127.1.2.1", nil, "", "", nil); !slices.Equal(got, []string{"server", "--data", "/d", "--bind", "127.1.2.1"}) {
		t.Errorf("first node's arguments = %q", got)
	}
}

func TestChildEnvironment(t *testing.T) {
	t.Setenv(TokenVariable, "developer-token")
	t.Setenv(JoinTokenVariable, "developer-join-token")
	t.Setenv("HTTP_PROXY", "http://proxy.invalid")
	environment := childEnvironment(TokenVariable+"=cluster", JoinTokenVariable+"=cluster-join")
	for _, unwanted := range []string{TokenVariable + "=developer-token", JoinTokenVariable + "=developer-join-token", "HTTP_PROXY=http://proxy.invalid"} {
		if slices.Contains(environment, unwanted) {
			t.Errorf("childEnvironment kept %s from the test's environment", unwanted)
		}
	}
	for _, want := range []string{TokenVariable + "=cluster", JoinTokenVariable + "=cluster-join"} {
		if !slices.Contains(environment, want) {
			t.Errorf("childEnvironment dropped the extra variable %s", want)
		}
	}
}

func TestOwnerAlive(t *testing.T) {
	if !ownerAlive(ownerRecord()) {
		t.Errorf("ownerAlive(own record %q) = false", ownerRecord())
	}
	if ownerAlive("2147483647 1") {
		t.Error("ownerAlive of a pid above pid_max = true")
	}
	if ownerAlive(strings.Fields(ownerRecord())[0] + " 1") {
		t.Error("ownerAlive of this pid with another start time = true")
	}
}

func TestModuleRoot(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	contents, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !declaresModule(contents, modulePath) {
		t.Errorf("moduleRoot() = %s, whose go.mod does not declare %s (%v)", root, modulePath, err)
	}
}

func TestPickLoopbackPrefix(t *testing.T) {
	prefix, err := pickLoopbackPrefix(3)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(prefix, "127.") || strings.HasPrefix(prefix, "127.0.") || !strings.HasSuffix(prefix, ".") {
		t.Errorf("pickLoopbackPrefix = %q, want 127.A.B. with A >= 10", prefix)
	}
}

// runningThreads returns "TID: STATE" for every thread of pid that is not
// stopped (state T in /proc/PID/task/TID/stat).
func runningThreads(t *testing.T, pid int) []string {
	t.Helper()
	taskDirectory := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(taskDirectory)
	if err != nil {
		t.Fatal(err)
	}
	var running []string
	for _, task := range tasks {
		stat, err := os.ReadFile(filepath.Join(taskDirectory, task.Name(), "stat"))
		if err != nil {
			t.Fatal(err)
		}
		// The state is the first field after the parenthesized command name.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) == 0 || fields[0] != "T" {
			running = append(running, task.Name()+": "+strings.Join(fields[:min(1, len(fields))], ""))
		}
	}
	return running
}
