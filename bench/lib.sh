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

# build builds herd from the work tree, or from git revision $HERD_REV
# (for a same-run comparison of two revisions).
build() {
  if [ -n "${HERD_REV:-}" ]; then
    local src=$work/src-rev
    rm -rf "$src" && mkdir -p "$src"
    git -C "$root" archive "$(git -C "$root" rev-parse "$HERD_REV")" | tar -x -C "$src"
    (cd "$src" && go build -o "$bin" ./cmd/herd)
  else
    (cd "$root" && go build -o "$bin" ./cmd/herd)
  fi
}

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

# start_cluster NODES COPIES VDI SIZE: a fresh cluster on $prefix.1..NODES,
# and $uri: the VDI's NBD URI for fio's nbd engine. HERD_BENCH_NBD picks
# how clients reach it: tls (default: nbds:// with a client certificate
# from herd client add), socket (node 1's local plaintext socket) or
# plain (--insecure-nbd: plaintext TCP). A binary from before TLS (it
# writes cluster.token) is always reached in plaintext over TCP.
# HERD_BENCH_ARGS adds server flags.
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
  "$bin" vdi create "$vdi" "$size" >/dev/null
  case $mode in
  tls)
    "$bin" client add bench --vdi '*' --out "$work/cluster/client" >/dev/null
    uri="nbds://$prefix.1:10809/$vdi?tls-certificates=$work/cluster/client" ;;
  socket) uri="nbd+unix:///$vdi?socket=$work/cluster/node1/nbd.sock" ;;
  *) uri="nbd://$prefix.1:10809/$vdi" ;;
  esac
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

# start_qemu_nbd FILE SIZE PORT: the baseline, a raw file on the same disk
start_qemu_nbd() {
  local file=$1 size=$2 port=$3
  rm -f "$file"
  truncate -s "$size" "$file"
  qemu-nbd --fork --pid-file="$work/qemu-nbd.pid" -f raw --cache=none --aio=native -t -e 8 \
    -x bench -b 127.0.0.1 -p "$port" "$file"
  pids+=($(cat "$work/qemu-nbd.pid"))
}
