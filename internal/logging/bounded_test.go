package logging

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func boundedLogger(format string, b *bytes.Buffer, clock *fakeClock) *slog.Logger {
	var inner slog.Handler = slog.NewJSONHandler(b, nil)
	if format == "text" {
		inner = slog.NewTextHandler(b, nil)
	}
	return slog.New(Bounded(inner, BoundOptions{Now: clock.Now}))
}

func TestCut(t *testing.T) {
	if got := Cut("short /v1/vdis"); got != "short /v1/vdis" {
		t.Errorf("a short printable value changed: %q", got)
	}
	long := strings.Repeat("a", 900_000)
	got := Cut(long)
	if !strings.HasPrefix(got, strings.Repeat("a", MaxValueBytes)+"...") || !strings.Contains(got, "(900000 bytes)") || len(got) > MaxValueBytes+32 {
		t.Errorf("900 KB cut to %d bytes: %q", len(got), got)
	}
	if got := Cut("a\x00b\nc\x1b[31m\xff"); got != "a?b?c?[31m?" {
		t.Errorf("control characters and invalid UTF-8: %q", got)
	}
	// Cut at a character boundary.
	got = Cut(strings.Repeat("é", 100)) // 200 bytes
	if !utf8.ValidString(got) || !strings.HasPrefix(got, strings.Repeat("é", 64)+"...") {
		t.Errorf("UTF-8 cut: %q", got)
	}
}

// TestOneLinePerSourceAndMessage: many refusals of one source and reason
// in an interval write one line; the next one after it counts the rest.
func TestOneLinePerSourceAndMessage(t *testing.T) {
	var b bytes.Buffer
	clock := &fakeClock{now: time.Unix(1000, 0)}
	logger := boundedLogger("json", &b, clock)
	remote := &net.TCPAddr{IP: net.ParseIP("10.0.0.9"), Port: 4000}
	for i := range 100 {
		remote.Port = 4000 + i // another connection, the same source
		logger.Warn("admin API: refused request", From("admin", remote), "path", "/v1/x")
		clock.Advance(50 * time.Millisecond)
	}
	got := lines(t, &b)
	if len(got) != 1 || got[0]["from"] != "10.0.0.9:4000" || got[0]["path"] != "/v1/x" || got[0]["suppressed"] != nil {
		t.Fatalf("100 refusals in 5 s: %v", got)
	}
	clock.Advance(DefaultRefusalInterval)
	logger.Warn("admin API: refused request", From("admin", "10.0.0.9:5555"), "path", "/v1/y")
	got = lines(t, &b)
	if len(got) != 2 || got[1]["suppressed"] != float64(99) || got[1]["from"] != "10.0.0.9:5555" {
		t.Fatalf("the line after the interval: %v", got)
	}
	// Another message of the same source, another source: lines of their own.
	logger.Warn("admin API: something else", From("admin", "10.0.0.9:1"))
	logger.Warn("admin API: refused request", From("admin", "10.0.0.10:1"))
	if got := lines(t, &b); len(got) != 4 {
		t.Fatalf("another message, another source: %d lines: %v", len(got), got)
	}
}

// TestValuesCut: every value of a refusal line is cut, whatever its type;
// lines that are not refusals are left alone.
func TestValuesCut(t *testing.T) {
	var b bytes.Buffer
	clock := &fakeClock{now: time.Unix(1000, 0)}
	logger := boundedLogger("text", &b, clock)
	huge := strings.Repeat("x", 64<<10)
	logger.Warn("peer: refused a joining node", From("peer", "10.0.0.1:7"),
		"node", huge, "error", errors.New("malformed node id "+huge), "ids", []string{huge},
		slog.Group("request", "name", huge), "n", 7)
	line := b.String()
	if len(line) > 1200 {
		t.Fatalf("a refusal line with 64 KB values is %d bytes:\n%.2000s", len(line), line)
	}
	for _, want := range []string{"from=10.0.0.1:7", "(65536 bytes)", "(65554 bytes)", "request.name=", "n=7"} {
		if !strings.Contains(line, want) {
			t.Errorf("no %q in %s", want, line)
		}
	}
	b.Reset()
	logger.Info("an ordinary line", "value", huge)
	if !strings.Contains(b.String(), huge) {
		t.Errorf("an ordinary line was cut")
	}
}

// TestRefusalMarkHiddenOrBound: Refusal counts a line without showing
// the address; a mark bound by With counts every line of that logger.
func TestRefusalMarkHiddenOrBound(t *testing.T) {
	var b bytes.Buffer
	clock := &fakeClock{now: time.Unix(1000, 0)}
	logger := boundedLogger("json", &b, clock)
	conn := logger.With("remote", "10.0.0.3:99")
	conn.Warn("nbd: too many options", Refusal("nbd", "10.0.0.3:99"), "name", strings.Repeat("n", 4096))
	conn.Warn("nbd: too many options", Refusal("nbd", "10.0.0.3:100"))
	got := lines(t, &b)
	if len(got) != 1 || got[0]["remote"] != "10.0.0.3:99" || got[0]["refusal"] != nil || len(got[0]["name"].(string)) > MaxValueBytes+32 {
		t.Fatalf("hidden mark: %v", got)
	}
	bound := logger.With(From("gossip", "10.0.0.4:7001"))
	for range 3 {
		bound.Warn("gossip: refused a message")
	}
	if got := lines(t, &b); len(got) != 2 || got[1]["from"] != "10.0.0.4:7001" {
		t.Fatalf("a mark bound by With: %v", got)
	}
	// WithBounds keeps a bounded logger as it is, and bounds another.
	if WithBounds(logger) != logger {
		t.Error("WithBounds wrapped a bounded logger again")
	}
	var plain bytes.Buffer
	wrapped := WithBounds(slog.New(slog.NewJSONHandler(&plain, nil)))
	for range 5 {
		wrapped.Warn("refused", From("nbd", "10.0.0.5:1"))
	}
	if got := lines(t, &plain); len(got) != 1 {
		t.Fatalf("WithBounds of a plain logger: %d lines", len(got))
	}
}

// TestBurstPerPort: a flood from many sources writes at most a burst of
// lines per port and interval; another port has its own; the sources
// kept out are counted on their next line.
func TestBurstPerPort(t *testing.T) {
	var b bytes.Buffer
	clock := &fakeClock{now: time.Unix(1000, 0)}
	logger := boundedLogger("json", &b, clock)
	for i := range 50 {
		logger.Warn("nbd: refused", From("nbd", fmt.Sprintf("10.1.0.%d:1", i)))
	}
	logger.Warn("admin API: refused request", From("admin", "10.1.0.1:1"))
	got := lines(t, &b)
	if len(got) != DefaultRefusalBurst+1 || got[len(got)-1]["msg"] != "admin API: refused request" {
		t.Fatalf("50 sources on one port, then one on another: %d lines: %v", len(got), got)
	}
	b.Reset()
	clock.Advance(DefaultRefusalInterval)
	logger.Warn("nbd: refused", From("nbd", "10.1.0.40:1"))
	got = lines(t, &b)
	if len(got) != 1 || got[0]["suppressed"] != float64(1) {
		t.Fatalf("a source kept out by the burst, an interval later: %v", got)
	}
}

// TestManySources: sources beyond what a port remembers are counted on
// the port's next line, and memory stays bounded.
func TestManySources(t *testing.T) {
	var b bytes.Buffer
	clock := &fakeClock{now: time.Unix(1000, 0)}
	handler := Bounded(slog.NewJSONHandler(&b, nil), BoundOptions{Now: clock.Now}).(*boundedHandler)
	logger := slog.New(handler)
	for i := range 3 * maxRefusalSources {
		logger.Warn("gossip: refused", From("gossip", fmt.Sprintf("10.%d.%d.1:1", i/256, i%256)))
	}
	written := len(lines(t, &b))
	handler.limits.mu.Lock()
	port := handler.limits.ports["gossip"]
	remembered, counted := len(port.sources), port.others
	for _, s := range port.sources {
		counted += s.suppressed
	}
	handler.limits.mu.Unlock()
	// Every line is written or counted somewhere.
	if remembered > maxRefusalSources || written != DefaultRefusalBurst || written+counted != 3*maxRefusalSources {
		t.Fatalf("%d sources remembered, %d lines written, %d counted", remembered, written, counted)
	}
	b.Reset()
	clock.Advance(DefaultRefusalInterval)
	logger.Warn("gossip: refused", From("gossip", "192.0.2.1:1"))
	got := lines(t, &b)
	if len(got) != 1 || got[0]["suppressed_other_sources"] == nil {
		t.Fatalf("the next line: %v", got)
	}
}

// TestFloodStaysUnderBound: a minute of the floods (a thousand
// refusals a second with values of hundreds of KB, from one source and
// from a thousand) writes less than 16 KiB per port.
func TestFloodStaysUnderBound(t *testing.T) {
	huge := strings.Repeat("/", 900_000)
	reason := "unauthorized: unknown token \"" + huge + "\""
	for _, format := range []string{"text", "json"} {
		for _, sources := range []int{1, 1000} {
			var b bytes.Buffer
			clock := &fakeClock{now: time.Unix(1000, 0)}
			logger := boundedLogger(format, &b, clock)
			for i := range 60_000 {
				remote := fmt.Sprintf("10.2.%d.%d:%d", (i%sources)/256, (i%sources)%256, 1024+i%60000)
				logger.Warn("admin API: refused request", From("admin", remote), "method", "GET", "path", huge, "reason", reason)
				clock.Advance(time.Millisecond)
			}
			if b.Len() > 16<<10 {
				t.Errorf("%s, %d sources: %d bytes in a minute", format, sources, b.Len())
			}
			t.Logf("%s, %d sources: %d bytes in a minute, %d lines", format, sources, b.Len(), strings.Count(b.String(), "\n"))
		}
	}
}
