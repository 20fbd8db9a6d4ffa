#!/usr/bin/env bash
# Zones far apart: sequential write throughput (fio, nbd engine,
# 1 MiB blocks, QD16, 20 s) of a VDI whose two copies span two zones, with
# no delay and with DELAY each way between the zones (25ms: 50 ms RTT), in
# one run; prints both and the ratio; then the delay again with the VDI
# set to --ack zone (acknowledged once zone a has a write, zone b catching
# up before the next FLUSH: internal/gateway/lag.go). Four nodes (zones
# a b a b), the client on node 1 (zone a) through its local socket.
#   bench/wan.sh [DELAY]      (default 25ms)
source "$(dirname "$0")/lib.sh"
delay=${1:-25ms}
build
export HERD_BENCH_NBD=socket HERD_BENCH_ZONES="a b"
run() { # label [ACK]
  start_cluster 4 2 wan 8G
  [ -n "${2:-}" ] && "$bin" vdi set wan --ack "$2" >/dev/null
  fio --name="$1" --ioengine=nbd --uri="$uri" --rw=write --bs=1M --iodepth=16 --size=8G \
    --time_based --runtime=20 --end_fsync=1 --output-format=json > "$work/wan-$1.json" 2>/dev/null
  python3 -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.loads(t[t.index("{"):]); w=d["jobs"][0]["write"]; print("%s: %.0f MiB/s, p50 %.1f ms, p99 %.1f ms" % (sys.argv[2], w["bw"]/1024, w["clat_ns"]["percentile"]["50.000000"]/1e6, w["clat_ns"]["percentile"]["99.000000"]/1e6))' "$work/wan-$1.json" "$1" | tee -a "$work/wan.txt"
  stop_all
}
: > "$work/wan.txt"
HERD_BENCH_ZONE_DELAY= run near
HERD_BENCH_ZONE_DELAY=$delay run far
HERD_BENCH_ZONE_DELAY=$delay run far-ack-zone zone
python3 - "$work/wan.txt" <<'PY'
import re, sys
bw = {l.split(":")[0]: float(re.search(r": (\d+) MiB/s", l).group(1)) for l in open(sys.argv[1])}
print("with the delay / without: %.2f" % (bw["far"] / bw["near"]))
print("with the delay, --ack zone / without the delay: %.2f" % (bw["far-ack-zone"] / bw["near"]))
PY
