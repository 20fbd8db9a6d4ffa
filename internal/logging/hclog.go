package logging

import (
	"context"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// Hclog returns an hclog.Logger (what hashicorp/raft logs through) that
// writes to logger, with component=name and hclog's key/value pairs as
// attributes. Raft's Info is herd's Debug: raft narrates every election
// and snapshot at Info, which would drown herd's own lines; its warnings
// and errors keep their level.
func Hclog(logger *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{logger: logger.With("component", name), name: name}
}

type hclogAdapter struct {
	logger  *slog.Logger
	name    string
	implied []any
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func levelOf(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug, hclog.Info:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	l := levelOf(level)
	ctx := context.Background()
	if !a.logger.Enabled(ctx, l) {
		return
	}
	a.logger.Log(ctx, l, msg, append(append([]any(nil), a.implied...), pairs(args)...)...)
}

// pairs turns hclog's alternating keys and values into slog arguments;
// a key that is not a string is printed, an odd value out is kept under
// "extra", and a key the record itself uses (time, level, msg) gets a
// trailing "_".
func pairs(args []any) []any {
	out := make([]any, 0, len(args))
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, slog.Any("extra", args[i]))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = slog.AnyValue(args[i]).String()
		}
		switch key {
		case slog.TimeKey, slog.LevelKey, slog.MessageKey, slog.SourceKey, "component":
			// Raft's own "time" (a duration) must not replace the
			// record's time, nor any other key the stream relies on.
			key += "_"
		}
		out = append(out, slog.Any(key, args[i+1]))
	}
	return out
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(level hclog.Level) bool {
	return a.logger.Enabled(context.Background(), levelOf(level))
}
func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.implied }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	return &hclogAdapter{logger: a.logger, name: a.name, implied: append(append([]any(nil), a.implied...), pairs(args)...)}
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	if a.name != "" {
		name = a.name + "." + name
	}
	return a.ResetNamed(name)
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	// The component attribute was bound by Hclog; a sub-logger adds its
	// own name beside it.
	return &hclogAdapter{logger: a.logger.With("subsystem", name), name: name, implied: a.implied}
}

// SetLevel is ignored: the slog handler's level decides.
func (a *hclogAdapter) SetLevel(hclog.Level) {}

func (a *hclogAdapter) GetLevel() hclog.Level {
	for _, level := range []hclog.Level{hclog.Trace, hclog.Warn, hclog.Error} {
		if a.enabled(level) {
			return level
		}
	}
	return hclog.Off
}

func (a *hclogAdapter) StandardLogger(options *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(options), "", 0)
}

func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return StdWriter(a.logger)
}
