package logging

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Refusal lines: what a node logs when it refuses someone on one of its
// ports (a request without a token, a join with a wrong secret, an NBD
// open it does not allow, a gossip packet it cannot decrypt). Whoever
// reaches a port chooses how often such a line is written and much of
// what is in it, so these lines are bounded:
//
//   - every value in them is cut to MaxValueBytes (and made printable),
//     so a 900 KB path or a 64 KB node id costs a line of normal size;
//   - one line at most per source address and message per interval: the
//     next line of the same source and message, once the interval has
//     passed, carries "suppressed=N", the lines not written meanwhile;
//   - at most a burst of lines per port and interval in all, so that a
//     flood from many addresses is bounded as well: the lines it keeps
//     out are counted the same way.
//
// A call site marks a line as a refusal with an attribute made by From
// (shown as from=ADDRESS) or Refusal (not shown, for a logger that
// already names the remote address); the handler New returns (or one
// made by Bounded) does the rest. Lines without the mark pass unchanged.

// Defaults of the bounds; BoundOptions changes them (tests).
const (
	// MaxValueBytes is the most bytes of any value (a path, a name, an
	// error) that a refusal line keeps.
	MaxValueBytes = 128
	// DefaultRefusalInterval is the least time between two lines of one
	// source and message, and the length of a port's burst window.
	DefaultRefusalInterval = 10 * time.Second
	// DefaultRefusalBurst is the most refusal lines one port writes per
	// interval, every source together. Four lines of at most ~500 bytes
	// (a message, an address, and two or three values of 128 bytes,
	// quoted) per ten seconds stay below 16 KiB in any minute (seven
	// windows at most).
	DefaultRefusalBurst = 4
	// maxRefusalSources bounds the sources and messages remembered per
	// port; beyond it, lines of new ones are counted on the port's next
	// line (suppressed_other_sources) instead.
	maxRefusalSources = 1024
)

// BoundOptions are the bounds of a handler made by Bounded; zero fields
// take the defaults.
type BoundOptions struct {
	Interval time.Duration
	Burst    int
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// refusal is the value of the attribute that marks a refusal line.
type refusal struct {
	port    string // which port's budget the line counts against
	source  string // the key: an IP address, or "local"
	address string // shown, when show is set
	show    bool
}

// LogValue shows the remote address.
func (r *refusal) LogValue() slog.Value { return slog.StringValue(r.address) }

// From marks a line as a refusal on port (a name: "admin", "nbd",
// "peer", "gossip") of a connection or packet from remote (a net.Addr,
// or an address as text, "IP:PORT" or "IP"), and shows remote as
// from=ADDRESS. The source the line is counted against is remote's IP.
func From(port string, remote any) slog.Attr {
	return slog.Any("from", newRefusal(port, remote, true))
}

// Refusal marks a line as From does without showing the address, for a
// logger that names it already (With("remote", ...)).
func Refusal(port string, remote any) slog.Attr {
	return slog.Any("refusal", newRefusal(port, remote, false))
}

func newRefusal(port string, remote any, show bool) *refusal {
	var address, source string
	switch r := remote.(type) {
	case nil:
		address = "unknown"
	case *net.TCPAddr:
		address, source = r.String(), r.IP.String()
	case *net.UDPAddr:
		address, source = r.String(), r.IP.String()
	case net.Addr:
		address = r.String()
	case string:
		address = r
	default:
		address = fmt.Sprint(r)
	}
	if source == "" {
		source = address
		if host, _, err := net.SplitHostPort(address); err == nil {
			source = host
		}
	}
	return &refusal{port: port, source: Cut(source), address: Cut(address), show: show}
}

// refusalOf returns the mark a is, if it is one.
func refusalOf(a slog.Attr) (*refusal, bool) {
	if a.Value.Kind() != slog.KindLogValuer {
		return nil, false
	}
	r, ok := a.Value.Any().(*refusal)
	return r, ok
}

// Bounded returns a handler that writes to inner, bounding the refusal
// lines as this file says. Handlers derived from it (With, WithGroup)
// share its bounds.
func Bounded(inner slog.Handler, options BoundOptions) slog.Handler {
	if options.Interval <= 0 {
		options.Interval = DefaultRefusalInterval
	}
	if options.Burst <= 0 {
		options.Burst = DefaultRefusalBurst
	}
	if options.Now == nil {
		options.Now = time.Now
	}
	return &boundedHandler{inner: inner, limits: &refusalLimits{options: options, ports: map[string]*portLimits{}}}
}

// WithBounds returns logger if its handler bounds refusal lines already
// (New's does), else a logger that does, with the default bounds.
func WithBounds(logger *slog.Logger) *slog.Logger {
	if _, ok := logger.Handler().(*boundedHandler); ok {
		return logger
	}
	return slog.New(Bounded(logger.Handler(), BoundOptions{}))
}

type boundedHandler struct {
	inner  slog.Handler
	limits *refusalLimits
	// marked is the mark among the attributes bound by With, if any.
	marked *refusal
}

func (h *boundedHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.inner.Enabled(ctx, level)
}

func (h *boundedHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	marked := h.marked
	for _, a := range attrs {
		if r, ok := refusalOf(a); ok {
			marked = r
		}
	}
	return &boundedHandler{inner: h.inner.WithAttrs(attrs), limits: h.limits, marked: marked}
}

func (h *boundedHandler) WithGroup(name string) slog.Handler {
	return &boundedHandler{inner: h.inner.WithGroup(name), limits: h.limits, marked: h.marked}
}

func (h *boundedHandler) Handle(ctx context.Context, record slog.Record) error {
	mark := h.marked
	record.Attrs(func(a slog.Attr) bool {
		if r, ok := refusalOf(a); ok {
			mark = r
		}
		return true
	})
	if mark == nil {
		return h.inner.Handle(ctx, record)
	}
	write, suppressed, others := h.limits.allow(mark.port, mark.source, record.Message)
	if !write {
		return nil
	}
	bounded := slog.NewRecord(record.Time, record.Level, Cut(record.Message), record.PC)
	record.Attrs(func(a slog.Attr) bool {
		if r, ok := refusalOf(a); ok {
			if r.show {
				bounded.AddAttrs(slog.String(a.Key, r.address))
			}
			return true
		}
		bounded.AddAttrs(cutAttr(a))
		return true
	})
	if suppressed > 0 {
		bounded.AddAttrs(slog.Int("suppressed", suppressed))
	}
	if others > 0 {
		bounded.AddAttrs(slog.Int("suppressed_other_sources", others))
	}
	return h.inner.Handle(ctx, bounded)
}

// refusalLimits is the state a handler and those derived from it share.
type refusalLimits struct {
	options BoundOptions
	mu      sync.Mutex // guards ports
	ports   map[string]*portLimits
}

// portLimits is one port's: its burst window and its sources.
type portLimits struct {
	windowStart time.Time
	windowLines int
	sources     map[string]*sourceLimits // by source and message
	// others counts lines not written and not counted by any source
	// (too many sources, or a source forgotten with a count).
	others int
}

type sourceLimits struct {
	last       time.Time // the last line written; zero: none yet
	suppressed int
}

// allow decides whether a refusal line of source and message on port is
// written now, and returns the counts it must carry.
func (l *refusalLimits) allow(port, source, message string) (write bool, suppressed, others int) {
	now := l.options.Now()
	interval := l.options.Interval
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.ports[port]
	if p == nil {
		p = &portLimits{sources: map[string]*sourceLimits{}}
		l.ports[port] = p
	}
	key := source + "\x00" + message
	s := p.sources[key]
	if s != nil && !s.last.IsZero() && now.Sub(s.last) < interval {
		s.suppressed++
		return false, 0, 0
	}
	if s == nil {
		if len(p.sources) >= maxRefusalSources {
			p.forget(now, interval)
		}
		if len(p.sources) >= maxRefusalSources {
			p.others++
			return false, 0, 0
		}
		s = &sourceLimits{}
		p.sources[key] = s
	}
	if p.windowStart.IsZero() || now.Sub(p.windowStart) >= interval {
		p.windowStart, p.windowLines = now, 0
	}
	if p.windowLines >= l.options.Burst {
		s.suppressed++
		return false, 0, 0
	}
	p.windowLines++
	suppressed, others = s.suppressed, p.others
	s.last, s.suppressed, p.others = now, 0, 0
	return true, suppressed, others
}

// forget drops the sources that wrote no line for an interval; their
// counts go to others.
func (p *portLimits) forget(now time.Time, interval time.Duration) {
	for key, s := range p.sources {
		if s.last.IsZero() || now.Sub(s.last) >= interval {
			p.others += s.suppressed
			delete(p.sources, key)
		}
	}
}

// Cut returns s bounded for a log line: at most MaxValueBytes of it, cut
// at a character boundary, with control characters and invalid UTF-8
// replaced by '?', and, if it was longer, how long it was.
func Cut(s string) string {
	if len(s) <= MaxValueBytes && printable(s) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		size := utf8.RuneLen(r)
		if r == utf8.RuneError {
			size = 1
		}
		if i+size > MaxValueBytes {
			break
		}
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	if len(s) > MaxValueBytes {
		fmt.Fprintf(&b, "...(%d bytes)", len(s))
	}
	return b.String()
}

func printable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// cutAttr bounds one attribute of a refusal line: text is cut, errors,
// stringers and anything else printed as text are printed, then cut;
// numbers, times and the like stay.
func cutAttr(a slog.Attr) slog.Attr {
	a.Key = Cut(a.Key)
	value := a.Value.Resolve()
	switch value.Kind() {
	case slog.KindString:
		return slog.String(a.Key, Cut(value.String()))
	case slog.KindGroup:
		group := value.Group()
		attrs := make([]any, 0, len(group))
		for _, inner := range group {
			attrs = append(attrs, cutAttr(inner))
		}
		return slog.Group(a.Key, attrs...)
	case slog.KindAny:
		if b, ok := value.Any().([]byte); ok {
			return slog.String(a.Key, Cut(string(b)))
		}
		// Errors and stringers too (fmt survives a nil receiver).
		return slog.String(a.Key, Cut(fmt.Sprint(value.Any())))
	}
	return slog.Attr{Key: a.Key, Value: value}
}
