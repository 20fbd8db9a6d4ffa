package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/objproto"
	"github.com/herd-storage/herd/internal/store"
	"github.com/herd-storage/herd/internal/testcluster"
)

// scrape reads a node's /metrics with token and parses it with the
// Prometheus text parser.
func scrape(t *testing.T, address, token string) (map[string]*dto.MetricFamily, int) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer client.CloseIdleConnections() // a connection left per scrape would hold a place on the node
	request, _ := http.NewRequest("GET", "https://"+address+"/metrics", nil)
	if token != "" {
		request.Header.Set("Authorization", "Bearer "+token)
	}
	response, err := client.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		io.Copy(io.Discard, response.Body)
		return nil, response.StatusCode
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(response.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return families, response.StatusCode
}

// value is the value of the series of family name whose labels include
// labels: a counter's or gauge's value, a histogram's count; -1 if none.
func value(families map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	family := families[name]
	if family == nil {
		return -1
	}
	total, found := 0.0, false
next:
	for _, m := range family.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	if !found {
		return -1
	}
	return total
}

// TestMetrics: /metrics needs a token (a read-only one does), parses as
// Prometheus text, and its counters move while fio writes and reads a VDI
// through the node; the VDI's series go when its last connection closes.
func TestMetrics(t *testing.T) {
	need(t, "fio")
	c := dataCluster(t, 2, 2, "vm1", "256M")
	admin := c.Node(0).AdminAddr()
	if _, status := scrape(t, admin, ""); status != http.StatusUnauthorized {
		t.Fatalf("/metrics without a token: HTTP %d, want 401", status)
	}
	// As the README has it: token create ... > FILE makes a token file
	// (the token alone on stdout, the words on stderr).
	stdout, stderr, err := c.Herd(ctx(t), 0, "token", "create", "prometheus", "--read-only")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, stderr)
	}
	tokenFile := filepath.Join(t.TempDir(), "prometheus.token")
	if err := os.WriteFile(tokenFile, []byte(stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	if info, _, err := c.Herd(ctx(t), 1, "--token-file", tokenFile, "cluster", "info"); err != nil || !strings.Contains(info, "Quorum:") {
		t.Fatalf("cluster info with --token-file of the redirected stdout: %v\n%s", err, info)
	}
	token := strings.TrimSpace(stdout)

	families, _ := scrape(t, admin, token)
	for _, name := range []string{"herd_cluster_epoch", "herd_cluster_quorum", "herd_cluster_feature_level", "herd_disk_capacity_bytes", "herd_raft_apply_duration_seconds", "go_goroutines", "process_resident_memory_bytes"} {
		if v := value(families, name, nil); v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	// raft's and memberlist's own measurements, routed from go-metrics.
	for _, name := range []string{"herd_raft_fsm_applyBatchNum", "herd_memberlist_gossip"} {
		if f := families[name]; f == nil || len(f.Metric) == 0 || f.Metric[0].GetSummary().GetSampleCount() == 0 {
			t.Errorf("%s: no samples (%v)", name, f)
		}
	}
	if f := families["herd_build_info"]; f == nil || len(f.Metric) != 1 || labelValue(f.Metric[0], "supported_feature_level") != strconv.Itoa(cluster.SupportedLevel) || labelValue(f.Metric[0], "commit") == "" ||
		labelValue(f.Metric[0], "object_format") != strconv.Itoa(store.FormatVersion) || labelValue(f.Metric[0], "object_protocol") != strconv.Itoa(objproto.ObjectProtocolVersion) {
		t.Errorf("herd_build_info: %v; want one series with the commit, supported_feature_level %d, object_format %d and object_protocol %d", f, cluster.SupportedLevel, store.FormatVersion, objproto.ObjectProtocolVersion)
	}
	if v := value(families, "herd_cluster_nodes", map[string]string{"state": "alive"}); v != 2 {
		t.Errorf("herd_cluster_nodes{state=alive} = %v, want 2", v)
	}

	fio, out := startFio(t, "metrics", c.Node(0).NBDURI("vm1"), "rw=randrw\nbs=4k\niodepth=8\nsize=64M\ntime_based=1\nruntime=20\n")
	vm1 := func(op string) map[string]string { return map[string]string{"vdi": "vm1", "op": op} }
	var first map[string]*dto.MetricFamily
	testcluster.WaitFor(t, 30*time.Second, "fio's requests in the metrics", func() (bool, error) {
		first, _ = scrape(t, admin, token)
		return value(first, "herd_nbd_requests_total", vm1("write")) > 0, fmt.Errorf("fio output so far: %s", out.String())
	})
	testcluster.WaitFor(t, 30*time.Second, "the counters to move while fio runs", func() (bool, error) {
		now, _ := scrape(t, admin, token)
		for _, check := range []struct {
			name string
			op   string
		}{{"herd_nbd_requests_total", "write"}, {"herd_nbd_requests_total", "read"}, {"herd_nbd_bytes_total", "write"}, {"herd_nbd_bytes_total", "read"}, {"herd_nbd_request_duration_seconds", "write"}} {
			if value(now, check.name, vm1(check.op)) <= value(first, check.name, vm1(check.op)) {
				return false, fmt.Errorf("%s{op=%s} did not move: %v then %v", check.name, check.op, value(first, check.name, vm1(check.op)), value(now, check.name, vm1(check.op)))
			}
		}
		if v := value(now, "herd_nbd_connections", nil); v < 1 {
			return false, fmt.Errorf("herd_nbd_connections = %v while fio runs", v)
		}
		// copies 2: every write also goes to node 1.
		if v := value(now, "herd_peer_request_duration_seconds", map[string]string{"op": "WRITE"}); v <= 0 {
			return false, fmt.Errorf("no WRITE to node 1 in herd_peer_request_duration_seconds (%v)", v)
		}
		return true, nil
	})
	if err := fio.Wait(); err != nil {
		t.Fatalf("fio: %v\n%s", err, out.String())
	}
	testcluster.WaitFor(t, 30*time.Second, "vm1's series to go with its last connection", func() (bool, error) {
		now, _ := scrape(t, admin, token)
		v, conns := value(now, "herd_nbd_requests_total", vm1("write")), value(now, "herd_nbd_connections", nil)
		return v == -1 && conns == 0, fmt.Errorf("herd_nbd_requests_total{vdi=vm1,op=write} %v, connections %v", v, conns)
	})
}

// labelValue is the value of metric's label name ("" if it has none).
func labelValue(metric *dto.Metric, name string) string {
	for _, l := range metric.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
