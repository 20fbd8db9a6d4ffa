#!/usr/bin/env bash
# The Sheepdog paper's Table 4: sequential writes, O_DIRECT, iodepth 1, at
# buffer sizes 512 B .. 512 KiB, through herd with copies 1, 2 and 3 (fio's
# nbd engine: no client cache), next to a local file on the same disk
# (libaio, direct=1) measured in the same run. Prints MB/s and the ratio.
#
#   bench/table4.sh [SECONDS]     (default 10 per point)
#   HERD_REV=REV bench/table4.sh  the same for a git revision of herd
# fio's nbd engine cannot load client certificates: reach the nodes through
# node 1's local socket unless HERD_BENCH_NBD says otherwise.
: "${HERD_BENCH_NBD:=socket}"
export HERD_BENCH_NBD
source "$(dirname "$0")/lib.sh"
seconds=${1:-10}
sizes="512 2k 8k 32k 128k 512k"
out=$work/table4-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
build

run() { # label bs fio-target-args...
  local label=$1 bs=$2; shift 2
  fio --name=t4 --rw=write --bs="$bs" --iodepth=1 --numjobs=1 --time_based --runtime="$seconds" \
    --size=1G --output-format=json "$@" > "$out/$label-$bs.json"
  # fio's nbd engine prints a line before the JSON
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index("{"):]); print("%.2f" % (d["jobs"][0]["write"]["bw_bytes"]/1e6))' "$out/$label-$bs.json"
}

declare -A mbs
for bs in $sizes; do
  mbs[local,$bs]=$(run local "$bs" --ioengine=libaio --direct=1 --filename="$work/local.img")
done
rm -f "$work/local.img"
for copies in 1 2 3; do
  start_cluster 3 "$copies" t4 2G
  for bs in $sizes; do
    mbs[c$copies,$bs]=$(run "herd-c$copies" "$bs" --ioengine=nbd --uri="$uri")
  done
  stop_all
done
printf "%-8s %10s %10s %10s %10s %8s %8s %8s\n" bs local herd-c1 herd-c2 herd-c3 c1/local c2/local c3/local
for bs in $sizes; do
  l=${mbs[local,$bs]}
  printf "%-8s %10s %10s %10s %10s %8.3f %8.3f %8.3f\n" "$bs" "$l" "${mbs[c1,$bs]}" "${mbs[c2,$bs]}" "${mbs[c3,$bs]}" \
    "$(echo "${mbs[c1,$bs]} / $l" | bc -l)" "$(echo "${mbs[c2,$bs]} / $l" | bc -l)" "$(echo "${mbs[c3,$bs]} / $l" | bc -l)"
done | tee "$out/table4.txt"
echo "results in $out"
