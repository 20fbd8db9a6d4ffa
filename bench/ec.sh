#!/usr/bin/env bash
# Erasure-coded VDIs against copies, in one run on this machine
# (docs/BENCHMARKS.md, "Erasure-coded VDIs"): a 6-node cluster (copies 3,
# plaintext NBD over TCP, every client through node 1) holding a copies-3
# VDI "c3", a 4+2 VDI "ec" and, for the space figure, a 2+1 VDI "ec21",
# all of SIZE; then two 7-node clusters for the rebuild. Items:
#
#  space    each VDI written whole (the shared job set's precondition),
#           closed (the close folds) and left until its object files stop
#           changing; the allocated bytes (st_blocks) of its object files
#           on all nodes over the bytes written.
#  perf     the shared job set's measured jobs (not syncwrite), c3 and ec
#           alternated job by job, the order swapped every round: MB/s or
#           IOPS, latency, and the nodes' CPU time per operation (lib.sh
#           run_jobs). Before each job the nodes are let settle (an EC
#           close folds every object written).
#  amp      AMP_WRITES 4 KiB random writes at QD32 (a fixed count), with
#           the VDI held open by another client so that fio's close does
#           not fold: the nodes' /proc/PID/io (bytes dirtied in the page
#           cache less those cancelled, bytes read from the disk, read and
#           write system calls) per write, the object files' pages dropped
#           from the page cache first; then, separately, what the fold
#           that follows 5 s later costs, and how many objects it folded.
#  degraded 4 KiB random reads at QD1 (DEG_SECONDS measured) of c3 and ec
#           with 0, 1 and 2 nodes killed (kill -9; never node 1; the
#           victims hold chunks of every object: 6 chunks on 6 nodes),
#           each after the epoch dropped the node and recovery ended.
#  rebuild  a 7-node cluster with one VDI of REBUILD_SIZE (copies 3, then
#           4+2, alternated over REBUILD_ROUNDS), written whole and
#           closed; the node holding most of it is killed -9, and the time
#           until every object is whole on the survivors again (copies:
#           3 copies, recovery done; 4+2: 6 chunks on 6 survivors in one
#           slot, which the steward of the unopened VDI refolds) and the
#           survivors' disk reads and writes over it, cold page cache.
#
#   bench/ec.sh [SIZE] [ROUNDS] [REBUILD_SIZE]    defaults 256M 2 256M
#
# EC_ITEMS picks items (default "space perf amp degraded rebuild"; perf,
# amp and degraded need space's fill), AMP_WRITES (default 8192),
# DEG_SECONDS (default 10), REBUILD_ROUNDS (default 1). Runs as root (it
# reads the nodes' /proc/PID/io). HERD_BENCH_DIR and HERD_BENCH_PREFIX keep
# runs of others apart. Results: one JSON line per measurement in
# OUT/results.jsonl; bench/ec.py report OUT prints the tables again.
set -euo pipefail
export HERD_BENCH_NBD=plain
source "$(dirname "$0")/lib.sh"
size=${1:-256M}
rounds=${2:-2}
rsize=${3:-256M}
items=${EC_ITEMS:-space perf amp degraded rebuild}
amp_writes=${AMP_WRITES:-8192}
deg_seconds=${DEG_SECONDS:-10}
rebuild_rounds=${REBUILD_ROUNDS:-1}
shared=$(cd "$root/../shared/bench" && pwd)
helper=$root/bench/ec.py
# The distribution's python: it has libnbd's module, and starts in a
# tenth of the time of a version manager's shim (this script runs it
# often, on a loaded machine).
py=/usr/bin/python3
"$py" -c 'import nbd' 2>/dev/null || { echo "ec.sh: $py cannot import nbd (install python3-libnbd)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "ec.sh: run as root (it reads the nodes' /proc/PID/io)" >&2; exit 1; }
hz=$(getconf CLK_TCK)
out=$work/ec-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out"
has() { case " $items " in *" $1 "*) return 0 ;; esac; return 1; }
log() { echo "== $(date +%H:%M:%S) $*" >&2; }
record() { "$py" "$helper" record "$out" "$@"; }

build
# lib.sh's run_jobs and the shared run-fio.sh call python3 once per job:
# the distribution's too.
PATH=$(dirname "$py"):$PATH
echo "herd $(git -C "$root" rev-parse --short HEAD), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/machine.txt"

alive=()
nodes=0

# node_pids: the pids of the live nodes.
node_pids() {
  local i
  for i in "${alive[@]}"; do echo "${pids[$((i - 1))]}"; done
}

vdi_id() { "$bin" --json vdi info "$1" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["id"])'; }
vdi_bytes() { "$bin" --json vdi info "$1" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["size"])'; }
census() { "$py" "$helper" census "$work/cluster" "$1" "${alive[@]}"; }
io_snap() { "$py" "$helper" io-snap $(node_pids); }
epoch() { "$bin" --json cluster info | "$py" -c 'import json,sys; print(json.load(sys.stdin)["epoch"])'; }

# cluster NODES VDI SIZE: a fresh cluster of NODES nodes (copies 3) with
# the VDI start_cluster creates (VDI_ARGS), and the CPU it uses idle.
cluster() {
  nodes=$1
  start_cluster "$nodes" 3 "$2" "$3"
  alive=($(seq 1 "$nodes"))
  sleep 2
  local t0 t1
  t0=$(cpu_ticks)
  sleep 3
  t1=$(cpu_ticks)
  # Quiet: at most what the idle cluster uses (raft heartbeats, gossip)
  # plus a quarter of a core.
  quiet=$(((t1 - t0) / 3 + hz / 4))
  log "$nodes nodes up, idle CPU $(((t1 - t0) * 100 / 3 / hz))% of a core"
}

# settle VDI_ID: until the VDI's object files have not changed for 2 s
# and the nodes are quiet (a fold in progress changes both), at most 2
# minutes; says so when it took long.
settle() {
  local said
  said=$("$py" "$helper" settle "$work/cluster" "$1" "$quiet" $(node_pids) -- "${alive[@]}")
  case $said in
  "settled in "[0-9]" s") ;;
  *) log "vdi $1: $said" ;;
  esac
}

# wait_alive N: until the epoch has N live nodes.
wait_alive() {
  local want=$1 deadline=$((SECONDS + 120)) n
  while :; do
    n=$("$bin" --json cluster info 2>/dev/null | "$py" -c 'import json,sys; print(json.load(sys.stdin)["nodes_alive"])' 2>/dev/null || echo "?")
    [ "$n" = "$want" ] && return 0
    if [ $SECONDS -ge $deadline ]; then
      echo "ec.sh: no epoch with $want live nodes after 2 minutes (nodes_alive $n)" >&2
      return 1
    fi
    sleep 0.2
  done
}

# recovered EPOCH: "yes" when every live node's recovery pass of an
# epoch after EPOCH is done.
recovered() {
  "$bin" --json node recovery 2>/dev/null | "$py" -c '
import json, sys
entries = json.load(sys.stdin)
ok = len(entries) == int(sys.argv[2]) and all(e["status"]["state"] == "done" and e["status"]["epoch"] > int(sys.argv[1]) and e["status"]["remaining"] == 0 for e in entries)
print("yes" if ok else "no")' "$1" "${#alive[@]}" 2>/dev/null || echo no
}

wait_recovered() {
  local since=$1 deadline=$((SECONDS + 180))
  until [ "$(recovered "$since")" = yes ]; do
    if [ $SECONDS -ge $deadline ]; then
      echo "ec.sh: recovery after epoch $since not done after 3 minutes:" >&2
      "$bin" node recovery >&2 || true
      return 1
    fi
    sleep 0.5
  done
}

kill_node() {
  local i=$1 pid=${pids[$(($1 - 1))]} a=()
  if ours "$pid" "$work"; then
    kill -9 "$pid"
    wait "$pid" 2>/dev/null || true # reaped here, not reported as killed
  fi
  for j in "${alive[@]}"; do [ "$j" = "$i" ] || a+=("$j"); done
  alive=("${a[@]}")
}

# hold URI: keep the VDI open for writing through another client until
# unhold, so that fio's close is not the last writer's (which folds).
hold() {
  rm -f "$out/hold.fifo" "$out/hold.out"
  mkfifo "$out/hold.fifo"
  "$py" -c 'import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("open", flush=True)
sys.stdin.read()
h.shutdown()' "$1" <"$out/hold.fifo" >"$out/hold.out" &
  holder=$!
  exec 8>"$out/hold.fifo"
  for _ in $(seq 100); do grep -q open "$out/hold.out" && return 0; sleep 0.1; done
  echo "ec.sh: the holding client did not connect to $1" >&2
  return 1
}
unhold() {
  exec 8>&-
  wait "$holder" || true
}

setups() { # ROUND: c3 and ec, swapped every other round
  if [ $(($1 % 2)) -eq 1 ]; then echo c3 ec; else echo ec c3; fi
}

if has space || has perf || has amp || has degraded; then
  log "6-node cluster: c3 (copies 3), ec (4+2), ec21 (2+1), $size each"
  VDI_ARGS="" cluster 6 c3 "$size"
  "$bin" vdi create ec "$size" --ec 4+2 >/dev/null
  "$bin" vdi create ec21 "$size" --ec 2+1 >/dev/null
  declare -A ids
  for v in c3 ec ec21; do ids[$v]=$(vdi_id $v); done
  logical=$(vdi_bytes c3)

  # 1. Space (and the fill every later item reads).
  for v in c3 ec ec21; do
    log "space: writing $v whole"
    JOBS=precondition run_jobs "fill-$v" "$out" --ioengine=nbd --uri="$(nbd_uri "$v")" >/dev/null
    settle "${ids[$v]}"
    census "${ids[$v]}" >"$out/space-$v.json"
    record item=space setup="$v" logical="$logical" census="$(cat "$out/space-$v.json")" \
      fill="$("$py" "$helper" fio "$out/fill-$v-precondition.json")"
  done
  # The 2+1 VDI is not measured further: with a node down it would be
  # rebuilt (5 nodes place 3 chunks) beside the degraded reads.
  "$bin" vdi delete ec21 >/dev/null
  settle "${ids[ec21]}"
  # What the idle cluster uses (raft heartbeats, gossip, the folder's
  # ticks): part of every CPU-per-operation figure, which the report also
  # gives without it.
  t0=$(cpu_ticks)
  sleep 5
  t1=$(cpu_ticks)
  record item=idle nodes=6 cores="$("$py" -c 'import sys; print(float(sys.argv[1]) / float(sys.argv[2]) / 5)' $((t1 - t0)) "$hz")"
  "$py" "$helper" report "$out" 2>/dev/null | sed -n '/== 1/,/^precondition/p'

  # 2. The shared job set.
  if has perf; then
    for round in $(seq 1 "$rounds"); do
      for job in seqwrite seqread randwrite-qd1 randwrite-qd32 randread-qd1 randread-qd32; do
        for v in $(setups "$round"); do
          settle "${ids[$v]}"
          log "perf round $round: $job on $v"
          SKIP_PRECOND=1 JOBS=$job run_jobs "$v-$round-$job" "$out" --ioengine=nbd --uri="$(nbd_uri "$v")"
          "$py" "$helper" perf "$out" "$out/$v-$round-$job-$job.json" "$out/$v-$round-$job.cpu" \
            item=perf setup="$v" round="$round" job="$job"
        done
      done
    done
  fi

  # 3. Small writes and the fold after them (counts, which vary little
  # between rounds: one round).
  if has amp; then
    for round in 1; do
      for v in $(setups "$round"); do
        id=${ids[$v]}
        settle "$id"
        log "amp round $round: $amp_writes random 4 KiB writes on $v"
        census "$id" >"$out/amp-$v-$round-before.json"
        sync
        "$py" "$helper" evict "$work/cluster" >/dev/null
        hold "$(nbd_uri "$v")"
        io_snap >"$out/amp-$v-$round-a.json"
        fio --name=amp --ioengine=nbd --uri="$(nbd_uri "$v")" --rw=randwrite --bs=4k --iodepth=32 \
          --io_size=$((amp_writes * 4))k --norandommap --randrepeat=0 --output-format=json >"$out/amp-$v-$round.json"
        io_snap >"$out/amp-$v-$round-b.json"
        # The folder folds an overlay 5 s after its last write.
        sleep 6
        settle "$id"
        unhold
        settle "$id"
        io_snap >"$out/amp-$v-$round-c.json"
        census "$id" >"$out/amp-$v-$round-after.json"
        fio_result=$("$py" "$helper" fio "$out/amp-$v-$round.json")
        record item=amp setup="$v" round="$round" \
          ops="$(echo "$fio_result" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["ops"])')" \
          iops="$(echo "$fio_result" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["iops"])')" \
          write="$("$py" "$helper" io-diff "$out/amp-$v-$round-a.json" "$out/amp-$v-$round-b.json")" \
          fold="$("$py" "$helper" io-diff "$out/amp-$v-$round-b.json" "$out/amp-$v-$round-c.json")" \
          folded="$("$py" "$helper" folded "$out/amp-$v-$round-before.json" "$out/amp-$v-$round-after.json")"
      done
    done
  fi

  # ... and sequential writes of the whole VDI, in 1 MiB requests (an
  # EC object's first three go to its overlay, the fourth completes it
  # and folds it) and in 4 MiB ones (a whole object each: folded as it
  # comes), counting the close's fold.
  if has amp; then
    for v in c3 ec; do
      for bs in 1M 4M; do
        id=${ids[$v]}
        settle "$id"
        log "amp: $v written whole in $bs writes"
        sync
        "$py" "$helper" evict "$work/cluster" >/dev/null
        io_snap >"$out/seq-$v-$bs-a.json"
        start=$(date +%s.%N)
        fio --name=seq --ioengine=nbd --uri="$(nbd_uri "$v")" --rw=write --bs="$bs" --iodepth=$((16 / ${bs%M})) \
          --size=100% --output-format=json >"$out/seq-$v-$bs.json"
        settle "$id"
        io_snap >"$out/seq-$v-$bs-b.json"
        record item=seq setup="$v" bs="$bs" logical="$logical" \
          fio="$("$py" "$helper" fio "$out/seq-$v-$bs.json")" \
          io="$("$py" "$helper" io-diff "$out/seq-$v-$bs-a.json" "$out/seq-$v-$bs-b.json")"
      done
    done
  fi

  # 4. Degraded reads.
  if has degraded; then
    # Victims: never node 1 (it serves NBD and formed the cluster), the
    # nodes that are not raft voters first (2 of 5 voters lost keeps a
    # quorum either way).
    victims=($("$bin" --json cluster info | "$py" -c '
import json, sys
info = json.load(sys.stdin)
voters = set(info["voters"])
nodes = sorted((int(e["address"].rsplit(".", 1)[1]), e["node"]) for e in info["recovery"])
order = [i for i, n in nodes if n not in voters and i != 1] + [i for i, n in nodes if n in voters and i != 1 and n != info["leader"]]
print(" ".join(map(str, order[:2])))'))
    census "${ids[ec]}" >"$out/degraded-before.json"
    log "degraded: victims nodes ${victims[*]}; chunk files held per node: $("$py" -c '
import json, sys
c = json.load(open(sys.argv[1]))
held = {}
for o in c["objects"].values():
    for nodes in o["chunks"].values():
        for n in nodes:
            held[n] = held.get(n, 0) + 1
print(" ".join("%s:%d" % kv for kv in sorted(held.items())))' "$out/degraded-before.json")"
    for killed in 0 1 2; do
      if [ "$killed" -gt 0 ]; then
        before=$(epoch)
        kill_node "${victims[$((killed - 1))]}"
        wait_alive $((6 - killed))
        wait_recovered "$before"
      fi
      for v in $(setups $((killed + 1))); do
        settle "${ids[$v]}"
        log "degraded: $v with $killed nodes killed"
        t0=$(cpu_ticks)
        fio --name=deg --ioengine=nbd --uri="$(nbd_uri "$v")" --rw=randread --bs=4k --iodepth=1 \
          --time_based --ramp_time=2 --runtime="$deg_seconds" --norandommap --randrepeat=0 \
          --percentile_list=50:99 --output-format=json >"$out/degraded-$v-$killed.json"
        t1=$(cpu_ticks)
        # CPU per read: the nodes' CPU time over the whole job, its 2 s
        # ramp included, over the reads counted scaled up to the ramp.
        "$py" -c 'import json, sys
ticks, hz, seconds = map(float, sys.argv[1:4])
ops = json.load(sys.stdin)["ops"] * (seconds + 2) / seconds
print("cpu %s randread %.1f %.2f" % (sys.argv[4], 1e6 * ticks / hz / ops, ticks / hz / (seconds + 2)))' \
          $((t1 - t0)) "$hz" "$deg_seconds" "degraded-$v-$killed" \
          < <("$py" "$helper" fio "$out/degraded-$v-$killed.json") >"$out/degraded-$v-$killed.cpu"
        "$py" "$helper" perf "$out" "$out/degraded-$v-$killed.json" "$out/degraded-$v-$killed.cpu" \
          item=degraded setup="$v" killed="$killed"
      done
    done
  fi
  stop_all
fi

# 5. Rebuild: a cluster per set-up, so that one's recovery does not run
# beside the other's.
if has rebuild; then
  for round in $(seq 1 "$rebuild_rounds"); do
    for v in $(setups "$round"); do
      args=""
      [ "$v" = ec ] && args="--ec 4+2"
      log "rebuild round $round: 7 nodes, a $rsize VDI ($v)"
      VDI_ARGS=$args cluster 7 r "$rsize"
      id=$(vdi_id r)
      JOBS=precondition run_jobs "rebuild-$v-$round" "$out" --ioengine=nbd --uri="$(nbd_uri r)" >/dev/null
      settle "$id"
      census "$id" >"$out/rebuild-$v-$round-before.json"
      k=0 m=0
      [ "$v" = ec ] && k=4 m=2
      # The node holding most of the VDI, node 1 aside.
      read -r victim lost < <("$py" -c '
import json, sys
held = json.load(open(sys.argv[1]))["held"]
n = max((b, int(i)) for i, b in held.items() if i != "1")
print(n[1], n[0])' "$out/rebuild-$v-$round-before.json")
      since=$(epoch)
      sync
      "$py" "$helper" evict "$work/cluster" >/dev/null
      io_snap >"$out/rebuild-$v-$round-a.json"
      kill_node "$victim"
      killed=$(date +%s.%N)
      detected="" deadline=$((SECONDS + 300))
      while :; do
        if [ -z "$detected" ] && [ "$("$bin" --json cluster info 2>/dev/null | "$py" -c 'import json,sys; print(json.load(sys.stdin)["nodes_alive"])' 2>/dev/null)" = $((nodes - 1)) ]; then
          detected=$(date +%s.%N)
        fi
        if [ -n "$detected" ] && [ "$(recovered "$since")" = yes ]; then
          census "$id" >"$out/rebuild-$v-$round-now.json"
          [ "$("$py" "$helper" placed "$out/rebuild-$v-$round-now.json" 3 $k $m)" = yes ] && break
        fi
        if [ $SECONDS -ge $deadline ]; then
          echo "ec.sh: the $v VDI is not whole on the survivors 5 minutes after the kill: $("$py" "$helper" placed "$out/rebuild-$v-$round-now.json" 3 $k $m)" >&2
          break
        fi
        sleep 0.5
      done
      done_at=$(date +%s.%N)
      io_snap >"$out/rebuild-$v-$round-b.json"
      "$bin" --json node recovery >"$out/rebuild-$v-$round-recovery.json"
      read -r lost_copies lost_chunks < <("$py" "$helper" on "$out/rebuild-$v-$round-before.json" "$victim")
      record item=rebuild setup="$v" round="$round" victim="$victim" lost="$lost" \
        lost_copies="$lost_copies" lost_chunks="$lost_chunks" objects="$("$py" -c 'import json,sys; print(sum(1 for i in json.load(open(sys.argv[1]))["objects"] if not i.startswith("map")))' "$out/rebuild-$v-$round-before.json")" \
        copied="$("$py" -c 'import json,sys; e=json.load(open(sys.argv[1])); print(sum(x["status"]["copied"] for x in e))' "$out/rebuild-$v-$round-recovery.json")" \
        refolded="$("$py" "$helper" folded "$out/rebuild-$v-$round-before.json" "$out/rebuild-$v-$round-now.json")" \
        detect_s="$("$py" -c "print(${detected:-$done_at} - $killed)")" total_s="$("$py" -c "print($done_at - $killed)")" \
        io="$("$py" "$helper" io-diff "$out/rebuild-$v-$round-a.json" "$out/rebuild-$v-$round-b.json")"
      stop_all
    done
  done
fi

echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"
"$py" "$helper" report "$out"
echo "results in $out"
