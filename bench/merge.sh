#!/usr/bin/env bash
# Merges of deleted snapshots (docs/ARCHITECTURE.md, "Space that comes
# back"): the merge rate at the default --merge-rate (64 MiB/s), and its
# effect on a VM-like fio job (4 KiB random writes, queue depth 1,
# through NBD: the shared job randwrite-qd1) on the same cluster: its
# p99 completion latency without a merge, then with one running, in the
# same run. Prints every number and the ratio of the two p99s.
#
# 3 nodes, 2 copies (HERD_BENCH_ARGS adds server flags, e.g.
# "--merge-rate 0"). Two VDIs: "vm" (1 GiB, written whole first, so
# fio's writes never copy on write) is the VM; "data" (GIB GiB of random
# data) is the disk whose backup snapshots merge: a merge copies every
# object of the deleted snapshot into its child, the next backup
# snapshot (all of them: the child, a snapshot, owns none), on the
# leader, node 1, which fio's connection goes through too.
#   bench/merge.sh [GIB]       (default 2: a merge of about 32 s)
source "$(dirname "$0")/lib.sh"
shared=$(cd "$root/../shared/bench" && pwd)
gib=${1:-2}
export HERD_BENCH_NBD=socket
build
start_cluster 3 2 vm 1G
vm_uri=$uri
"$bin" vdi create data "${gib}G" >/dev/null
out=$work/merge
rm -rf "$out" && mkdir -p "$out"

echo "== writing vm whole (1 GiB) and ${gib} GiB of random data into data"
JOBS=precondition "$shared/run-fio.sh" precondition "$out" --ioengine=nbd --uri="$vm_uri" >/dev/null
head -c "$((gib << 30))" /dev/urandom > "$work/random.img"
"$bin" vdi import data "$work/random.img" >/dev/null
rm -f "$work/random.img"

# metric NAME: the sum of a herd_merge_* counter over the nodes.
metric() {
  local i total=0 v
  for i in 1 2 3; do
    v=$(curl -kfsS -H "Authorization: Bearer $HERD_TOKEN" "https://$prefix.$i:7080/metrics" | awk -v n="$1" '$1 == n { print $2 }')
    total=$(python3 -c "print($total + ${v:-0})")
  done
  echo "$total"
}
# merging: 0 once the tree has no deleted VDI (the merge committed).
merging() { "$bin" --json vdi tree | python3 -c 'import json,sys; print(sum(1 for v in json.load(sys.stdin) if v.get("deleted")))'; }
# merge TAG_OLD TAG_NEW: snapshot data as TAG_NEW, delete data@TAG_OLD
# (it merges into TAG_NEW); sets merge_started.
merge() {
  "$bin" vdi snapshot data --tag "$2" >/dev/null
  copied_before=$(metric herd_merge_objects_copied_total)
  before_used=$(used)
  merge_started=$(date +%s.%N)
  "$bin" vdi delete "data@$1" >/dev/null
}
# used: the space the nodes' object files take, summed (node list).
used() { "$bin" --json node list | python3 -c 'import json,sys; print(sum(n.get("used_bytes", 0) for n in json.load(sys.stdin)))'; }
# merge_wait LABEL: wait for the merge, print its rate, and the space
# used before it, at its peak and once the layer is freed.
merge_wait() {
  local peak=$before_used now
  while [ "$(merging)" != 0 ]; do
    now=$(used)
    [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.2
  done
  local ended copied
  ended=$(date +%s.%N)
  copied=$(python3 -c "print(int($(metric herd_merge_objects_copied_total) - $copied_before))")
  python3 -c "
took = $ended - $merge_started
mib = $copied * 4
print('merge %-22s %5d objects (%6d MiB) in %6.1f s: %6.1f MiB/s' % ('$1', $copied, mib, took, mib / took))" | tee -a "$out/results.txt"
  # The merged layer goes to the garbage list; its objects are freed
  # within a few seconds.
  local freed=$peak
  for _ in $(seq 100); do
    freed=$(used)
    [ "$freed" -le $((before_used + before_used / 20)) ] && break
    sleep 0.2
  done
  echo "space used (all nodes): $((before_used >> 20)) MiB before, $((peak >> 20)) MiB at the peak of the merge, $((freed >> 20)) MiB once the layer was freed" | tee -a "$out/results.txt"
}

: > "$out/results.txt"
"$bin" vdi snapshot data --tag b1 >/dev/null
echo "== a merge alone (data@b1 into data@b2)"
merge b1 b2
merge_wait "alone"

echo "== fio randwrite-qd1 on vm, no merge running"
JOBS=randwrite-qd1 "$shared/run-fio.sh" without "$out" --ioengine=nbd --uri="$vm_uri" | tee "$out/without.txt"

echo "== fio randwrite-qd1 on vm while data@b2 merges into data@b3"
merge b2 b3
JOBS=randwrite-qd1 "$shared/run-fio.sh" with "$out" --ioengine=nbd --uri="$vm_uri" | tee "$out/with.txt"
still=$(merging)
merge_wait "beside fio"
if [ "$still" = 0 ]; then
  echo "warning: the merge ended before fio did: part of fio's window had no merge (use a larger GIB)" >&2
fi
python3 - "$out/without.txt" "$out/with.txt" <<'PY'
import sys
def p99(path):
    f = open(path).read().split()
    return float(f[2]), float(f[3]), float(f[4]), float(f[5])
mb0, iops0, p50_0, p99_0 = p99(sys.argv[1])
mb1, iops1, p50_1, p99_1 = p99(sys.argv[2])
print("fio 4k randwrite qd1: IOPS %.0f -> %.0f (x%.2f), p50 %.0f -> %.0f us (x%.2f), p99 %.0f -> %.0f us: with a merge running, p99 x%.2f"
      % (iops0, iops1, iops1 / iops0, p50_0, p50_1, p50_1 / p50_0, p99_0, p99_1, p99_1 / p99_0))
PY
