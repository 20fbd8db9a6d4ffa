package sim

import (
	"runtime"
	"strconv"
	"strings"
)

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

func parallelism() int { return runtime.GOMAXPROCS(0) }

// problems is a failure's broken invariants on one line.
func problems(err error) string {
	if f, ok := err.(*Failure); ok {
		return strings.Join(f.Problems, "; ")
	}
	return err.Error()
}
