package logging

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
)

// StdWriter is an io.Writer for a standard library *log.Logger (what
// hashicorp/memberlist logs through: lines like "[WARN] memberlist: ...")
// that writes each line to logger at the level its prefix names
// (DEBUG, INFO: Debug; WARN: Warn; ERR, ERROR and anything else: Error),
// without the prefix.
func StdWriter(logger *slog.Logger) io.Writer { return stdWriter{logger} }

type stdWriter struct{ logger *slog.Logger }

func (w stdWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(string(bytes.TrimSpace(p)), "\n") {
		level, message := ParseStdLine(line)
		w.logger.Log(context.Background(), level, message)
	}
	return len(p), nil
}

// ParseStdLine splits "[LEVEL] message" into a slog level and the message.
func ParseStdLine(line string) (slog.Level, string) {
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, "[") {
		return slog.LevelError, line
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return slog.LevelError, line
	}
	message := strings.TrimSpace(line[end+1:])
	switch strings.ToUpper(line[1:end]) {
	case "TRACE", "DEBUG", "INFO":
		return slog.LevelDebug, message
	case "WARN", "WARNING":
		return slog.LevelWarn, message
	}
	return slog.LevelError, message
}
