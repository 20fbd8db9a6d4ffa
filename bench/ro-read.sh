#!/usr/bin/env bash
# What a ro/ read of a live VDI costs beside the writer's own read, in one
# run: a 3-node cluster (copies 3, plaintext NBD over TCP), the VDI
# written whole through node 1, then the shared job set's read jobs
# (fio's nbd engine) through the writer's export on node 1 and through
# ro/NAME on node 2, alternated round by round so that the machine's
# drift hits both alike. A ro/ read of a live VDI first syncs with the
# leader (batched) and reads every replica, returning once they agree
# (ARCHITECTURE.md, "Data path"); the writer reads one, its own. Prints
# each job's mean IOPS and CPU time per operation (the three nodes,
# lib.sh run_jobs) per export, and the ratios ro/writer.
#
#   bench/ro-read.sh [SIZE] [ROUNDS]     e.g. bench/ro-read.sh 256M 3
set -euo pipefail
export HERD_BENCH_NBD=plain
source "$(dirname "$0")/lib.sh"
size=${1:-256M}
rounds=${2:-3}
shared=$(cd "$root/../shared/bench" && pwd)
out=$work/ro-read-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
build
echo "herd $(git -C "$root" rev-parse --short HEAD)" | tee "$out/revision.txt"
for round in $(seq 1 "$rounds"); do
  echo "== round $round"
  start_cluster 3 3 bench "$size"
  writer="nbd://$prefix.1:10809/bench"
  reader="nbd://$prefix.2:10809/ro/bench"
  JOBS=precondition run_jobs "fill-$round" "$out" --ioengine=nbd --uri="$writer" >/dev/null
  order="writer ro"
  [ $((round % 2)) -eq 0 ] && order="ro writer"
  for who in $order; do
    target=$writer
    [ "$who" = ro ] && target=$reader
    SKIP_PRECOND=1 JOBS="seqread randread-qd1 randread-qd32" run_jobs "$who-$round" "$out" --ioengine=nbd --uri="$target"
  done
  stop_all
done
python3 - "$out" "$rounds" <<'PY'
import sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(name, ext, col, key):
    r = {}
    for line in open(os.path.join(out, name + ext)):
        f = line.split()
        if len(f) > col and f[key] not in ("precondition",):
            try:
                r[f[key]] = float(f[col])
            except ValueError:
                pass
    return r
iops = {w: [rows(f"{w}-{i}", ".txt", 3, 1) for i in range(1, rounds + 1)] for w in ("writer", "ro")}
cpu = {w: [rows(f"{w}-{i}", ".cpu", 3, 2) for i in range(1, rounds + 1)] for w in ("writer", "ro")}
print("%-14s %12s %12s %8s   %14s %14s %8s" % ("job", "writer IOPS", "ro/ IOPS", "ro/wr", "writer us/op", "ro/ us/op", "ro/wr"))
for job in iops["writer"][0]:
    a = statistics.mean(r[job] for r in iops["writer"]); b = statistics.mean(r[job] for r in iops["ro"])
    ca = statistics.mean(r[job] for r in cpu["writer"]); cb = statistics.mean(r[job] for r in cpu["ro"])
    print("%-14s %12.0f %12.0f %8.2f   %14.1f %14.1f %8.2f" % (job, a, b, b / a, ca, cb, cb / ca))
print("(seqread: IOPS of 1 MiB reads, so MiB/s; CPU: the three nodes' user+system time per operation)")
PY
echo "results in $out"
