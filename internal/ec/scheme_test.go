package ec

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseEverySupportedScheme(t *testing.T) {
	count := 0
	for k := MinData; k <= MaxData; k++ {
		for m := MinParity; m <= MaxParity; m++ {
			want := Scheme{K: k, M: m}
			text := want.String()
			got, err := Parse(text)
			if err != nil {
				t.Fatalf("Parse(%q): %v", text, err)
			}
			if got != want {
				t.Fatalf("Parse(%q) = %+v, want %+v", text, got, want)
			}
			if got.Chunks() != k+m {
				t.Fatalf("%s: Chunks() = %d, want %d", got, got.Chunks(), k+m)
			}
			count++
		}
	}
	if count != 21 {
		t.Fatalf("%d schemes, want 21 (K 2..8 times M 1..3)", count)
	}
}

func TestParseRefusesWithAClearMessage(t *testing.T) {
	for _, tc := range []struct {
		text string
		want string // in the message, besides the input itself
	}{
		{"", "want K+M"},
		{"4", "want K+M"},
		{"4+", "M (parity chunks) is missing"},
		{"+2", "K (data chunks) is missing"},
		{"+", "K (data chunks) is missing"},
		{"1+1", "K (data chunks) must be 2..8, not 1"},
		{"0+1", "K (data chunks) must be 2..8, not 0"},
		{"9+1", "K (data chunks) must be 2..8, not 9"},
		{"4+4", "M (parity chunks) must be 1..3, not 4"},
		{"4+0", "M (parity chunks) must be 1..3, not 0"},
		{"a+b", `K (data chunks) "a" is not a number`},
		{"4+b", `M (parity chunks) "b" is not a number`},
		{"4+2+1", `M (parity chunks) "2+1" is not a number`},
		{"-4+2", `K (data chunks) "-4" is not a number`},
		{"4+-2", `M (parity chunks) "-2" is not a number`},
		{"4.0+2", `"4.0" is not a number`},
		{"４+2", `"４" is not a number`},
		{"04+2", `K (data chunks) "04" has a leading zero`},
		{"4+02", `M (parity chunks) "02" has a leading zero`},
		{"1000+1", "K (data chunks) must be 2..8, not 1000"},
		{"4+99999999999999999999", "M (parity chunks) must be 1..3, not 99999999999999999999"},
		{" 4+2", "without spaces"},
		{"4+2 ", "without spaces"},
		{"4 + 2", "without spaces"},
		{"4\t+2", "without spaces"},
		{"4+2\n", "without spaces"},
		{"4x2", "want K+M"},
		{"4:2", "want K+M"},
	} {
		t.Run(tc.text, func(t *testing.T) {
			s, err := Parse(tc.text)
			if err == nil {
				t.Fatalf("Parse(%q) = %v, want an error", tc.text, s)
			}
			if !errors.Is(err, ErrScheme) {
				t.Errorf("Parse(%q): %v does not wrap ErrScheme", tc.text, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Errorf("Parse(%q): %q does not say %q", tc.text, msg, tc.want)
			}
			if !strings.Contains(msg, tc.text) && !strings.Contains(msg, strconv.Quote(tc.text)) {
				t.Errorf("Parse(%q): %q does not name the input", tc.text, msg)
			}
			if s != (Scheme{}) {
				t.Errorf("Parse(%q) returned %+v with its error, want the zero Scheme", tc.text, s)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		scheme Scheme
		ok     bool
	}{
		{Scheme{}, false},
		{Scheme{K: 2, M: 1}, true},
		{Scheme{K: 8, M: 3}, true},
		{Scheme{K: 1, M: 1}, false},
		{Scheme{K: 9, M: 1}, false},
		{Scheme{K: 4, M: 0}, false},
		{Scheme{K: 4, M: 4}, false},
		{Scheme{K: -4, M: 2}, false},
		{Scheme{K: 4, M: -1}, false},
	} {
		err := tc.scheme.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%+v.Validate() = %v, want ok %v", tc.scheme, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrScheme) {
			t.Errorf("%+v.Validate() = %v, does not wrap ErrScheme", tc.scheme, err)
		}
	}
}

// FuzzParse: Parse never panics, refuses with ErrScheme, and what it
// accepts is valid and written back exactly as it was read.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{"4+2", "2+1", "8+3", "4+", "1+1", "4+4", "a+b", " 4+2", "04+2", "+", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := Parse(text)
		if err != nil {
			if !errors.Is(err, ErrScheme) {
				t.Fatalf("Parse(%q): %v does not wrap ErrScheme", text, err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("Parse(%q) = %+v, which is invalid: %v", text, s, err)
		}
		if s.String() != text {
			t.Fatalf("Parse(%q) = %+v, written back as %q", text, s, s.String())
		}
	})
}
