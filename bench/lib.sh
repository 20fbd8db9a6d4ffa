# Shared by the benchmark scripts: start and stop herd clusters and a
# qemu-nbd baseline, killing only the processes recorded here (by pid,
# after checking /proc/PID/cmdline).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${HERD_BENCH_DIR:-/var/tmp/herd-bench}
bin=$work/herd
prefix=${HERD_BENCH_PREFIX:-127.0.9}
mkdir -p "$work"
pids=()

# ldflags prints the -ldflags value that stamps a herd built from the
# tree $1 with its version and commit, as every build path does. With a
# git revision $2 the tree is that revision's git archive, no checkout:
# its scripts/ldflags.sh stamps the version alone, and the revision's
# commit is added here. A tree from before scripts/ldflags.sh is stamped
# with the version "rev-COMMIT" (12 digits) and the commit.
ldflags() {
  local src=$1 rev=${2:-} flags commit
  local package=github.com/herd-storage/herd/internal/version
  if [ -r "$src/scripts/ldflags.sh" ]; then
    flags=$(bash "$src/scripts/ldflags.sh")
  else
    flags="-X $package.Version=rev-$(git -C "$root" rev-parse --short=12 "${rev:-HEAD}")"
  fi
  if [ -n "$rev" ]; then
    commit=$(git -C "$root" rev-parse "$rev")
    flags+=" -X $package.Commit=$commit -X $package.CommitTime=$(git -C "$root" log -1 --format=%cI "$commit")"
  fi
  printf '%s\n' "$flags"
}

# build builds herd from the work tree, or from git revision $HERD_REV
# (for a same-run comparison of two revisions).
build() {
  if [ -n "${HERD_REV:-}" ]; then
    local src=$work/src-rev
    rm -rf "$src" && mkdir -p "$src"
    git -C "$root" archive "$(git -C "$root" rev-parse "$HERD_REV")" | tar -x -C "$src"
    (cd "$src" && go build -tags testknobs -ldflags "$(ldflags "$src" "$HERD_REV")" -o "$bin" ./cmd/herd)
  else
    (cd "$root" && go build -tags testknobs -ldflags "$(ldflags "$root")" -o "$bin" ./cmd/herd)
  fi
}

# (Quietly: a process may end between the test and the read.)
ours() { [ -r "/proc/$1/cmdline" ] && { tr '\0' ' ' < "/proc/$1/cmdline"; } 2>/dev/null | grep -q -- "$2"; }

stop_all() {
  for pid in "${pids[@]:-}"; do
    [ -n "$pid" ] || continue
    if ours "$pid" "$work"; then kill "$pid" 2>/dev/null || true; fi
  done
  for pid in "${pids[@]:-}"; do
    [ -n "$pid" ] || continue
    for _ in $(seq 50); do ours "$pid" "$work" || break; sleep 0.1; done
    if ours "$pid" "$work"; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  pids=()
}
trap stop_all EXIT

# start_cluster NODES COPIES VDI SIZE: a fresh cluster on $prefix.1..NODES,
# and $uri: the VDI's NBD URI for fio's nbd engine. HERD_BENCH_NBD picks
# how clients reach it: tls (default: nbds:// with a client certificate
# from herd client add), socket (node 1's local plaintext socket) or
# plain (--insecure-nbd: plaintext TCP). A binary from before TLS (it
# writes cluster.token) is always reached in plaintext over TCP.
# HERD_BENCH_ARGS adds server flags, VDI_ARGS flags of the VDI's create
# (e.g. "--ec 4+2"). More VDIs: "$bin" vdi create, and nbd_uri.
start_cluster() {
  local nodes=$1 copies=$2 vdi=$3 size=$4 i mode=${HERD_BENCH_NBD:-tls} extra=()
  rm -rf "$work/cluster"
  mkdir -p -m 0700 "$work/cluster"
  case $("$bin" server --help 2>&1) in *--join-token-file*) ;; *) mode=legacy ;; esac
  [ "$mode" = plain ] && extra+=(--insecure-nbd)
  for i in $(seq 1 "$nodes"); do
    local args=(server --data "$work/cluster/node$i" --bind "$prefix.$i" --log-level warn ${HERD_BENCH_ARGS:-} "${extra[@]}")
    if [ "$i" -gt 1 ] && [ "$mode" = legacy ]; then
      args+=(--join "$prefix.1" --token "$(cat "$work/cluster/node1/cluster.token")")
    elif [ "$i" -gt 1 ]; then
      args+=(--join "$prefix.1" --join-token-file "$work/cluster/node1/join.token")
    fi
    # HERD_BENCH_ZONES="a b": node i in zone i mod 2; HERD_BENCH_ZONE_DELAY
    # (e.g. 25ms) delays every peer connection between zones by that much
    # each way (internal/peer/delay.go).
    local delay_env=()
    if [ -n "${HERD_BENCH_ZONES:-}" ]; then
      local zones=($HERD_BENCH_ZONES) j far=()
      local mine=${zones[$(( (i - 1) % ${#zones[@]} ))]}
      args+=(--zone "$mine")
      for j in $(seq 1 "$nodes"); do
        [ "${zones[$(( (j - 1) % ${#zones[@]} ))]}" = "$mine" ] || far+=("$prefix.$j")
      done
      if [ -n "${HERD_BENCH_ZONE_DELAY:-}" ] && [ ${#far[@]} -gt 0 ]; then
        delay_env=(env "HERD_TEST_PEER_DELAY=$(IFS=,; echo "${far[*]}")=$HERD_BENCH_ZONE_DELAY")
      fi
    fi
    setsid "${delay_env[@]}" "$bin" "${args[@]}" >>"$work/cluster/node$i.log" 2>&1 </dev/null &
    pids+=($!)
    for _ in $(seq 200); do
      curl -kfsS "https://$prefix.$i:7080/v1/health" >/dev/null 2>&1 && break
      curl -fsS "http://$prefix.$i:7080/v1/health" >/dev/null 2>&1 && break
      sleep 0.05
    done
    if [ "$i" -eq 1 ]; then
      for _ in $(seq 100); do { [ -s "$work/cluster/node1/join.token" ] || [ -s "$work/cluster/node1/cluster.token" ]; } && break; sleep 0.05; done
    fi
  done
  if [ "$mode" = legacy ]; then
    export HERD_TOKEN=$(cat "$work/cluster/node1/cluster.token")
  else
    export HERD_TOKEN=$(cat "$work/cluster/node1/admin.token")
  fi
  export HERD_ADDR=$prefix.1
  for _ in $(seq 200); do
    "$bin" cluster format --copies "$copies" ${FORMAT_ARGS:-} >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin" vdi create "$vdi" "$size" ${VDI_ARGS:-} >/dev/null
  [ "$mode" = tls ] && "$bin" client add bench --vdi '*' --out "$work/cluster/client" >/dev/null
  nbd_mode=$mode
  uri=$(nbd_uri "$vdi")
  echo "nbd: $mode ($uri)" >&2
  # fio's nbd engine (libnbd) refuses tls-certificates in a URI; with
  # HERD_BENCH_PROXY=1 every mode is reached through an nbdkit nbd-plugin
  # proxy on a local socket (the TLS client, for tls), so that set-ups
  # compare through the same path.
  if [ -n "${HERD_BENCH_PROXY:-}" ]; then
    local tls=(tls=off)
    [ "$mode" = tls ] && tls=(tls=require "tls-certificates=$work/cluster/client")
    rm -f "$work/cluster/proxy.sock"
    nbdkit -P "$work/cluster/proxy.pid" -U "$work/cluster/proxy.sock" nbd hostname="$prefix.1" port=10809 export="$vdi" "${tls[@]}"
    for _ in $(seq 100); do [ -s "$work/cluster/proxy.pid" ] && break; sleep 0.05; done
    pids+=($(cat "$work/cluster/proxy.pid"))
    uri="nbd+unix:///?socket=$work/cluster/proxy.sock"
    echo "through nbdkit: $uri" >&2
  fi
}

# nbd_uri VDI [NODE]: the NBD URI of VDI (an export name: NAME, ro/NAME,
# NAME@TAG) through node NODE (default 1) of the cluster start_cluster
# started, reached as HERD_BENCH_NBD says (not through a proxy; socket:
# the node's local socket).
nbd_uri() {
  local vdi=$1 node=${2:-1}
  case ${nbd_mode:-plain} in
  tls) echo "nbds://$prefix.$node:10809/$vdi?tls-certificates=$work/cluster/client" ;;
  socket) echo "nbd+unix:///$vdi?socket=$work/cluster/node$node/nbd.sock" ;;
  *) echo "nbd://$prefix.$node:10809/$vdi" ;;
  esac
}

# start_qemu_nbd FILE SIZE PORT: the baseline, a raw file on the same disk
start_qemu_nbd() {
  local file=$1 size=$2 port=$3
  rm -f "$file"
  truncate -s "$size" "$file"
  qemu-nbd --fork --pid-file="$work/qemu-nbd.pid" -f raw --cache=none --aio=native -t -e 8 \
    -x bench -b 127.0.0.1 -p "$port" "$file"
  pids+=($(cat "$work/qemu-nbd.pid"))
}

# cpu_ticks: the CPU time (utime + stime, in clock ticks) used so far by
# the processes this script started (the nodes, qemu-nbd, a proxy).
cpu_ticks() {
  local pid total=0 u s
  for pid in "${pids[@]:-}"; do
    [ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || continue
    # Fields 14 and 15 after the command name, which may hold spaces.
    read -r u s < <(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12, $13}') || continue
    total=$((total + u + s))
  done
  echo "$total"
}

# run_jobs LABEL OUT FIO_TARGET_OPTION...: the shared job set
# (../shared/bench/run-fio.sh) one job at a time, so that each job's CPU
# time can be told apart: while a job runs, the CPU time of the processes
# this script started is sampled twice a second, and the CPU time of the
# job's measured window (its last runtime seconds) over the operations
# fio counted in it is the CPU per operation. Prints run-fio.sh's line
# for each job (also appended to OUT/LABEL.txt) and "cpu LABEL JOB
# CPU_US_PER_OP CORES" (appended to OUT/LABEL.cpu). JOBS and SKIP_PRECOND
# as for run-fio.sh.
run_jobs() {
  local label=$1 out=$2 job sampler hz
  shift 2
  hz=$(getconf CLK_TCK)
  : >"$out/$label.txt"
  : >"$out/$label.cpu"
  for job in ${JOBS:-precondition seqwrite seqread randwrite-qd1 randwrite-qd32 randread-qd1 randread-qd32 syncwrite-qd1}; do
    [ "$job" = precondition ] && [ "${SKIP_PRECOND:-0}" = 1 ] && continue
    ( while :; do echo "$(date +%s.%N) $(cpu_ticks)"; sleep 0.5; done ) >"$out/$label-$job.samples" &
    sampler=$!
    JOBS=$job "$shared/run-fio.sh" "$label" "$out" "$@" | tee -a "$out/$label.txt"
    echo "$(date +%s.%N) $(cpu_ticks)" >>"$out/$label-$job.samples"
    kill "$sampler" 2>/dev/null || true
    wait "$sampler" 2>/dev/null || true
    cp "$out/$label.json" "$out/$label-$job.json"
    python3 - "$out/$label-$job.json" "$out/$label-$job.samples" "$hz" "$label" "$job" <<'PY' | tee -a "$out/$label.cpu"
import json, sys
path, samples, hz, label, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(path).read()
job = json.loads(text[text.index("{"):])["jobs"][0]  # after fio's "connected" lines
ops = sum(job[d]["total_ios"] for d in ("read", "write", "trim"))
window = job["job_runtime"] / 1000.0  # the measured part, after the ramp
points = []
for line in open(samples):
    f = line.split()
    if len(f) == 2:
        points.append((float(f[0]), float(f[1])))
end = points[-1][0]
start = end - window
def ticks_at(t):
    # Linear between the samples around t.
    for (t0, c0), (t1, c1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
    return points[0][1] if t < points[0][0] else points[-1][1]
used = (ticks_at(end) - ticks_at(start)) / hz
print("cpu %s %s %.1f %.2f" % (label, name, 1e6 * used / ops if ops else float("nan"), used / window))
PY
  done
}
