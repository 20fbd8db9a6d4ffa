package exportname

import "testing"

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in                 string
		vdi, tag, full     string
		readOnly, snapshot bool
		writable           bool
	}{
		{in: "vm1", vdi: "vm1", full: "vm1", writable: true},
		{in: "ro/vm1", vdi: "vm1", full: "vm1", readOnly: true},
		{in: "vm1@nightly", vdi: "vm1", tag: "nightly", full: "vm1@nightly", snapshot: true},
		{in: "ro/vm1@3", vdi: "vm1", tag: "3", full: "vm1@3", readOnly: true, snapshot: true},
		{in: "vm1@", vdi: "vm1", full: "vm1@", snapshot: true},
		{in: "ro/ro/vm1", vdi: "ro/vm1", full: "ro/vm1", readOnly: true}, // the cluster refuses "ro/vm1"
		{in: "", writable: true},
	} {
		n := Parse(c.in)
		if n.VDI != c.vdi || n.Tag != c.tag || n.Full() != c.full || n.ReadOnly != c.readOnly || n.Snapshot() != c.snapshot || n.Writable() != c.writable {
			t.Errorf("Parse(%q) = %+v (full %q, snapshot %v, writable %v)", c.in, n, n.Full(), n.Snapshot(), n.Writable())
		}
		if got := n.String(); got != c.in {
			t.Errorf("Parse(%q).String() = %q", c.in, got)
		}
		if ro := n.AsReadOnly(); !ro.ReadOnly || ro.Writable() || Parse(ro.String()) != ro {
			t.Errorf("Parse(%q).AsReadOnly() = %+v", c.in, ro)
		}
	}
}
