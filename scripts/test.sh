#!/usr/bin/env bash
# Run every herd test: formatting and vet, unit and fuzz-seed tests with the
# race detector, real multi-process clusters (test/e2e; partitions need root
# for network namespaces), real NBD clients where installed, and a short
# fuzzing pass over every decoder that reads bytes from the network.
set -euo pipefail
cd "$(dirname "$0")/.."

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt needed:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
# Unit, protocol and harness tests first; then the multi-process cluster
# tests alone, so that their timing (failure detection, retries under
# load) does not compete with the simulation and VM tests for 2 cores.
go test -race -count=1 -timeout 20m $(go list ./... | grep -v /test/)
go test -race -count=1 -timeout 40m ./test/...

# Short fuzzing runs (the seed corpora already ran above).
fuzz_seconds=${HERD_FUZZ_SECONDS:-15}
for pkg in $(go list ./... ); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "fuzz $pkg $target (${fuzz_seconds}s)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "${fuzz_seconds}s" -fuzzminimizetime 2s "$pkg"
  done
done
echo "all tests passed"
