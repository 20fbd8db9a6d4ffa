package statemachine

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/log_encoding.golden (only for new lines: an existing one must never change)")

// TestLogEncodingUnchanged: every command of fuzzPayloads encodes, applies
// (its result, or its refusal's code) and snapshots byte for byte as
// testdata/log_encoding.golden says. Rolling
// upgrades depend on it: a node of another version applies the same
// entries and reads the same snapshots. The golden file's entries and snapshot
// are those of the code before the state machine became a package of its
// own; a new
// command adds lines (-update), a changed line is a broken upgrade.
func TestLogEncodingUnchanged(t *testing.T) {
	var out bytes.Buffer
	h := fuzzBase(t)
	for _, ct := range slices.Sorted(maps.Keys(fuzzPayloads)) {
		for _, p := range fuzzPayloads[ct] {
			data, err := encodeCommand(ct, p)
			if err != nil {
				t.Fatalf("command %d %+v: %v", ct, p, err)
			}
			fmt.Fprintf(&out, "%d %s\n", ct, hex.EncodeToString(data))
			// The result, and the code of a refusal: its message may
			// change, its meaning may not.
			res, err := h.apply(ct, p)
			value, _ := json.Marshal(res)
			code := "ok"
			if err != nil {
				code = ErrorCode(err)
			}
			fmt.Fprintf(&out, "  -> %s %s\n", value, code)
		}
	}
	snapshot, err := h.fsm.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&out, "snapshot %s\n", snapshot)
	// Commands added since: more lines, and the snapshot again.
	for _, later := range laterPayloads {
		data, err := encodeCommand(later.command, later.payload)
		if err != nil {
			t.Fatalf("command %d %+v: %v", later.command, later.payload, err)
		}
		fmt.Fprintf(&out, "%d %s\n", later.command, hex.EncodeToString(data))
		res, err := h.apply(later.command, later.payload)
		value, _ := json.Marshal(res)
		code := "ok"
		if err != nil {
			code = ErrorCode(err)
		}
		fmt.Fprintf(&out, "  -> %s %s\n", value, code)
	}
	if snapshot, err = h.fsm.Snapshot(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&out, "snapshot %s\n", snapshot)
	const golden = "testdata/log_encoding.golden"
	if *updateGolden {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(out.String(), "\n")
	for i, line := range strings.Split(string(want), "\n") {
		if i >= len(got) || got[i] != line {
			other := "(missing)"
			if i < len(got) {
				other = got[i]
			}
			t.Fatalf("%s line %d changed:\nwant %s\ngot  %s", golden, i+1, line, other)
		}
	}
}
