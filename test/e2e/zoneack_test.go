package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/api"
	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
)

// zoneClientScript is a libnbd client obeying lines on its standard
// input: "w OFFSET LENGTH BYTE" writes LENGTH bytes of BYTE in 4 MiB
// requests without a flush, "f" flushes (both answer "ok"), "r OFFSET
// LENGTH" reads ("data FIRST DISTINCT"); a failure answers "error ...".
const zoneClientScript = `
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("ready", flush=True)
chunk = 4 << 20
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "w":
            off, n = int(cmd[1]), int(cmd[2])
            for at in range(off, off + n, chunk):
                h.pwrite(bytes([int(cmd[3])]) * min(chunk, off + n - at), at)
            print("ok", flush=True)
        elif cmd[0] == "f":
            h.flush()
            print("ok", flush=True)
        elif cmd[0] == "r":
            off, n = int(cmd[1]), int(cmd[2])
            seen, first = set(), None
            for at in range(off, off + n, chunk):
                data = h.pread(min(chunk, off + n - at), at)
                if first is None:
                    first = data[0]
                seen |= set(data)
            print("data %d %d" % (first, len(seen)), flush=True)
    except nbd.Error as e:
        print("error %s" % str(e).replace("\n", " "), flush=True)
`

// zoneClient is one running zoneClientScript.
type zoneClient struct{ *scriptClient }

func startZoneClient(t *testing.T, uri string) *zoneClient {
	t.Helper()
	z, err := openZoneClient(t, uri)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// openZoneClient starts a client; an error if it cannot connect.
func openZoneClient(t *testing.T, uri string) (*zoneClient, error) {
	t.Helper()
	s, err := startScript(t, "the NBD client", zoneClientScript, uri)
	if err != nil {
		return nil, err
	}
	return &zoneClient{s}, nil
}

// do sends a command and returns its answer.
func (z *zoneClient) do(command string) string {
	z.t.Helper()
	fmt.Fprintln(z.in, command)
	return z.next()
}

func (z *zoneClient) ok(command string) {
	z.t.Helper()
	if line := z.do(command); line != "ok" {
		z.t.Fatalf("%q: %s", command, line)
	}
}

// TestZoneAck: a VDI set to --ack zone (cluster.AckZone,
// internal/gateway/lag.go), four nodes in two zones 50 ms apart, copies 2
// (one per zone), written through node 0 (zone a):
//   - writes are acknowledged while zone b's node 1 is paused, without
//     waiting for the epoch that drops it, and read back at once;
//   - the FLUSH after them completes only once every replica has them:
//     after that epoch, and zone b alone (node 3) then reads them all;
//   - node 1's stale copies, when it returns, are never served;
//   - the writer's node killed -9 with writes acknowledged in zone a and
//     not yet in zone b (node 3 paused): through the next writer every
//     object reads the data of the last FLUSH or the newer data, whole,
//     and nothing else (writes after the last FLUSH may be lost with the
//     writer's node: the documented trade-off, lag.go).
func TestZoneAck(t *testing.T) {
	need(t, "qemu-io")
	needLibnbd(t)
	const oneWay = 25 * time.Millisecond
	const objects = 16 // 64 MiB: never more than the default --zone-lag pending, so no write waits for node 1
	const size = objects << 22
	c := testcluster.Start(t, testcluster.Options{Nodes: 4, Zones: []string{"a", "b"}, ZoneDelay: oneWay})
	waitAgreement(t, c, []int{0, 1, 2, 3}, time.Minute)
	herd(t, c, 0, "cluster", "format", "--copies", "2")
	herd(t, c, 0, "vdi", "create", "za", fmt.Sprint(size))
	if out, stderr, err := c.Herd(ctx(t), 0, "vdi", "set", "za", "--ack", "far"); err == nil || !strings.Contains(stderr, `"zone"`) {
		t.Fatalf("--ack far: want an error naming the modes, got %v\n%s%s", err, out, stderr)
	}
	if out := herd(t, c, 0, "vdi", "set", "za", "--ack", "zone"); !strings.Contains(out, "Acknowledge:") || !strings.Contains(out, "zone (") {
		t.Fatalf("vdi set --ack zone printed:\n%s", out)
	}
	var vdi cluster.VDI
	if err := c.HerdJSON(ctx(t), 0, &vdi, "vdi", "info", "za"); err != nil {
		t.Fatal(err)
	}
	if vdi.Ack != cluster.AckZone {
		t.Fatalf("vdi info: ack %q, want %q", vdi.Ack, cluster.AckZone)
	}
	var created api.CreatedToken
	if err := c.HerdJSON(ctx(t), 0, &created, "token", "create", "prometheus", "--read-only"); err != nil {
		t.Fatal(err)
	}
	lag := func() float64 {
		families, _ := scrape(t, c.Node(0).AdminAddr(), created.Secret)
		return value(families, "herd_gateway_zone_lag_bytes", nil)
	}
	writer := startZoneClient(t, c.Node(0).NBDURI("za"))
	writer.ok(fmt.Sprintf("w 0 %d 17", size))
	writer.ok("f")

	// Acknowledged in zone a while node 1 (zone b) does not answer.
	before, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	c.Node(1).Pause()
	start := time.Now()
	writer.ok(fmt.Sprintf("w 0 %d 34", size))
	took := time.Since(start)
	during, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if during.Epoch != before.Epoch {
		t.Fatalf("the writes took %v and returned in epoch %d, after epoch %d: they waited for node 1 to be dropped, not for zone a alone", took, during.Epoch, before.Epoch)
	}
	pending := lag()
	if pending <= 0 {
		t.Fatalf("herd_gateway_zone_lag_bytes %v with node 1 paused after the writes: want the bytes still on their way to it", pending)
	}
	t.Logf("%d MiB acknowledged in zone a with node 1 paused: %v, %.0f MiB on their way to zone b", size>>20, took.Round(time.Millisecond), pending/(1<<20))
	if got := writer.do(fmt.Sprintf("r 0 %d", size)); got != "data 34 1" {
		t.Fatalf("read back at once: %s", got)
	}

	// The FLUSH needs every replica: it completes after the epoch that
	// drops node 1, whose share goes to node 3.
	writer.ok("f")
	after, err := client(c, 0).Info(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if after.Epoch == before.Epoch {
		t.Fatalf("the FLUSH completed in epoch %d with node 1 paused and still a member", after.Epoch)
	}
	if pending := lag(); pending != 0 {
		t.Fatalf("herd_gateway_zone_lag_bytes %v after the FLUSH, want 0", pending)
	}
	if out, err := qemuIOReadOnly(t, c.Node(3).NBDURI("ro/za"), fmt.Sprintf("read -P 0x22 0 %d", size)); err != nil {
		t.Fatalf("zone b alone (node 3) after the FLUSH: %v\n%s", err, out)
	}

	// Node 1 returns with copies that missed the writes.
	c.Node(1).Resume()
	testcluster.WaitFor(t, 2*time.Minute, "node 1 back in the epoch", func() (bool, error) {
		info, err := client(c, 0).Info(ctx(t))
		return err == nil && info.NodesAlive == 4, fmt.Errorf("%+v %v", info, err)
	})
	if out, err := qemuIOReadOnly(t, c.Node(1).NBDURI("ro/za"), fmt.Sprintf("read -P 0x22 0 %d", size)); err != nil {
		t.Fatalf("through node 1, back: %v\n%s", err, out)
	}

	// The writer's node dies with writes only in zone a.
	c.Node(3).Pause()
	writer.ok(fmt.Sprintf("w 0 %d 51", size))
	c.Node(0).Kill()
	c.Node(3).Resume()
	testcluster.WaitFor(t, 2*time.Minute, "an epoch without node 0", func() (bool, error) {
		info, err := client(c, 2).Info(ctx(t))
		return err == nil && info.NodesAlive == 3, fmt.Errorf("%+v %v", info, err)
	})
	var next *zoneClient
	testcluster.WaitFor(t, 2*time.Minute, "node 2 serving za (a new raft leader, the repair)", func() (bool, error) {
		z, err := openZoneClient(t, c.Node(2).NBDURI("za"))
		next = z
		return err == nil, err
	})
	kept, lost := 0, 0
	for i := range objects {
		switch got := next.do(fmt.Sprintf("r %d %d", i<<22, 4<<20)); got {
		case "data 51 1":
			kept++
		case "data 34 1":
			lost++
		default:
			t.Errorf("object %d after the writer's node died: %s (want all 0x33 = 51, or all 0x22 = 34 of the last FLUSH)", i, got)
		}
	}
	t.Logf("after the writer's node died: %d objects kept the writes after the last FLUSH, %d lost them", kept, lost)
}
