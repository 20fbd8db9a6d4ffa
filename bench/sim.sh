#!/usr/bin/env bash
# Long simulator run (internal/sim): many seeds of the simulated cluster,
# each a fresh cluster under its own schedule of faults, checked after
# every step. Prints the seeds per second and every failing seed with the
# command that replays it.
#
#   bench/sim.sh [SEEDS] [START] [go test flags...]
#   bench/sim.sh 20000                 # seeds 1..20000
#   bench/sim.sh 5000 100001 -race     # under the race detector
#
# About 5 seeds/s on 2 idle cores (1/s under -race).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-5000}
start=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
timeout=$(( seeds + 1800 ))s
go test -count=1 -v -timeout "$timeout" "$@" -run '^TestSimulate$' ./internal/sim \
  -args -sim.seeds="$seeds" -sim.start="$start" 2>&1 |
  grep -E 'sim: seed [0-9]+ failed|replay:|seeds from|known herd bug|^(ok|FAIL|--- FAIL)'
