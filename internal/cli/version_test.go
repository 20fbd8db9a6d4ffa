package cli

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	var out, errs bytes.Buffer
	if code := Main([]string{"version", "--json"}, &out, &errs); code != 0 {
		t.Fatalf("herd version --json: exit %d: %s", code, errs.String())
	}
	var info struct {
		Version   string `json:"version"`
		GoVersion string `json:"go_version"`
	}
	if err := json.Unmarshal(out.Bytes(), &info); err != nil {
		t.Fatalf("herd version --json printed %q: %v", out.String(), err)
	}
	if info.Version == "" || info.GoVersion != runtime.Version() {
		t.Errorf("version %+v, want a version and Go %s", info, runtime.Version())
	}
	out.Reset()
	if code := Main([]string{"--version"}, &out, &errs); code != 0 || !strings.HasPrefix(out.String(), "herd "+info.Version) || !strings.Contains(out.String(), runtime.Version()) {
		t.Errorf("herd --version: exit %d, %q", code, out.String())
	}
}

func TestLogFlagsRefuseBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"server", "--data", t.TempDir(), "--log-format", "xml"},
		{"server", "--data", t.TempDir(), "--log-level", "loud"},
		{"server", "--data", t.TempDir(), "--cpus", "-1"},
		{"server", "--data", t.TempDir(), "--zone-lag", "0"},
		{"server", "--data", t.TempDir(), "--zone-lag", "lots"},
	} {
		var out, errs bytes.Buffer
		code := Main(args, &out, &errs)
		if code == 0 || !strings.Contains(errs.String(), args[len(args)-2]) {
			t.Errorf("herd %v: exit %d, %q: want a refusal naming %s", args, code, errs.String(), args[len(args)-2])
		}
	}
}
