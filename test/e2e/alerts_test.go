package e2e

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testenv"
)

// dashboardPanel is a Grafana panel as far as the test reads it.
type dashboardPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"`
}

// TestAlertRulesAndDashboard: deploy/prometheus/herd-alerts.yml passes
// `promtool check rules`, the Grafana dashboard is valid JSON with a query
// in every panel, and every herd_ metric either names is one a running
// node exports (so a renamed metric cannot leave an alert that never
// fires).
func TestAlertRulesAndDashboard(t *testing.T) {
	promtool := testenv.LookPath(t, "promtool", "prometheus")
	rules := "../../deploy/prometheus/herd-alerts.yml"
	if out, err := run(t, time.Minute, promtool, "check", "rules", rules); err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	rulesText, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	dashboardText, err := os.ReadFile("../../deploy/grafana/herd-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Title  string           `json:"title"`
		Panels []dashboardPanel `json:"panels"`
	}
	if err := json.Unmarshal(dashboardText, &dashboard); err != nil || dashboard.Title == "" || len(dashboard.Panels) == 0 {
		t.Fatalf("the Grafana dashboard: %v (title %q, %d panels)", err, dashboard.Title, len(dashboard.Panels))
	}
	// Every panel, those in rows too (a row's panels are nested in it
	// when it is collapsed); a row itself has no query.
	var exprs []string
	var walk func(panels []dashboardPanel)
	walk = func(panels []dashboardPanel) {
		for _, p := range panels {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
				t.Fatalf("dashboard panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				if target.Expr == "" {
					t.Fatalf("dashboard panel %q has an empty query", p.Title)
				}
				exprs = append(exprs, target.Expr)
			}
		}
	}
	walk(dashboard.Panels)

	need(t, "qemu-io")
	// Two nodes (peer metrics), and a client connected while /metrics is
	// read (the per-VDI NBD series exist only while a VDI is open).
	c := dataCluster(t, 2, 2, "vm1", "64M")
	writer := startQemuWriter(t, c.Node(0).NBDSocket(), "vm1")
	writer.write(0)
	defer writer.quit()
	// The capacity metrics come from the last capacity node 0 computed
	// (the leader's each minute; any node's for cluster info or health).
	herd(t, c, 0, "cluster", "info")
	families, status := scrape(t, c.Node(0).AdminAddr(), c.Token())
	if status != 200 {
		t.Fatalf("/metrics: HTTP %d", status)
	}
	exported := map[string]bool{}
	for name, family := range families {
		exported[name] = true
		if family.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				exported[name+suffix] = true
			}
		}
	}
	names := regexp.MustCompile(`\bherd_[a-z0-9_]+`)
	missing := map[string]bool{}
	for _, text := range append(exprs, string(rulesText)) {
		for _, name := range names.FindAllString(text, -1) {
			if !exported[name] {
				missing[name] = true
			}
		}
	}
	if len(missing) > 0 {
		var list []string
		for name := range missing {
			list = append(list, name)
		}
		sort.Strings(list)
		t.Fatalf("the alert rules or the dashboard use metrics a node does not export: %v", list)
	}
}
