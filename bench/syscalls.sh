#!/usr/bin/env bash
# System calls and context switches per operation, summed over the three
# nodes (copies 3), for two herd revisions: counts, not times, so they
# compare across runs on this shared machine where rates move 10-30%.
# Each job is fio's nbd engine on a fixed number of 4 KiB operations;
# `perf stat -e raw_syscalls:sys_enter,context-switches` (software
# events, which this VM has) is attached to the nodes for the job.
#
#   bench/syscalls.sh REV_A REV_B [OPS]    e.g. bench/syscalls.sh 3527dd5 HEAD 20000
set -euo pipefail
: "${HERD_BENCH_NBD:=socket}"
export HERD_BENCH_NBD
source "$(dirname "$0")/lib.sh"
rev_a=${1:?usage: bench/syscalls.sh REV_A REV_B [OPS]}
rev_b=${2:?usage: bench/syscalls.sh REV_A REV_B [OPS]}
ops=${3:-20000}
command -v perf >/dev/null || { echo "bench/syscalls.sh: perf is missing (Debian: linux-perf)" >&2; exit 1; }
out=$work/syscalls-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
for label in A B; do
  rev=$rev_a
  [ "$label" = B ] && rev=$rev_b
  mkdir -p "$out/src-$label"
  git -C "$root" archive "$(git -C "$root" rev-parse "$rev")" | tar -x -C "$out/src-$label"
  (cd "$out/src-$label" && go build -ldflags "$(ldflags "$out/src-$label" "$rev")" -o "$out/herd-$label" ./cmd/herd)
  echo "$label = $rev ($(git -C "$root" rev-parse --short "$rev"))"
done
# job: name rw iodepth
jobs=("randwrite-qd1 randwrite 1" "randwrite-qd32 randwrite 32" "randread-qd32 randread 32" "syncwrite-qd1 write 1")
printf '%-16s %-3s %12s %12s %10s\n' job rev syscalls/op ctxsw/op IOPS
for label in A B; do
  bin=$out/herd-$label
  start_cluster 3 3 bench 1G
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=1G >/dev/null
  for job in "${jobs[@]}"; do
    read -r name rw depth <<<"$job"
    extra=()
    [ "$name" = syncwrite-qd1 ] && extra=(--fsync=1)
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$(IFS=,; echo "${pids[*]}")" \
      -o "$out/$label-$name.perf" -- \
      fio --name="$name" --ioengine=nbd --uri="$uri" --rw="$rw" --bs=4k --iodepth="$depth" \
        --size=1G --number_ios="$ops" --randrepeat=0 "${extra[@]}" --output-format=json --output="$out/$label-$name.json"
    python3 - "$out/$label-$name.perf" "$out/$label-$name.json" "$name" "$label" <<'PY'
import json, sys
perf, fio, name, label = sys.argv[1:5]
counts = {}
for line in open(perf):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].isdigit():
        counts[f[2]] = int(f[0])
text = open(fio).read()
job = json.loads(text[text.index("{"):])["jobs"][0]
ops = sum(job[d]["total_ios"] for d in ("read", "write"))
iops = sum(job[d]["iops"] for d in ("read", "write"))
print("%-16s %-3s %12.1f %12.2f %10.0f" % (name, label, counts["raw_syscalls:sys_enter"] / ops, counts["context-switches"] / ops, iops))
PY
  done
  stop_all
done | sort -s -k1,1
echo "results in $out"
