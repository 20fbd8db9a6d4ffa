#!/usr/bin/env bash
# What TLS costs, in one run: the shared fio job set (../shared/bench, all
# 7 measured jobs, fio's nbd engine, 3 nodes on $prefix.1-3, copies 3)
# against three set-ups, alternated round by round so the machine's drift
# hits all alike:
#   plain  REV_PLAIN (a herd before TLS): plaintext NBD, HMAC peer links
#   mtls   HEAD --insecure-nbd: plaintext NBD, mutual TLS 1.3 peer links
#   tls    HEAD as README starts it: NBD over TLS (nbds://, client
#          certificate), mutual TLS 1.3 peer links
# fio's nbd engine cannot load client certificates (libnbd refuses
# tls-certificates in a URI), so fio reaches every set-up through the same
# local nbdkit nbd-plugin proxy, which is the TLS client for "tls".
# Prints each job's mean per set-up and the ratios to plain.
#
#   bench/tls-cost.sh REV_PLAIN [SIZE] [ROUNDS]   e.g. bench/tls-cost.sh 8678a59 1G 2
set -euo pipefail
source "$(dirname "$0")/lib.sh"
rev_plain=${1:?usage: bench/tls-cost.sh REV_PLAIN [SIZE] [ROUNDS]}
size=${2:-1G}
rounds=${3:-2}
shared=$(cd "$root/../shared/bench" && pwd)
out=$work/tls-$(date +%Y%m%d-%H%M%S)
mkdir -p "$out/src"
git -C "$root" archive "$(git -C "$root" rev-parse "$rev_plain")" | tar -x -C "$out/src"
(cd "$out/src" && go build -ldflags "$(ldflags "$out/src" "$rev_plain")" -o "$out/herd-plain" ./cmd/herd)
(cd "$root" && go build -ldflags "$(ldflags "$root")" -o "$out/herd-head" ./cmd/herd)
echo "plain = $rev_plain ($(git -C "$root" rev-parse --short "$rev_plain")), head = $(git -C "$root" rev-parse --short HEAD)" | tee "$out/revisions.txt"
for round in $(seq 1 "$rounds"); do
  for setup in plain mtls tls; do
    case $setup in
    plain) bin=$out/herd-plain; mode=legacy ;;
    mtls) bin=$out/herd-head; mode=plain ;;
    tls) bin=$out/herd-head; mode=tls ;;
    esac
    echo "== round $round: $setup"
    HERD_BENCH_PROXY=1 HERD_BENCH_NBD=$mode start_cluster 3 3 bench "$size"
    "$shared/run-fio.sh" "$setup-$round" "$out" --ioengine=nbd --uri="$uri" | tee "$out/$setup-$round.txt"
    stop_all
  done
done
python3 - "$out" "$rounds" <<'PY'
import sys, os, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    rows = {}
    for line in open(os.path.join(out, name + ".txt")):
        f = line.split()
        if len(f) >= 6 and f[1] != "precondition":
            rows[f[1]] = float(f[2]) if f[1].startswith("seq") else float(f[3])
    return rows
runs = {s: [load(f"{s}-{r}") for r in range(1, rounds + 1)] for s in ("plain", "mtls", "tls")}
print("%-15s %10s %10s %10s %9s %9s" % ("job", "plain", "mtls", "tls", "mtls/pl", "tls/pl"))
for job in runs["plain"][0]:
    m = {s: statistics.mean(r[job] for r in runs[s]) for s in runs}
    print("%-15s %10.1f %10.1f %10.1f %9.2f %9.2f" % (job, m["plain"], m["mtls"], m["tls"], m["mtls"] / m["plain"], m["tls"] / m["plain"]))
print("(MB/s for seq jobs, IOPS otherwise; means of %d rounds)" % rounds)
PY
echo "results in $out"
