#!/usr/bin/env bash
# The full backup-cycle run of docs/BACKUP.md's merges: e2e
# TestBackupCyclesMergeSpace with CYCLES backups (default 30; CI runs 8)
# of a 64 MiB VDI with 1% changed before each, on a 3-node cluster: the
# replaced backup snapshot merges away after every backup, the chain
# stays 2 deep, the space comes back within 10% of (data + one backup's
# changes) x copies and the content equals a local model. Prints the
# test's log lines (space, objects copied, time).
#   bench/merge-cycles.sh [CYCLES]
set -euo pipefail
cd "$(dirname "$0")/.."
HERD_MERGE_CYCLES=${1:-30} go test ./test/e2e -run '^TestBackupCyclesMergeSpace$' -count=1 -v -timeout 20m 2>&1 \
  | grep -E 'merge_test.go|^(--- |ok|FAIL|PASS)' | grep -v ': backup '
