package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/testcluster"
)

// nbdWriterScript is a libnbd client that stays connected and obeys
// lines on its standard input: "w OFFSET BYTE" writes a 4 KiB block of
// BYTE and flushes ("ok SECONDS"), "r OFFSET" reads one ("data FIRST
// DISTINCT"); a failure answers "error MESSAGE".
const nbdWriterScript = `
import nbd, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "w":
            started = time.monotonic()
            h.pwrite(bytes([int(cmd[2])]) * 4096, int(cmd[1]))
            h.flush()
            print("ok %.6f" % (time.monotonic() - started), flush=True)
        elif cmd[0] == "r":
            data = h.pread(4096, int(cmd[1]))
            print("data %d %d" % (data[0], len(set(data))), flush=True)
    except nbd.Error as e:
        print("error %s" % str(e).replace("\n", " "), flush=True)
h.shutdown()
`

// scriptClient is a running python3 libnbd script: it prints "ready"
// once connected, then answers each line of its standard input with one.
type scriptClient struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startScript runs script against uri and waits for it to connect; an
// error if it cannot.
func startScript(t *testing.T, name, script, uri string) (*scriptClient, error) {
	t.Helper()
	cmd := exec.Command("/usr/bin/python3", "-c", script, uri)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	s := &scriptClient{t: t, name: name, cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			s.lines <- scanner.Text()
		}
		close(s.lines)
	}()
	select {
	case line, ok := <-s.lines:
		if ok && line == "ready" {
			return s, nil
		}
		return nil, fmt.Errorf("%s did not connect to %s: %q %s", name, uri, line, stderr.String())
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("%s did not connect to %s within 2 minutes", name, uri)
	}
}

// next returns the script's next line.
func (s *scriptClient) next() string {
	s.t.Helper()
	select {
	case line, ok := <-s.lines:
		if !ok {
			s.t.Fatalf("%s exited", s.name)
		}
		return line
	case <-time.After(2 * time.Minute):
		s.t.Fatalf("%s did not answer within 2 minutes", s.name)
	}
	return ""
}

// nbdWriter is one running nbdWriterScript.
type nbdWriter struct{ *scriptClient }

func startNBDWriter(t *testing.T, name, uri string) *nbdWriter {
	t.Helper()
	s, err := startScript(t, name, nbdWriterScript, uri)
	if err != nil {
		t.Fatal(err)
	}
	return &nbdWriter{s}
}

// write writes a block and returns how long it took, or the error line.
func (w *nbdWriter) write(offset int64, value byte) (time.Duration, string) {
	w.t.Helper()
	fmt.Fprintf(w.in, "w %d %d\n", offset, value)
	line := w.next()
	if seconds, ok := strings.CutPrefix(line, "ok "); ok {
		s, _ := strconv.ParseFloat(seconds, 64)
		return time.Duration(s * float64(time.Second)), ""
	}
	return 0, line
}

// read returns the value of a block that is all one byte.
func (w *nbdWriter) read(offset int64) byte {
	w.t.Helper()
	fmt.Fprintf(w.in, "r %d\n", offset)
	line := w.next()
	var first, distinct int
	if _, err := fmt.Sscanf(line, "data %d %d", &first, &distinct); err != nil || distinct != 1 {
		w.t.Fatalf("%s reading block at %d: %q", w.name, offset, line)
	}
	return byte(first)
}

func vdiStatus(t *testing.T, c *testcluster.Cluster, node int, name string) api.VDIStatus {
	t.Helper()
	var st api.VDIStatus
	if err := json.Unmarshal([]byte(herd(t, c, node, "--json", "vdi", "status", name)), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestWritersAlternateThroughTwoNodes: two clients, connected through two
// nodes at once, write in turn, each reading the other's write right
// after. The writer lock moves to whichever side makes a request (so
// every write below waits for a handover); each write lands exactly once.
// The write+flush times, handover included, are reported.
func TestWritersAlternateThroughTwoNodes(t *testing.T) {
	needLibnbd(t)
	c := dataCluster(t, 3, 3, "mig", "64M") // open to handover: the default
	a := startNBDWriter(t, "writer through node 0", c.Node(0).NBDURI("mig"))
	b := startNBDWriter(t, "writer through node 1", c.Node(1).NBDURI("mig"))
	const rounds = 40
	var handovers []time.Duration
	for i := range rounds {
		side, other := a, b
		if i%2 == 1 {
			side, other = b, a
		}
		offset := int64(i%8) * 4096 * 33 // blocks in two objects, rewritten
		value := byte(1 + i)
		took, failure := side.write(offset, value)
		if failure != "" {
			t.Fatalf("round %d: %s: %s", i, side.name, failure)
		}
		handovers = append(handovers, took)
		if got := other.read(offset); got != value {
			t.Fatalf("round %d: %s reads %d at %d after the other side wrote %d", i, other.name, got, offset, value)
		}
	}
	// Every block holds its last write, read through the third node.
	third := startNBDWriter(t, "reader through node 2", c.Node(2).NBDURI("ro/mig"))
	for i := rounds - 8; i < rounds; i++ {
		if got := third.read(int64(i%8) * 4096 * 33); got != byte(1+i) {
			t.Fatalf("block %d reads %d, want %d", i%8, got, 1+i)
		}
	}
	st := vdiStatus(t, c, 2, "mig")
	if st.VDI.Handovers < rounds-1 {
		t.Errorf("the log counts %d handovers, want at least %d", st.VDI.Handovers, rounds-1)
	}
	writers, standby := 0, 0
	for _, o := range st.Opens {
		switch {
		case o.Writer:
			writers++
		case o.Standby:
			standby++
		}
	}
	// The last request was node 0's read (a standby's read takes the
	// lock too): node 0 holds it, node 1 waits on standby.
	if writers != 1 || standby != 1 || st.Lock == nil || st.Lock.Node != nodeID(t, c, 0) {
		t.Errorf("status after the last read through node 0: %+v", st)
	}
	if list := herd(t, c, 2, "vdi", "list"); !strings.Contains(list, nodeID(t, c, 0)) {
		t.Errorf("vdi list does not show the writer node %s:\n%s", nodeID(t, c, 0), list)
	}
	// The baseline, in the same cluster: the same writes through the
	// holder, no handover.
	var plain []time.Duration
	for i := range rounds {
		took, failure := a.write(int64(i%8)*4096*33, byte(100+i))
		if failure != "" {
			t.Fatalf("write %d through the holder: %s", i, failure)
		}
		plain = append(plain, took)
	}
	summary := func(d []time.Duration) string {
		slices.Sort(d)
		p := func(q float64) time.Duration { return d[int(q*float64(len(d)-1))].Round(time.Microsecond) }
		return fmt.Sprintf("%d samples: p50 %v, p99 %v, max %v", len(d), p(0.5), p(0.99), d[len(d)-1].Round(time.Microsecond))
	}
	t.Logf("handover: write+flush after the lock moved, %s; without a handover (baseline), %s", summary(handovers), summary(plain))
}
