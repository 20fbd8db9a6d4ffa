package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestVDISeriesLiveWhileOpen(t *testing.T) {
	n := New()
	a := n.OpenVDI("vm1")
	b := n.OpenVDI("vm1") // a second connection shares the series
	a.Observe(OpWrite, 4096, time.Now(), nil)
	b.Observe(OpWrite, 4096, time.Now(), errors.New("EIO"))
	if got := testutil.ToFloat64(n.nbdBytes.WithLabelValues("vm1", "write")); got != 8192 {
		t.Fatalf("bytes %v, want 8192", got)
	}
	if got := testutil.ToFloat64(n.nbdErrors.WithLabelValues("vm1", "write")); got != 1 {
		t.Fatalf("errors %v, want 1", got)
	}
	n.CloseVDI("vm1")
	if c := testutil.CollectAndCount(n.nbdRequests); c == 0 {
		t.Fatal("series gone while a connection still has the VDI open")
	}
	n.CloseVDI("vm1")
	for _, name := range []string{"herd_nbd_requests_total", "herd_nbd_bytes_total", "herd_nbd_request_duration_seconds"} {
		if c := testutil.CollectAndCount(n.Registry, name); c != 0 {
			t.Errorf("%s: %d series after the last close, want 0", name, c)
		}
	}
	var nilNode *Node
	nilNode.OpenVDI("x").Observe(OpRead, 1, time.Now(), nil) // no metrics: no panic
}

func TestGauges(t *testing.T) {
	n := New()
	n.AddGauges(Gauge{Name: "herd_test_disk_bytes", Help: "test", Labels: []string{"disk"}, Read: func() []Sample {
		return []Sample{{Labels: []string{"/a"}, Value: 3}, {Labels: []string{"/b"}, Value: 4}}
	}})
	want := "# HELP herd_test_disk_bytes test\n# TYPE herd_test_disk_bytes gauge\nherd_test_disk_bytes{disk=\"/a\"} 3\nherd_test_disk_bytes{disk=\"/b\"} 4\n"
	if err := testutil.GatherAndCompare(n.Registry, strings.NewReader(want), "herd_test_disk_bytes"); err != nil {
		t.Fatal(err)
	}
}
