package transfer

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func writeTestDiff(t *testing.T, records func(w *diffWriter)) []byte {
	t.Helper()
	var b bytes.Buffer
	w := newDiffWriter(&b)
	if err := w.header(DiffHeader{From: "vm@s1", To: "vm@s2", FromSize: 1 << 20, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	records(w)
	if err := w.end(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func readAll(p []byte) ([]diffRecord, error) {
	d, err := newDiffReader(bytes.NewReader(p))
	if err != nil {
		return nil, err
	}
	var out []diffRecord
	for {
		rec, err := d.read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		rec.data = bytes.Clone(rec.data)
		out = append(out, rec)
	}
}

// TestDiffFormat: what the writer writes reads back; a flipped byte
// anywhere, a cut, records out of order or past the size, and trailing
// bytes are all refused as ErrBadDiff.
func TestDiffFormat(t *testing.T) {
	good := writeTestDiff(t, func(w *diffWriter) {
		w.data(4096, bytes.Repeat([]byte{7}, 8192))
		w.zero(65536, 131072)
		w.data(1<<20-512, bytes.Repeat([]byte{9}, 512))
	})
	recs, err := readAll(good)
	if err != nil || len(recs) != 4 || recs[0].kind != 'W' || recs[0].offset != 4096 || len(recs[0].data) != 8192 ||
		recs[1].kind != 'Z' || recs[1].length != 131072 || recs[2].offset != 1<<20-512 || recs[3].kind != 'E' {
		t.Fatalf("read back: %+v %v", recs, err)
	}
	for i := 0; i < len(good); i += 97 {
		bad := bytes.Clone(good)
		bad[i] ^= 0x10
		if _, err := readAll(bad); !errors.Is(err, ErrBadDiff) {
			t.Fatalf("byte %d flipped: %v, want ErrBadDiff", i, err)
		}
	}
	for _, cut := range []int{5, len(diffMagic) + 3, len(good) / 2, len(good) - 1} {
		if _, err := readAll(good[:cut]); !errors.Is(err, ErrBadDiff) {
			t.Fatalf("cut at %d: %v, want ErrBadDiff", cut, err)
		}
	}
	if _, err := readAll(append(bytes.Clone(good), 0)); !errors.Is(err, ErrBadDiff) {
		t.Fatalf("a trailing byte: %v", err)
	}
	disorder := writeTestDiff(t, func(w *diffWriter) {
		w.data(65536, []byte{1})
		w.data(4096, []byte{1})
	})
	if _, err := readAll(disorder); !errors.Is(err, ErrBadDiff) {
		t.Fatalf("records out of order: %v", err)
	}
	past := writeTestDiff(t, func(w *diffWriter) { w.zero(1<<20-4096, 8192) })
	if _, err := readAll(past); !errors.Is(err, ErrBadDiff) {
		t.Fatalf("a record past the size: %v", err)
	}
	file := filepath.Join(t.TempDir(), "d")
	os.WriteFile(file, good, 0o600)
	if h, err := ReadDiffHeader(file); err != nil || h.From != "vm@s1" || h.To != "vm@s2" {
		t.Fatalf("ReadDiffHeader: %+v %v", h, err)
	}
}
