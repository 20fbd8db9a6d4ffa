#!/usr/bin/env bash
# The common fio job set (../shared/bench) through fio's nbd engine against
# herd (3 nodes on 127.0.9.1-3, copies 3 and copies 1) and, in the same
# run, against the baseline: qemu-nbd -f raw --cache=none --aio=native
# serving a raw file on the same disk. Prints every job and the ratios,
# and the CPU time per operation of the serving processes (all herd
# nodes; qemu-nbd) in each job's measured window (lib.sh run_jobs).
#
#   bench/fio-compare.sh [SIZE]        (default 2G; HERD_BENCH_DIR picks the disk)
# fio's nbd engine cannot load client certificates: node 1's local socket
# unless HERD_BENCH_NBD says otherwise.
: "${HERD_BENCH_NBD:=socket}"
export HERD_BENCH_NBD
source "$(dirname "$0")/lib.sh"
size=${1:-2G}
shared=$(cd "$root/../shared/bench" && pwd)
out=$work/fio-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
build

echo "== baseline: qemu-nbd raw file ($size)"
start_qemu_nbd "$work/baseline.img" "$size" 10899
run_jobs qemu-nbd "$out" --ioengine=nbd --uri="nbd://127.0.0.1:10899/bench"
stop_all
rm -f "$work/baseline.img"

for copies in 3 1; do
  echo "== herd copies=$copies ($size)"
  start_cluster 3 "$copies" bench "$size"
  run_jobs "herd-c$copies" "$out" --ioengine=nbd --uri="$uri"
  stop_all
done

echo "== ratios (herd / qemu-nbd), MB/s for seq jobs, IOPS otherwise"
python3 - "$out" <<'PY'
import sys, os
out = sys.argv[1]
def load(name):
    rows = {}
    for line in open(os.path.join(out, name + ".txt")):
        f = line.split()
        if len(f) >= 6 and f[1] != "precondition":
            rows[f[1]] = (float(f[2]), float(f[3]), float(f[4]), float(f[5]))
    return rows
base = load("qemu-nbd")
print("%-15s %12s %12s %12s %8s %8s" % ("job", "qemu-nbd", "herd-c3", "herd-c1", "c3/base", "c1/base"))
for job, b in base.items():
    metric = 0 if job.startswith("seq") else 1
    c3, c1 = load("herd-c3").get(job), load("herd-c1").get(job)
    v3 = c3[metric] if c3 else float("nan"); v1 = c1[metric] if c1 else float("nan")
    print("%-15s %12.1f %12.1f %12.1f %8.2f %8.2f" % (job, b[metric], v3, v1, v3 / b[metric], v1 / b[metric]))
def cpu(name):
    rows = {}
    for line in open(os.path.join(out, name + ".cpu")):
        f = line.split()
        rows[f[2]] = (float(f[3]), float(f[4]))
    return rows
cb, c3, c1 = cpu("qemu-nbd"), cpu("herd-c3"), cpu("herd-c1")
print()
print("CPU per operation (µs, every serving process; cores busy)")
print("%-15s %14s %14s %14s" % ("job", "qemu-nbd", "herd-c3", "herd-c1"))
for job in cb:
    cell = lambda rows: "%7.1f (%4.2f)" % rows[job] if job in rows else "-"
    print("%-15s %14s %14s %14s" % (job, cell(cb), cell(c3), cell(c1)))
PY
echo "results in $out"
