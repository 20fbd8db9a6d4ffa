package cli

import (
	"bytes"
	"testing"
)

// TestUsageErrorsExit64: a command line herd cannot take exits 64
// (EX_USAGE) with a message, before talking to any node; a command that
// was understood and failed exits 1.
func TestUsageErrorsExit64(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"vdi", "create"}, exUsage},
		{[]string{"vdi", "create", "a", "1G", "extra"}, exUsage},
		{[]string{"--no-such-flag"}, exUsage},
		{[]string{"no-such-command"}, exUsage},
		{[]string{"vdi", "no-such-command"}, exUsage},
		{[]string{"vdi", "create", "a", "1G", "--copies", "three"}, exUsage},
		{[]string{"cluster", "join-token", "create", "--uses"}, exUsage},
		{[]string{"vdi", "create", "a", "12 parsecs"}, exUsage},
		{[]string{"vdi", "resize", "a", "1X"}, exUsage},
		{[]string{"cluster", "format"}, exUsage}, // --copies is required
		// Understood, and failing: nothing listens at this address.
		{[]string{"--addr", "127.0.0.1:1", "--token-file", "/dev/null", "vdi", "list"}, 1},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(c.args, &stdout, &stderr); code != c.want || stderr.Len() == 0 {
			t.Errorf("herd %v: exit %d, stderr %q; want exit %d with a message", c.args, code, stderr.String(), c.want)
		}
	}
}
