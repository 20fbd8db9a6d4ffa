package testenv

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
)

// outcomeTB records how Require ended a test instead of ending it. Skipf
// and Fatalf stop the calling goroutine as the real ones do.
type outcomeTB struct {
	testing.TB
	skipped, failed bool
	message         string
}

func (o *outcomeTB) Helper() {}

func (o *outcomeTB) Skipf(format string, arguments ...any) {
	o.skipped, o.message = true, fmt.Sprintf(format, arguments...)
	runtime.Goexit()
}

func (o *outcomeTB) Fatalf(format string, arguments ...any) {
	o.failed, o.message = true, fmt.Sprintf(format, arguments...)
	runtime.Goexit()
}

// run calls function with an outcomeTB in a goroutine of its own (so that
// Skipf and Fatalf can end it) and reports whether function returned.
func run(t *testing.T, function func(testing.TB)) (outcome *outcomeTB, returned bool) {
	outcome = &outcomeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		function(outcome)
		returned = true
	}()
	<-done
	return outcome, returned
}

func TestRequire(t *testing.T) {
	missing := errors.New("no such thing")
	for _, test := range []struct {
		ci                  string
		err                 error
		skipped, failed, ok bool
	}{
		{ci: "", err: nil, ok: true},
		{ci: "true", err: nil, ok: true},
		{ci: "", err: missing, skipped: true},
		{ci: "false", err: missing, skipped: true},
		{ci: "1", err: missing, skipped: true}, // only "true" marks CI, as CI systems set it
		{ci: "true", err: missing, failed: true},
	} {
		t.Run(fmt.Sprintf("CI=%q/err=%v", test.ci, test.err), func(t *testing.T) {
			t.Setenv(CIVariable, test.ci)
			outcome, returned := run(t, func(tb testing.TB) { Require(tb, "the widget", test.err) })
			if returned != test.ok || outcome.skipped != test.skipped || outcome.failed != test.failed {
				t.Fatalf("returned %v, skipped %v, failed %v; want %v, %v, %v",
					returned, outcome.skipped, outcome.failed, test.ok, test.skipped, test.failed)
			}
			if test.err != nil && (!strings.Contains(outcome.message, "the widget") || !strings.Contains(outcome.message, "no such thing")) {
				t.Errorf("message %q does not name the prerequisite and the reason", outcome.message)
			}
		})
	}
}

func TestLookPath(t *testing.T) {
	t.Setenv(CIVariable, "true")
	outcome, returned := run(t, func(tb testing.TB) {
		if path := LookPath(tb, "sh", "dash"); !strings.HasSuffix(path, "/sh") {
			tb.Errorf("LookPath(sh) = %q", path)
		}
	})
	if !returned || outcome.failed {
		t.Fatalf("LookPath(sh) under CI: %s", outcome.message)
	}
	outcome, _ = run(t, func(tb testing.TB) { LookPath(tb, "herd-no-such-program", "herd-widgets") })
	if !outcome.failed || !strings.Contains(outcome.message, "herd-no-such-program") || !strings.Contains(outcome.message, "Debian package herd-widgets") {
		t.Fatalf("a missing program under CI: failed %v, message %q", outcome.failed, outcome.message)
	}
}

func TestRequireRoot(t *testing.T) {
	t.Setenv(CIVariable, "true")
	outcome, returned := run(t, func(tb testing.TB) { RequireRoot(tb, "to mount a tmpfs") })
	if root := os.Geteuid() == 0; returned != root || outcome.failed == root {
		t.Fatalf("euid %d: returned %v, failed %v (%s)", os.Geteuid(), returned, outcome.failed, outcome.message)
	}
	if !returned && !strings.Contains(outcome.message, "to mount a tmpfs") {
		t.Errorf("message %q does not say what needs root", outcome.message)
	}
}
