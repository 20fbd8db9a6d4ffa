package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// metaRun is a run of equal status flags, in bytes.
type metaRun struct {
	Offset, Length uint64
	Flags          uint32
}

// runsOf turns per-object flags into merged runs of a disk of size bytes.
func runsOf(perObject []uint32, objectSize, size uint64) []metaRun {
	var runs []metaRun
	for i, flags := range perObject {
		offset := uint64(i) * objectSize
		length := min(objectSize, size-offset)
		if n := len(runs); n > 0 && runs[n-1].Flags == flags {
			runs[n-1].Length += length
			continue
		}
		runs = append(runs, metaRun{offset, length, flags})
	}
	return runs
}

// mergeRuns merges adjacent runs with equal flags (a client may split an
// answer over several requests) and checks that they are contiguous.
func mergeRuns(t *testing.T, runs []metaRun) []metaRun {
	t.Helper()
	var out []metaRun
	for _, r := range runs {
		if n := len(out); n > 0 {
			if out[n-1].Offset+out[n-1].Length != r.Offset {
				t.Fatalf("runs not contiguous: %v then %v", out[n-1], r)
			}
			if out[n-1].Flags == r.Flags {
				out[n-1].Length += r.Length
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// nbdinfoMap reads a metadata context of an export with nbdinfo --map.
func nbdinfoMap(t *testing.T, uri, context string) []metaRun {
	t.Helper()
	out := mustRun(t, time.Minute, "nbdinfo", "--json", "--map="+context, uri)
	var extents []struct {
		Offset uint64 `json:"offset"`
		Length uint64 `json:"length"`
		Type   uint32 `json:"type"`
	}
	if err := json.Unmarshal([]byte(out), &extents); err != nil {
		t.Fatalf("nbdinfo --map=%s %s: %v\n%s", context, uri, err, out)
	}
	var runs []metaRun
	for _, e := range extents {
		runs = append(runs, metaRun{e.Offset, e.Length, e.Type})
	}
	return mergeRuns(t, runs)
}

// qemuImgBitmap reads a dirty bitmap through QEMU's NBD client with
// x-dirty-bitmap, which reports the context in place of base:allocation:
// NBD_STATE_DIRTY is read as NBD_STATE_HOLE, so a dirty run is
// "data": false, "present": false and a clean one "data": true (seen on
// QEMU 7.2; "zero" is never set). Returned
// as runs with flags 1 for dirty.
func qemuImgBitmap(t *testing.T, socket, export, context string) []metaRun {
	t.Helper()
	options := fmt.Sprintf("driver=nbd,server.type=unix,server.path=%s,export=%s,x-dirty-bitmap=%s", socket, export, context)
	out := mustRun(t, time.Minute, "qemu-img", "map", "--output=json", "--image-opts", options)
	var entries []struct {
		Start  uint64 `json:"start"`
		Length uint64 `json:"length"`
		Data   bool   `json:"data"`
		Zero   bool   `json:"zero"`
	}
	if err := json.Unmarshal([]byte(out), &entries); err != nil {
		t.Fatalf("qemu-img map %s: %v\n%s", options, err, out)
	}
	var runs []metaRun
	for _, e := range entries {
		if e.Zero {
			t.Fatalf("qemu-img map %s: a run reported zero (the bitmap has no zero bit): %s", options, out)
		}
		flags := uint32(0)
		if !e.Data {
			flags = 1
		}
		runs = append(runs, metaRun{e.Start, e.Length, flags})
	}
	return mergeRuns(t, runs)
}

// nbdinfoContexts lists the metadata contexts of an export (nbdinfo
// --json shows those the server lists for it).
func nbdinfoContexts(t *testing.T, uri string) []string {
	t.Helper()
	out := mustRun(t, time.Minute, "nbdinfo", "--json", uri)
	var info struct {
		Exports []struct {
			Contexts []string `json:"contexts"`
		} `json:"exports"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Exports) != 1 {
		t.Fatalf("nbdinfo --json %s: %v\n%s", uri, err, out)
	}
	return info.Exports[0].Contexts
}

// TestNBDMetaContexts: qemu:dirty-bitmap:TAG and qemu:allocation-depth
// on a real cluster, read by nbdinfo and qemu-img, for a VDI, a later
// snapshot and a clone, object by object.
func TestNBDMetaContexts(t *testing.T) {
	need(t, "qemu-io", "qemu-img", "nbdinfo")
	const mib = 1 << 20
	c := dataCluster(t, 3, 2, "vm", "64M")
	v, err := client(c, 0).VDI(ctx(t), "vm")
	if err != nil {
		t.Fatal(err)
	}
	objectSize, size := v.ObjectSize, v.Size
	objects := int((size + objectSize - 1) / objectSize)
	if objectSize != 4*mib || objects != 16 {
		t.Fatalf("object size %d, %d objects: the writes below assume 4 MiB objects", objectSize, objects)
	}
	at := func(object int, within uint64) uint64 { return uint64(object)*objectSize + within }
	io := func(node int, export string, commands ...string) {
		t.Helper()
		if out, err := qemuIO(t, c.Node(node).NBDURI(export), commands...); err != nil {
			t.Fatalf("qemu-io %v on %s: %v\n%s", commands, export, err, out)
		}
	}

	// Before s1: objects 0, 1, 2, 3, 5.
	io(0, "vm",
		fmt.Sprintf("write -P 0xa0 %d %d", at(0, 0), mib),
		fmt.Sprintf("write -P 0xa1 %d %d", at(1, 100), 100000),
		fmt.Sprintf("write -P 0xa2 %d %d", at(2, 0), objectSize),
		fmt.Sprintf("write -P 0xa3 %d %d", at(3, 4096), 8192),
		fmt.Sprintf("write -P 0xa5 %d %d", at(5, objectSize-512), 512))
	herd(t, c, 1, "vdi", "snapshot", "vm", "--tag", "s1")
	// Between s1 and s2: a small write into object 1, object 6, a write
	// across the boundary of objects 7 and 8, and object 3 trimmed whole.
	io(0, "vm",
		fmt.Sprintf("write -P 0xb1 %d %d", at(1, 5000), 3000),
		fmt.Sprintf("write -P 0xb6 %d %d", at(6, 12345), 4096),
		fmt.Sprintf("write -P 0xb7 %d %d", at(8, 0)-1000, 2000),
		fmt.Sprintf("discard %d %d", at(3, 0), objectSize))
	herd(t, c, 2, "vdi", "snapshot", "vm", "--tag", "s2")
	// After s2: objects 0 and 9.
	io(0, "vm",
		fmt.Sprintf("write -P 0xc0 %d %d", at(0, 0), 100),
		fmt.Sprintf("write -P 0xc9 %d %d", at(9, 777), 1))
	// The data is what was written (the contexts describe it, they do
	// not change it).
	io(1, "vm", fmt.Sprintf("read -P 0xb1 %d 3000", at(1, 5000)), fmt.Sprintf("read -P 0 %d %d", at(3, 0), objectSize),
		fmt.Sprintf("read -P 0xc0 0 100"))

	perObject := func(set map[int]uint32) []uint32 {
		out := make([]uint32, objects)
		for i, flags := range set {
			out[i] = flags
		}
		return out
	}
	dirty := func(indexes ...int) []uint32 {
		set := map[int]uint32{}
		for _, i := range indexes {
			set[i] = 1
		}
		return perObject(set)
	}
	check := func(node int, export, context string, want []uint32) {
		t.Helper()
		wantRuns := runsOf(want, objectSize, size)
		uri := c.Node(node).NBDURI(export)
		if got := nbdinfoMap(t, uri, context); fmt.Sprint(got) != fmt.Sprint(wantRuns) {
			t.Errorf("nbdinfo --map=%s on %s:\n got %v\nwant %v", context, export, got, wantRuns)
		}
		if strings.HasPrefix(context, "qemu:dirty-bitmap:") {
			if got := qemuImgBitmap(t, c.Node(node).NBDSocket(), export, context); fmt.Sprint(got) != fmt.Sprint(wantRuns) {
				t.Errorf("qemu-img map x-dirty-bitmap=%s on %s:\n got %v\nwant %v", context, export, got, wantRuns)
			}
		}
	}

	// vm: changed since s1 = 0, 1, 3 (trimmed), 6, 7, 8, 9; since s2 = 0, 9.
	check(1, "vm", "qemu:dirty-bitmap:s1", dirty(0, 1, 3, 6, 7, 8, 9))
	check(2, "vm", "qemu:dirty-bitmap:vm@s1", dirty(0, 1, 3, 6, 7, 8, 9))
	check(0, "vm", "qemu:dirty-bitmap:s2", dirty(0, 9))
	// Depth: 1 vm, 2 vm@s2 (the tombstone of object 3 too), 3 vm@s1.
	check(1, "vm", "qemu:allocation-depth", perObject(map[int]uint32{0: 1, 1: 2, 2: 3, 3: 2, 5: 3, 6: 2, 7: 2, 8: 2, 9: 1}))
	// The later snapshot vm@s2: changed since s1 = 1, 3, 6, 7, 8.
	check(2, "vm@s2", "qemu:dirty-bitmap:s1", dirty(1, 3, 6, 7, 8))
	check(0, "vm@s2", "qemu:allocation-depth", perObject(map[int]uint32{0: 2, 1: 1, 2: 2, 3: 1, 5: 2, 6: 1, 7: 1, 8: 1}))
	check(0, "ro/vm", "qemu:dirty-bitmap:s2", dirty(0, 9))

	// A clone of s1, then written: changed since s1 = what the clone wrote.
	herd(t, c, 0, "vdi", "clone", "vm@s1", "copy")
	io(2, "copy",
		fmt.Sprintf("write -P 0xd4 %d %d", at(4, 0), 4096),
		fmt.Sprintf("write -P 0xdf %d %d", size-4096, 4096),
		fmt.Sprintf("write -P 0xd1 %d %d", at(1, 0), 1))
	check(1, "copy", "qemu:dirty-bitmap:s1", dirty(1, 4, 15))
	check(1, "copy", "qemu:allocation-depth", perObject(map[int]uint32{0: 2, 1: 1, 2: 2, 3: 2, 4: 1, 5: 2, 15: 1}))

	// The contexts each export lists: one bitmap per ancestor snapshot.
	for export, want := range map[string]string{
		"vm":    "[base:allocation qemu:allocation-depth qemu:dirty-bitmap:s2 qemu:dirty-bitmap:s1]",
		"vm@s2": "[base:allocation qemu:allocation-depth qemu:dirty-bitmap:s1]",
		"vm@s1": "[base:allocation qemu:allocation-depth]",
		"copy":  "[base:allocation qemu:allocation-depth qemu:dirty-bitmap:s1]",
	} {
		if got := fmt.Sprint(nbdinfoContexts(t, c.Node(0).NBDURI(export))); got != want {
			t.Errorf("contexts of %s: %s, want %s", export, got, want)
		}
	}
	// A bitmap that is not an ancestor cannot be read: nbdinfo fails.
	if out, err := run(t, time.Minute, "nbdinfo", "--map=qemu:dirty-bitmap:s2", c.Node(0).NBDURI("vm@s2")); err == nil {
		t.Errorf("nbdinfo read a snapshot's bitmap of itself:\n%s", out)
	}
}
