#!/usr/bin/env bash
# Start a local 3-node herd cluster on 127.0.0.1-3, format it (3 copies) and
# create a VDI; or stop it again.
#
#   scripts/dev-cluster.sh [start]   build, start, format, create VDI "vm1"
#   scripts/dev-cluster.sh stop      stop the nodes this script started
#
# Data and logs live in $HERD_DEV_DIR (default ./.herd-dev). Nodes are
# stopped by the pids this script recorded, after checking each pid is
# still our herd process.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${HERD_DEV_DIR:-$PWD/.herd-dev}
nodes=${HERD_DEV_NODES:-3}
bin=$PWD/bin/herd

ours() { # pid -> true if it is a herd server of this dev cluster
  [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -q -- "$bin server --data $dir/"
}

stop() {
  for pidfile in "$dir"/node*.pid; do
    [ -e "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if ours "$pid"; then
      kill "$pid"
      for _ in $(seq 50); do ours "$pid" || break; sleep 0.1; done
      ours "$pid" && kill -9 "$pid"
    fi
    rm -f "$pidfile"
  done
}

wait_healthy() { # ip
  for _ in $(seq 100); do
    # -k: health carries no secret; the CLI verifies nodes by the CA
    # fingerprint its token carries.
    curl -kfsS "https://$1:7080/v1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "node $1 did not come up; see $dir/node-$1.log" >&2
  tail -20 "$dir/node-$1.log" >&2
  return 1
}

case "${1:-start}" in
stop)
  stop
  echo "stopped; data is kept in $dir (remove it for a fresh cluster)"
  exit 0
  ;;
start) ;;
*)
  echo "usage: $0 [start|stop]" >&2
  exit 2
  ;;
esac

command -v go >/dev/null || { echo "needs Go (https://go.dev/dl/)" >&2; exit 1; }
command -v curl >/dev/null || { echo "needs curl" >&2; exit 1; }
mkdir -p bin "$dir"
if [ -z "${HERD_DEV_NO_BUILD:-}" ]; then
  ldflags=$(scripts/ldflags.sh) # version and commit: herd version says what runs
  go build -ldflags "$ldflags" -o "$bin" ./cmd/herd
fi
stop

for i in $(seq 1 "$nodes"); do
  ip=127.0.0.$i
  args=(server --data "$dir/node$i" --bind "$ip")
  if [ "$i" -gt 1 ]; then
    args+=(--join 127.0.0.1 --join-token-file "$dir/node1/join.token")
  fi
  setsid "$bin" "${args[@]}" >>"$dir/node-$ip.log" 2>&1 < /dev/null &
  echo $! > "$dir/node$i.pid"
  wait_healthy "$ip"
  if [ "$i" -eq 1 ]; then
    for _ in $(seq 100); do [ -s "$dir/node1/join.token" ] && break; sleep 0.1; done
  fi
done

export HERD_TOKEN=$(cat "$dir/node1/admin.token")
# Wait until every node is in the log and the voters are in place.
want_voters=$(( nodes >= 5 ? 5 : nodes >= 3 ? 3 : 1 ))
for _ in $(seq 150); do
  info=$("$bin" --json cluster info 2>/dev/null | tr -d ' \n')
  alive=$(sed -n 's/.*"nodes_alive":\([0-9]*\).*/\1/p' <<<"$info")
  voters=$(sed -n 's/.*"voters":\[\([^]]*\)\].*/\1/p' <<<"$info" | tr ',' '\n' | grep -c . || true)
  [ "${alive:-0}" -ge "$nodes" ] && [ "${voters:-0}" -ge "$want_voters" ] && break
  sleep 0.2
done
copies=$(( nodes < 3 ? nodes : 3 ))
"$bin" cluster format --copies "$copies" 2>&1 | grep -v "already formatted" || true
"$bin" vdi info vm1 >/dev/null 2>&1 || "$bin" vdi create vm1 10G >/dev/null
# An NBD client certificate for this host's QEMU: NBD over TCP is TLS with
# a certificate from the cluster CA.
certs=$dir/client
[ -s "$certs/client-cert.pem" ] || "$bin" client add dev --vdi '*' --out "$certs" >/dev/null

tls_drive() { # node-ip export -> qemu --image-opts string
  echo "driver=raw,file.driver=nbd,file.host=$1,file.port=10809,file.export=$2,file.tls-creds=tls0"
}
if command -v qemu-io >/dev/null; then
  echo "== checking vm1 with a real NBD client over TLS: write through node 1, read back through node $nodes"
  out=$(qemu-io --object "tls-creds-x509,id=tls0,endpoint=client,dir=$certs" --image-opts "$(tls_drive 127.0.0.1 vm1)" \
    -c 'write -P 0x5a 1M 8M' -c flush 2>&1) || true
  echo "$out" | grep -E "^wrote|failed|can't" || true
  case "$out" in *failed*|*"can't"*) echo "write through node 1 FAILED" >&2; exit 1 ;; esac
  out=$(qemu-io -r --object "tls-creds-x509,id=tls0,endpoint=client,dir=$certs" --image-opts "$(tls_drive "127.0.0.$nodes" ro/vm1)" \
    -c 'read -P 0x5a 1M 8M' 2>&1) || true
  echo "$out" | grep -E "^read|failed|can't" || true
  case "$out" in *failed*|*"can't"*) echo "read back through node $nodes FAILED" >&2; exit 1 ;; esac
  echo "ok: vm1 reads back what was written, through another node"
  echo
else
  echo "(install qemu-utils to have this script check vm1 with qemu-io)"
fi
"$bin" cluster info
echo
"$bin" node list
echo
"$bin" vdi list
cat <<TXT

herd is running: $nodes nodes on 127.0.0.1-$nodes, data and logs in $dir.
  export HERD_TOKEN=\$(cat $dir/node1/admin.token)
  $bin vdi list
  nbdinfo 'nbds://127.0.0.1/vm1?tls-certificates=$certs'     # NBD over TLS
  nbdinfo 'nbd+unix:///vm1?socket=$dir/node1/nbd.sock'        # this host's socket
  $0 stop
TXT
