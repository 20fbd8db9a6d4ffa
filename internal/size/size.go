// Package size parses and formats byte sizes the way VM users write them:
// 512, 10M, 10MiB, 1G, 1GiB, 2T. Single-letter and "iB" suffixes are binary
// (powers of 1024), as qemu-img reads them; "KB", "MB", ... are decimal.
package size

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrInvalid is wrapped by every parse error.
var ErrInvalid = errors.New("invalid size")

var units = map[string]uint64{
	"":    1,
	"b":   1,
	"k":   1 << 10,
	"kib": 1 << 10,
	"m":   1 << 20,
	"mib": 1 << 20,
	"g":   1 << 30,
	"gib": 1 << 30,
	"t":   1 << 40,
	"tib": 1 << 40,
	"p":   1 << 50,
	"pib": 1 << 50,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
	"pb":  1e15,
}

// Parse reads a size such as "512", "10M", "1.5GiB" or "2T" and returns bytes.
func Parse(text string) (uint64, error) {
	s := strings.TrimSpace(text)
	if s == "" {
		return 0, fmt.Errorf("%w: empty (give bytes or a number with a unit: 512, 10M, 1GiB, 2T)", ErrInvalid)
	}
	split := len(s)
	for i, r := range s {
		if (r < '0' || r > '9') && r != '.' {
			split = i
			break
		}
	}
	number, unit := s[:split], strings.ToLower(strings.TrimSpace(s[split:]))
	if number == "" {
		return 0, fmt.Errorf("%w %q: no number (examples: 512, 10M, 1GiB, 2T)", ErrInvalid, text)
	}
	multiplier, ok := units[unit]
	if !ok {
		return 0, fmt.Errorf("%w %q: unknown unit %q (use K, M, G, T, P, KiB..PiB, KB..PB, or plain bytes)", ErrInvalid, text, s[split:])
	}
	if !strings.Contains(number, ".") {
		n, err := strconv.ParseUint(number, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w %q: %v", ErrInvalid, text, err.(*strconv.NumError).Err)
		}
		if n != 0 && multiplier > math.MaxUint64/n {
			return 0, fmt.Errorf("%w %q: too large", ErrInvalid, text)
		}
		return n * multiplier, nil
	}
	f, err := strconv.ParseFloat(number, 64)
	if err != nil {
		return 0, fmt.Errorf("%w %q: bad number", ErrInvalid, text)
	}
	bytes := f * float64(multiplier)
	if bytes >= math.MaxUint64 {
		return 0, fmt.Errorf("%w %q: too large", ErrInvalid, text)
	}
	if bytes != math.Trunc(bytes) {
		return 0, fmt.Errorf("%w %q: not a whole number of bytes", ErrInvalid, text)
	}
	return uint64(bytes), nil
}

// Format renders bytes with a binary unit, exactly when possible ("10 MiB",
// "1.5 GiB", "512 B").
func Format(bytes uint64) string {
	names := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	value := float64(bytes)
	i := 0
	for value >= 1024 && i < len(names)-1 {
		value /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", bytes)
	}
	if value == math.Trunc(value) {
		return fmt.Sprintf("%.0f %s", value, names[i])
	}
	return fmt.Sprintf("%.1f %s", value, names[i])
}
