package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func lines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestRaftLinesJoinTheStream(t *testing.T) {
	var b bytes.Buffer
	logger, err := New(&b, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	raft := Hclog(logger, "raft")
	raft.Info("entering follower state", "follower", "n1")         // raft's Info is herd's Debug: not at info
	raft.Warn("failed to contact", "server-id", "n2", "time", 1.5) // kept, with its pairs
	raft.Named("snapshot").Error("failed", "err", "disk full", "odd")
	got := lines(t, &b)
	if len(got) != 2 {
		t.Fatalf("%d lines, want 2 (raft's Info hidden at level info): %v", len(got), got)
	}
	if got[0]["level"] != "WARN" || got[0]["msg"] != "failed to contact" || got[0]["component"] != "raft" || got[0]["server-id"] != "n2" || got[0]["time_"] != 1.5 {
		// "time" from raft must not replace the record's time.
		t.Errorf("warn line: %v", got[0])
	}
	if got[1]["level"] != "ERROR" || got[1]["subsystem"] != "raft.snapshot" || got[1]["err"] != "disk full" || got[1]["extra"] != "odd" {
		t.Errorf("error line: %v", got[1])
	}
	if raft.IsInfo() || !raft.IsWarn() {
		t.Errorf("IsInfo %v, IsWarn %v at level info", raft.IsInfo(), raft.IsWarn())
	}
	var _ hclog.Logger = raft
}

func TestStandardLoggerLines(t *testing.T) {
	var b bytes.Buffer
	logger, _ := New(&b, "json", slog.LevelDebug)
	w := StdWriter(logger)
	w.Write([]byte("[WARN] memberlist: Refuting a suspect message\n"))
	w.Write([]byte("[ERR] memberlist: Failed fallback TCP ping\n"))
	w.Write([]byte("[DEBUG] memberlist: Stream connection\n"))
	w.Write([]byte("no prefix at all\n"))
	got := lines(t, &b)
	want := []struct{ level, msg string }{
		{"WARN", "memberlist: Refuting a suspect message"},
		{"ERROR", "memberlist: Failed fallback TCP ping"},
		{"DEBUG", "memberlist: Stream connection"},
		{"ERROR", "no prefix at all"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d lines: %v", len(got), got)
	}
	for i, w := range want {
		if got[i]["level"] != w.level || got[i]["msg"] != w.msg {
			t.Errorf("line %d: %v, want %s %q", i, got[i], w.level, w.msg)
		}
	}
}

func TestUnknownFormat(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "xml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "text or json") {
		t.Fatalf("format xml: %v", err)
	}
}
