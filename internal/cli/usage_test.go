package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsageErrorsExit64: a command line herd cannot take exits 64
// (EX_USAGE) with a message, before talking to any node (none answers at
// the address given); a command that was understood and failed exits 1.
func TestUsageErrorsExit64(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
		hint string // in the message, when given
	}{
		// Argument counts, unknown commands and flags.
		{[]string{"vdi", "create"}, exUsage, "usage: herd vdi create"},
		{[]string{"vdi", "create", "a", "1G", "extra"}, exUsage, ""},
		{[]string{"--no-such-flag"}, exUsage, ""},
		{[]string{"no-such-command"}, exUsage, ""},
		{[]string{"vdi", "no-such-command"}, exUsage, "commands:"},
		// A command group without its command.
		{[]string{"vdi"}, exUsage, "herd vdi needs a command"},
		{[]string{"backup"}, exUsage, "herd backup needs a command"},
		// Flag values that cannot be read.
		{[]string{"vdi", "create", "a", "1G", "--copies", "three"}, exUsage, ""},
		{[]string{"cluster", "join-token", "create", "--uses"}, exUsage, ""},
		{[]string{"vdi", "create", "a", "12 parsecs"}, exUsage, ""},
		{[]string{"vdi", "resize", "a", "1X"}, exUsage, ""},
		{[]string{"node", "recovery", "--max-rate", "fast"}, exUsage, "--max-rate"},
		{[]string{"vdi", "set", "a", "--iops-limit", "lots"}, exUsage, "--iops-limit"},
		{[]string{"vdi", "set", "a", "--bps-limit", "1"}, exUsage, "too small"},
		{[]string{"vdi", "set", "a", "--bps-limit", "-5M"}, exUsage, "negative"},
		{[]string{"vdi", "import", "a", "in.raw", "--connections", "99"}, exUsage, "--connections"},
		{[]string{"vdi", "export", "a", "out.raw", "--nbd-port", "0"}, exUsage, "--nbd-port"},
		{[]string{"backup", "prune", "/nonexistent", "--keep-last", "-1"}, exUsage, "--keep-last"},
		// Required flags, choices that must be made, flags that conflict.
		{[]string{"cluster", "format"}, exUsage, "copies"},
		{[]string{"vdi", "set", "a"}, exUsage, "nothing to change"},
		{[]string{"node", "maintenance", "node-a"}, exUsage, "--for"},
		{[]string{"vdi", "diff", "a", "a"}, exUsage, "NAME@TAG"},
		{[]string{"vdi", "export", "a", "-", "--json"}, exUsage, "--json"},
		// Export and import lines refused before a session is asked for.
		{[]string{"vdi", "export", "a", "out.qcow2"}, exUsage, "--format qcow2"},
		{[]string{"vdi", "export", "a", "out", "--format", "tar"}, exUsage, "--format \"tar\""},
		{[]string{"vdi", "export", "a", "out", "--since", "s1"}, exUsage, "NAME@TAG"},
		{[]string{"vdi", "import", "a", "--diff", "-"}, exUsage, "not stdin"},
		// Understood, and failing: nothing listens at this address.
		{[]string{"vdi", "list"}, 1, ""},
		{[]string{"vdi", "export", "a", "out.qcow2", "--format", "qcow2"}, 1, ""},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--addr", "127.0.0.1:1", "--token-file", "/dev/null", "--timeout", "2s"}, c.args...)
		code := Main(args, &stdout, &stderr)
		if code != c.want || stderr.Len() == 0 {
			t.Errorf("herd %v: exit %d, stderr %q; want exit %d with a message", c.args, code, stderr.String(), c.want)
		} else if !strings.Contains(stderr.String(), c.hint) {
			t.Errorf("herd %v: stderr %q does not say %q", c.args, stderr.String(), c.hint)
		}
	}
}
