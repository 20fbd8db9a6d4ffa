#!/usr/bin/env bash
# Runs the CI-length robustness test (test/robustness, as scripts/test.sh
# runs it: -race on the harness) N times in a row and stops at the first
# failure. Prints each run's seed and summary, the count of passing runs
# and the time they took. A failed run's node logs are kept (the test
# prints where; $HERD_TEST_LOGS chooses the directory).
#
#   bench/robustness-repeat.sh [N]      e.g. bench/robustness-repeat.sh 20
#   ROBUSTNESS_ARGS=-robustness.log-level=debug bench/robustness-repeat.sh 20
#
# Needs root (network namespaces for partitions), ip and nft.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
started=$(date +%s)
for i in $(seq 1 "$runs"); do
  run_started=$(date +%s)
  if ! out=$(CI=true go test -race -count=1 -v -timeout 20m -run '^TestRobustness$' ./test/robustness ${ROBUSTNESS_ARGS:-} 2>&1); then
    echo "$out" | grep -E 'seed|summary|client [0-9]|robustness_test|kept in|FAIL' | head -60 || true
    echo "run $i FAILED after $((i - 1)) passing runs in a row ($(( $(date +%s) - started )) s in all)"
    exit 1
  fi
  echo "run $i passed in $(( $(date +%s) - run_started )) s: $(echo "$out" | grep -oE 'seed [0-9]+' | head -1 || true); $(echo "$out" | grep -oE '[0-9]+ operations|faults injected: [^;]*;( clients moved [^;]*;)? client errors: [0-9]+; verification failures: [0-9]+; acknowledged writes lost: [0-9]+' | head -2 | tr '\n' ' ' || true)"
done
echo "$runs of $runs runs passed in a row in $(( $(date +%s) - started )) s"
