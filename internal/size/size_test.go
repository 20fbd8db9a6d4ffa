package size

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]uint64{
		"512": 512, "10M": 10 << 20, "10MiB": 10 << 20, "10m": 10 << 20,
		"1G": 1 << 30, "1GiB": 1 << 30, "2T": 2 << 40, "4MiB": 4 << 20,
		"1.5G": 3 << 29, "1KB": 1000, "10MB": 10e6, "7B": 7, " 3K ": 3072,
	}
	for text, want := range good {
		got, err := Parse(text)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", text, got, err, want)
		}
	}
	bad := []string{"", "M", "10X", "10 furlongs", "-1", "1.0000001K", "99999999999999999999", "20000P", "1e3", "1..2G"}
	for _, text := range bad {
		if got, err := Parse(text); !errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) = %d, %v; want ErrInvalid", text, got, err)
		}
	}
}

func TestFormat(t *testing.T) {
	cases := map[uint64]string{0: "0 B", 512: "512 B", 1 << 20: "1 MiB", 3 << 29: "1.5 GiB", 2 << 40: "2 TiB"}
	for bytes, want := range cases {
		if got := Format(bytes); got != want {
			t.Errorf("Format(%d) = %q; want %q", bytes, got, want)
		}
	}
}
