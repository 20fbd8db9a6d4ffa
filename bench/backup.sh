#!/usr/bin/env bash
# Backup rates: a full backup, an incremental one after 1% of
# the VDI changed, and a restore, of a VDI of GIB GiB holding random data,
# into a store on the same disk, against that disk's bandwidth measured
# in the same run (dd, O_DIRECT, 1 GiB). Prints each step's time, bytes
# read from the cluster and bytes added to the store, and the ratio of
# the full backup's time to the incremental's.
#   bench/backup.sh [GIB]      (default 4)
source "$(dirname "$0")/lib.sh"
gib=${1:-4}
build
echo "== disk bandwidth (dd, 1 GiB, O_DIRECT, same disk)"
dd if=/dev/zero of="$work/dd.img" bs=4M count=256 oflag=direct 2>&1 | tail -1
dd if="$work/dd.img" of=/dev/null bs=4M iflag=direct 2>&1 | tail -1
rm -f "$work/dd.img"
start_cluster 3 2 vm "${gib}G"
echo "== writing ${gib} GiB of random data"
head -c "$((gib << 30))" /dev/urandom > "$work/random.img"
"$bin" vdi import vm "$work/random.img" 2>&1 | tail -1
rm -f "$work/random.img"
store=$work/store
rm -rf "$store"
step() { # label command...
  local start end label=$1
  shift
  start=$(date +%s.%N)
  "$@" > "$work/step.json"
  end=$(date +%s.%N)
  python3 - "$label" "$start" "$end" "$work/step.json" <<'PY' | tee -a "$work/steps.txt"
import json, sys
label, start, end, path = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
took = end - start
try:
    d = json.load(open(path))
except Exception:
    d = {}
st = d.get("stats", {})
read, new = st.get("read_bytes", d.get("data_bytes", 0)), st.get("new_bytes", 0)
phases = " ".join("%s %.2f" % (k, v) for k, v in sorted(st.get("phases", {}).items()))
print("%-12s %7.2f s  read %6d MiB (%5.0f MB/s)  added %6d MiB  %s" % (label.split()[-1], took, read >> 20, read / took / 1e6, new >> 20, phases))
PY
}
: > "$work/steps.txt"
step "backup full" "$bin" --json backup create ${BACKUP_ARGS:-} vm "$store"
# 1% of the VDI, in writes of CHANGE_MIB (default 1) spread evenly over
# the disk: with 1 MiB, each write is in its own 4 MiB object (the worst
# case for object-granular change tracking: 4x the bytes are read); with
# 4, whole objects.
mib=${CHANGE_MIB:-1}
changes=$(( (gib << 10) / 100 / mib ))
stride=$(( (gib << 10) / changes / 4 * 4 ))
args=()
for i in $(seq 0 $((changes - 1))); do args+=(-c "write -P $((i % 200 + 1)) $((i * stride))M ${mib}M"); done
qemu-io -f raw "${args[@]}" "nbd+unix:///vm?socket=$work/cluster/node1/nbd.sock" > /dev/null
echo "== changed $((changes * mib)) MiB in ${changes} writes of ${mib} MiB"
step "backup incremental" "$bin" --json backup create ${BACKUP_ARGS:-} vm "$store"
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/step.json")
step "restore restore" "$bin" --json backup restore "$store" "$id" restored
python3 - "$work/steps.txt" <<'PY'
import re, sys
t = {}
for line in open(sys.argv[1]):
    name, secs = line.split()[0], float(line.split()[1])
    t[name] = secs
print("full / incremental time: %.1fx" % (t["full"] / t["incremental"]))
PY
du -sh "$store"
