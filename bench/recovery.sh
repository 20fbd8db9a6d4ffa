#!/usr/bin/env bash
# Time to restore full redundancy after one of 4 nodes dies, against this
# disk's bandwidth measured in the same run, and client read latency (4K
# random reads, QD1, p99) before and during recovery.
#   bench/recovery.sh [GIB]      (default 2)
source "$(dirname "$0")/lib.sh"
gib=${1:-2}
build
echo "== disk bandwidth (dd, 1 GiB, O_DIRECT, same disk)"
dd if=/dev/zero of="$work/dd.img" bs=4M count=256 oflag=direct 2>&1 | tail -1
rm -f "$work/dd.img"
start_cluster 4 3 rec "${gib}G"
echo "== writing ${gib} GiB of random data"
head -c "$((gib << 30))" /dev/urandom > "$work/random.img"
nbdcopy --flush "$work/random.img" "$uri"
rm -f "$work/random.img"
p99() { # label seconds
  fio --name="$1" --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=1 \
    --time_based --runtime="$2" --output-format=json > "$work/$1.json" 2>/dev/null
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index("{"):]); r=d["jobs"][0]["read"]; print("%s: %.0f IOPS, p50 %.0f us, p99 %.0f us" % (sys.argv[2], r["iops"], r["clat_ns"]["percentile"]["50.000000"]/1000, r["clat_ns"]["percentile"]["99.000000"]/1000))' "$work/$1.json" "$1"
}
p99 before 10
epoch=$("$bin" --json cluster info | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])')
held=$(curl -fsS -H "Authorization: Bearer $HERD_TOKEN" "http://$prefix.4:7080/v1/local/usage" | python3 -c 'import json,sys; print(json.load(sys.stdin)["used_bytes"])')
echo "== killing node 4 (holding $((held >> 20)) MiB)"
victim=${pids[3]}
ours "$victim" "$work" && kill -9 "$victim"
killed=$(date +%s.%N)
p99 during 15 &
latency=$!
while :; do
  state=$("$bin" --json node recovery 2>/dev/null | python3 -c '
import json,sys
entries=json.load(sys.stdin)
print("done" if len(entries)==3 and all(e["status"]["state"]=="done" and e["status"]["epoch"]>'"$epoch"' for e in entries) else "busy")' 2>/dev/null || echo busy)
  [ "$state" = done ] && break
  sleep 0.2
done
restored=$(date +%s.%N)
wait $latency
python3 - "$killed" "$restored" "$held" <<'PY'
import sys
killed, restored, held = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
took = restored - killed
print("redundancy restored %.1f s after the kill (failure detection included): %d MiB re-replicated, %.0f MB/s" % (took, held >> 20, held / took / 1e6))
PY
"$bin" node recovery
