package object

import (
	"fmt"
	"testing"
)

func TestIDs(t *testing.T) {
	data, meta := DataOID(0x123456, 7), MapOID(0xab123456, 2) // a VDI id keeps its low 24 bits
	if data != 0x0012345600000007 || meta != 0x0112345600000002 {
		t.Fatalf("DataOID %#x, MapOID %#x", data, meta)
	}
	if VDI(data) != 0x123456 || VDI(meta) != 0x123456 || Type(data) != TypeData || Type(meta) != TypeMap {
		t.Fatalf("VDI %#x %#x, Type %d %d", VDI(data), VDI(meta), Type(data), Type(meta))
	}
	// Logs, errors and file names print ids with %016x and epochs with %d:
	// the types must print as the integers did (a String method would
	// make %x print the string's bytes).
	if got := fmt.Sprintf("%016x %d %v %d", meta, Epoch(42), Epoch(42), VDIID(9)); got != "0112345600000002 42 42 9" {
		t.Fatalf("ids print as %q", got)
	}
}

func TestFlags(t *testing.T) {
	if got := (FlagSync | FlagCreate | 1<<9).String(); got != "FUA|CREATE|0x200" {
		t.Fatalf("String %q", got)
	}
	f := FlagCreate.With(FlagSync, true).With(FlagCreate, false)
	if f != FlagSync || !f.Has(FlagSync) || f.Has(FlagSync|FlagCreate) {
		t.Fatalf("With, Has: %s", f)
	}
}
