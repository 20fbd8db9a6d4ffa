#!/usr/bin/env bash
# Same-run A/B of two herd revisions on the shared fio job set's 4K jobs
# (../shared/bench, fio's nbd engine, 3 nodes on $prefix.1-3, copies 3):
# both binaries are built from git, then run alternately (A B A B ...) so
# that the machine's drift hits both alike. Prints each round and the
# mean of each job with the ratio B/A, then the same for the CPU time per
# operation of the three nodes (lib.sh run_jobs).
#
#   bench/ab.sh REV_A REV_B [SIZE] [ROUNDS]    e.g. bench/ab.sh b7a8b39 HEAD 1G 3
#   AB_JOBS=all bench/ab.sh ...                 the whole job set (seqwrite, seqread too)
#   AB_JOBS="seqwrite randwrite-qd32" bench/ab.sh ...   these jobs (after the precondition)
#   AB_ENV_A="VAR=value ..." bench/ab.sh ...   environment of A's nodes only
#                                               (AB_ENV_B likewise), e.g.
#   AB_ENV_A=HERD_BENCH_NO_CHECKSUMS=1 bench/ab.sh HEAD HEAD 1G 3
set -euo pipefail
# fio's nbd engine cannot load client certificates: reach the nodes through
# their local socket unless HERD_BENCH_NBD says otherwise.
: "${HERD_BENCH_NBD:=socket}"
export HERD_BENCH_NBD
source "$(dirname "$0")/lib.sh"
rev_a=${1:?usage: bench/ab.sh REV_A REV_B [SIZE] [ROUNDS]}
rev_b=${2:?usage: bench/ab.sh REV_A REV_B [SIZE] [ROUNDS]}
size=${3:-1G}
: "${AB_ENV_A:=}" "${AB_ENV_B:=}"
rounds=${4:-3}
shared=$(cd "$root/../shared/bench" && pwd)
out=$work/ab-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
for label in A B; do
  rev=$rev_a
  [ "$label" = B ] && rev=$rev_b
  src=$out/src-$label
  mkdir -p "$src"
  git -C "$root" archive "$(git -C "$root" rev-parse "$rev")" | tar -x -C "$src"
  (cd "$src" && go build -tags testknobs -ldflags "$(ldflags "$src" "$rev")" -o "$out/herd-$label" ./cmd/herd)
  env_vars=$AB_ENV_A
  [ "$label" = B ] && env_vars=$AB_ENV_B
  echo "$label = $rev ($(git -C "$root" rev-parse --short "$rev")) ${env_vars}" | tee -a "$out/revisions.txt"
done
jobs="precondition randwrite-qd1 randwrite-qd32 randread-qd1 randread-qd32 syncwrite-qd1"
case ${AB_JOBS:-} in
"") ;;
all) jobs="precondition seqwrite seqread randwrite-qd1 randwrite-qd32 randread-qd1 randread-qd32 syncwrite-qd1" ;;
*) jobs="precondition $AB_JOBS" ;;
esac
for round in $(seq 1 "$rounds"); do
  for label in A B; do
    bin=$out/herd-$label
    env_vars=$AB_ENV_A
    [ "$label" = B ] && env_vars=$AB_ENV_B
    echo "== round $round: $label ${env_vars}"
    for kv in $env_vars; do export "${kv?}"; done
    start_cluster 3 3 bench "$size"
    for kv in $env_vars; do unset "${kv%%=*}"; done
    JOBS=$jobs run_jobs "$label-$round" "$out" --ioengine=nbd --uri="$uri"
    stop_all
  done
done
python3 - "$out" "$rounds" <<'PY'
import sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = {}
    for line in open(os.path.join(out, name + ".txt")):
        f = line.split()
        if len(f) >= 6 and f[1] != "precondition":
            rows[f[1]] = float(f[3])  # IOPS
    return rows
runs = {l: [load(f"{l}-{r}") for r in range(1, rounds + 1)] for l in "AB"}
print("%-15s %28s %28s %8s" % ("job (IOPS)", "A: mean [min-max]", "B: mean [min-max]", "B/A"))
# (seq jobs: IOPS of 1 MiB requests, so MiB/s)
for job in runs["A"][0]:
    a = [r[job] for r in runs["A"]]; b = [r[job] for r in runs["B"]]
    print("%-15s %10.0f [%6.0f-%6.0f] %10.0f [%6.0f-%6.0f] %8.2f" % (job, statistics.mean(a), min(a), max(a), statistics.mean(b), min(b), max(b), statistics.mean(b) / statistics.mean(a)))
def cpu(name):
    rows = {}
    for line in open(os.path.join(out, name + ".cpu")):
        f = line.split()
        if f[2] != "precondition":
            rows[f[2]] = float(f[3])
    return rows
cpus = {l: [cpu(f"{l}-{r}") for r in range(1, rounds + 1)] for l in "AB"}
print()
print("%-15s %28s %28s %8s" % ("CPU µs per op", "A: mean [min-max]", "B: mean [min-max]", "B/A"))
for job in cpus["A"][0]:
    a = [r[job] for r in cpus["A"]]; b = [r[job] for r in cpus["B"]]
    print("%-15s %10.1f [%6.1f-%6.1f] %10.1f [%6.1f-%6.1f] %8.2f" % (job, statistics.mean(a), min(a), max(a), statistics.mean(b), min(b), max(b), statistics.mean(b) / statistics.mean(a)))
PY
echo "results in $out"
