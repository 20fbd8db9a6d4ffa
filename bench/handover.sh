#!/usr/bin/env bash
# Measures the writer handover: two libnbd clients connected
# through two nodes of a 3-node cluster write a 4 KiB block and flush in
# turn, so every write moves the VDI's writer lock to the other node
# (drain, flush, one log entry, a fresh map cache). Prints the write+flush
# latency of those writes, handover included: p50, p99 and max over the
# rounds of each run.
#
#   bench/handover.sh [RUNS]
#
# Needs python3-libnbd. Runs test/e2e's TestWritersAlternateThroughTwoNodes.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
for i in $(seq 1 "$runs"); do
  CI=true go test -count=1 -v -run '^TestWritersAlternateThroughTwoNodes$' ./test/e2e 2>&1 |
    grep -oE 'handover: .*' || { echo "run $i failed"; exit 1; }
done
