#!/usr/bin/env bash
# Per-VDI QoS on one gateway (docs/BENCHMARKS.md "Per-VDI QoS"):
#
#  1. fairness: two VDIs open through node 1 of a 3-node cluster (3
#     copies); the p99 latency of a QD1 4 KiB job (randread, then
#     randwrite) on "small", alone and beside a QD128 4 KiB randwrite
#     job on "bulk";
#  2. limit accuracy (skipped by a herd without `vdi set --iops-limit`):
#     achieved IOPS and bandwidth of a QD16 job under --write-iops-limit,
#     --read-iops-limit and --write-bps-limit, and after a live change.
#
#   bench/qos.sh [SECONDS]        (each measured job; default 10)
#
# HERD_REV=REV measures another revision (bench/lib.sh), HERD_BENCH_ARGS
# adds server flags (--fair-slots N), QOS_FAIRNESS_ONLY=1 skips part 2;
# HERD_BENCH_DIR and HERD_BENCH_PREFIX keep runs of others apart. Clients reach
# node 1 over plaintext TCP (fio's nbd engine has no TLS client certificate).
source "$(dirname "$0")/lib.sh"
seconds=${1:-10}
export HERD_BENCH_NBD=${HERD_BENCH_NBD:-plain}
build
start_cluster 3 3 bulk 4G
"$bin" vdi create small 1G >/dev/null
base=${uri%/bulk}
small="$base/small"
bulk="$base/bulk"
echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== prefill: 256 MiB of small, 1 GiB of bulk (every object allocated)"
fio --name=fill --ioengine=nbd --uri="$small" --rw=write --bs=1M --iodepth=8 --size=256M >/dev/null
fio --name=fill --ioengine=nbd --uri="$bulk" --rw=write --bs=1M --iodepth=8 --size=1G >/dev/null

# job NAME URI RW BS DEPTH SECONDS [extra fio args]: prints a summary line
job() {
  local name=$1 target=$2 rw=$3 bs=$4 depth=$5 secs=$6
  shift 6
  fio --name="$name" --ioengine=nbd --uri="$target" --rw="$rw" --bs="$bs" --iodepth="$depth" \
    --size=256M --time_based --runtime="$secs" --output-format=json "$@" > "$work/$name.json" 2>/dev/null
  python3 - "$work/$name.json" "$name" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
d = json.loads(text[text.index("{"):])
j = d["jobs"][0]
for kind in ("read", "write"):
    r = j[kind]
    if r["total_ios"] == 0:
        continue
    p = r["clat_ns"]["percentile"]
    print("%-28s %-5s %8.0f IOPS %8.1f MiB/s  p50 %7.0f us  p99 %7.0f us  p99.9 %7.0f us" % (
        sys.argv[2], kind, r["iops"], r["bw_bytes"] / 2**20, p["50.000000"] / 1000, p["99.000000"] / 1000, p["99.900000"] / 1000))
PY
}

echo "== fairness: QD1 on small alone"
job qd1-randread-alone "$small" randread 4k 1 "$seconds"
job qd1-randwrite-alone "$small" randwrite 4k 1 "$seconds"
echo "== fairness: QD1 on small beside QD128 randwrite 4k on bulk"
fio --name=qd128 --ioengine=nbd --uri="$bulk" --rw=randwrite --bs=4k --iodepth=128 --size=1G \
  --time_based --runtime=$((2 * seconds + 6)) --output-format=json > "$work/qd128.json" 2>/dev/null &
noisy=$!
sleep 3
job qd1-randread-beside-qd128 "$small" randread 4k 1 "$seconds"
job qd1-randwrite-beside-qd128 "$small" randwrite 4k 1 "$seconds"
wait $noisy
python3 - "$work/qd128.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
w = json.loads(text[text.index("{"):])["jobs"][0]["write"]
print("%-28s %-5s %8.0f IOPS                    p50 %7.0f us  p99 %7.0f us" % ("qd128-randwrite (bulk)", "write", w["iops"], w["clat_ns"]["percentile"]["50.000000"] / 1000, w["clat_ns"]["percentile"]["99.000000"] / 1000))
PY

if [ -n "${QOS_FAIRNESS_ONLY:-}" ] || ! "$bin" vdi set --help 2>&1 | grep -q -- --write-iops-limit; then
  echo "== this herd has no per-VDI limits: done"
  exit 0
fi
echo "== fairness with QoS: QD1 on small beside QD128 on bulk limited by --write-iops-limit 1000"
"$bin" vdi set bulk --write-iops-limit 1000 >/dev/null
fio --name=qd128 --ioengine=nbd --uri="$bulk" --rw=randwrite --bs=4k --iodepth=128 --size=1G \
  --time_based --runtime=$((2 * seconds + 6)) --output-format=json > "$work/qd128-limited.json" 2>/dev/null &
noisy=$!
sleep 3
job qd1-randread-beside-limited "$small" randread 4k 1 "$seconds"
job qd1-randwrite-beside-limited "$small" randwrite 4k 1 "$seconds"
wait $noisy
python3 -c 'import json,sys; t=open(sys.argv[1]).read(); w=json.loads(t[t.index("{"):])["jobs"][0]["write"]; print("%-28s %-5s %8.0f IOPS" % ("qd128-randwrite (limited)", "write", w["iops"]))' "$work/qd128-limited.json"
"$bin" vdi set bulk --write-iops-limit 0 >/dev/null
echo "== limit accuracy (QD16 on small)"
"$bin" vdi set small --write-iops-limit 500 >/dev/null
job write-iops-limit-500 "$small" randwrite 4k 16 "$seconds"
"$bin" vdi set small --write-iops-limit 0 --read-iops-limit 1000 >/dev/null
job read-iops-limit-1000 "$small" randread 4k 16 "$seconds"
"$bin" vdi set small --read-iops-limit 0 --write-bps-limit 20MiB >/dev/null
job write-bps-limit-20MiB "$small" write 1M 16 "$seconds"
"$bin" vdi set small --write-bps-limit 0 --iops-limit 300 >/dev/null
job iops-limit-300-randrw "$small" randrw 4k 16 "$seconds"
"$bin" vdi set small --iops-limit 0 >/dev/null
echo "== live change: --write-iops-limit 200, then 400 after $seconds s, same connection"
rm -f "$work"/live_iops*.log
"$bin" vdi set small --write-iops-limit 200 >/dev/null
(sleep "$seconds"; "$bin" vdi set small --write-iops-limit 400 >/dev/null) &
changer=$!
fio --name=live --ioengine=nbd --uri="$small" --rw=randwrite --bs=4k --iodepth=16 --size=256M \
  --time_based --runtime=$((2 * seconds)) --write_iops_log="$work/live" --log_avg_msec=1000 >/dev/null 2>&1
wait $changer
python3 - "$work"/live_iops.1.log "$seconds" <<'PY'
import sys
rows = [l.split(",") for l in open(sys.argv[1]) if l.strip()]
secs = int(sys.argv[2])
first = [int(r[1]) for r in rows if 1000 < int(r[0]) <= (secs - 1) * 1000]
second = [int(r[1]) for r in rows if (secs + 1) * 1000 < int(r[0]) <= 2 * secs * 1000]
print("live change: %.0f IOPS under 200, %.0f IOPS under 400 (per-second means; the first second and the second of the change left out)" % (sum(first) / max(len(first), 1), sum(second) / max(len(second), 1)))
PY
"$bin" vdi set small --write-iops-limit 0 >/dev/null
