//go:build testknobs

package server

import (
	"log/slog"
	"os"

	"github.com/herd-storage/herd/internal/store"
)

// applyTestKnobs reads the benchmarks' knobs from the environment, in a
// herd built with -tags testknobs only: HERD_BENCH_NO_CHECKSUMS=1 writes
// new copies without data checksums (the A/B of their cost,
// docs/BENCHMARKS.md).
func applyTestKnobs(logger *slog.Logger) {
	if os.Getenv("HERD_BENCH_NO_CHECKSUMS") == "1" {
		logger.Warn("HERD_BENCH_NO_CHECKSUMS=1: new copies are written without data checksums (for benchmarks only)")
		store.BenchmarkWithoutChecksums()
	}
}
