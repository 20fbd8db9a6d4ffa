#!/usr/bin/env bash
# Long robustness run (issue 5): NBD clients write and read-verify on a
# 5-node, 3-copy cluster while a nemesis kills -9, pauses, restarts and
# partitions nodes (at most 2 faulty at once). Prints the summary:
# operations, faults injected, client errors, verification failures,
# acknowledged writes lost, recovery times.
#
#   bench/robustness.sh [DURATION] [SEED]     e.g. bench/robustness.sh 30m
#
# Needs root (network namespaces for partitions), ip and nft.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10m}
seed=${2:-0}
seconds=$(go run - "$duration" <<'GO'
package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	d, err := time.ParseDuration(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(int(d.Seconds()))
}
GO
)
timeout=$((seconds + 1800))s
exec go test -count=1 -v -timeout "$timeout" -run '^TestRobustness$' ./test/robustness \
  -args -robustness.duration="$duration" -robustness.seed="$seed"
