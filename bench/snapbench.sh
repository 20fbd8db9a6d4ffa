#!/usr/bin/env bash
# Snapshot, clone, rollback and delete latency (bench/snapbench) on a fresh
# 3-node cluster on 127.0.9.1-3, copies 3, 64 KiB objects.
#   bench/snapbench.sh [OBJECTS] [CLONES]   (defaults 1,1000,100000 and 1000)
source "$(dirname "$0")/lib.sh"
build
(cd "$root" && go build -o "$work/snapbench" ./bench/snapbench)
FORMAT_ARGS="--object-size 64KiB" start_cluster 3 3 unused 1M
"$work/snapbench" --addr "$prefix.1" --nbd "$work/cluster/node1/nbd.sock" --objects "${1:-1,1000,100000}" --clones "${2:-1000}"
