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

build() { (cd "$root" && go build -o "$bin" ./cmd/herd); }

ours() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -q -- "$2"; }

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

# start_cluster NODES COPIES VDI SIZE: a fresh cluster on $prefix.1..NODES
start_cluster() {
  local nodes=$1 copies=$2 vdi=$3 size=$4 i token=""
  rm -rf "$work/cluster"
  mkdir -p "$work/cluster"
  for i in $(seq 1 "$nodes"); do
    local args=(server --data "$work/cluster/node$i" --bind "$prefix.$i" --log-level warn)
    [ "$i" -gt 1 ] && args+=(--join "$prefix.1" --token "$token")
    setsid "$bin" "${args[@]}" >>"$work/cluster/node$i.log" 2>&1 </dev/null &
    pids+=($!)
    for _ in $(seq 200); do curl -fsS "http://$prefix.$i:7080/v1/health" >/dev/null 2>&1 && break; sleep 0.05; done
    [ "$i" -eq 1 ] && { for _ in $(seq 100); do [ -s "$work/cluster/node1/cluster.token" ] && break; sleep 0.05; done; token=$(cat "$work/cluster/node1/cluster.token"); }
  done
  export HERD_TOKEN=$token HERD_ADDR=$prefix.1
  for _ in $(seq 200); do
    "$bin" cluster format --copies "$copies" ${FORMAT_ARGS:-} >/dev/null 2>&1 && break
    sleep 0.1
  done
  "$bin" vdi create "$vdi" "$size" >/dev/null
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
