#!/usr/bin/env bash
# Long robustness run: NBD clients write and read-verify on a
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
seconds=$(python3 - "$duration" <<'PY'
import re, sys
text = sys.argv[1]
parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
if not text or not parts:
    sys.exit("duration %r: use a Go duration such as 90s, 30m or 1h30m" % text)
h, m, s = (int(x or 0) for x in parts.groups())
print(h * 3600 + m * 60 + s)
PY
)
timeout=$((seconds + 1800))s
exec go test -count=1 -v -timeout "$timeout" -run '^TestRobustness$' ./test/robustness \
  -args -robustness.duration="$duration" -robustness.seed="$seed"
