#!/usr/bin/env bash
# Build the herd container image from this work tree: a static binary
# (CGO_ENABLED=0) in an image FROM scratch. No registry is needed.
#
#   deploy/build-image.sh [TAG]     (default herd:local)
#
# HERD_IMAGE_BINARY=PATH puts that static herd in the image instead of
# building one.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${1:-herd:local}
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -m 0700 "$context/data"
ldflags=$("$root/scripts/ldflags.sh") # version and commit, for herd version
if [ -n "${HERD_IMAGE_BINARY:-}" ]; then
  # A static herd built already (the e2e tests' own, internal/testcluster).
  cp "$HERD_IMAGE_BINARY" "$context/herd"
else
  (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$context/herd" ./cmd/herd)
fi
cp "$root/deploy/Dockerfile" "$context/"
docker build -q -t "$tag" "$context" >/dev/null
echo "built $tag ($(docker image inspect -f '{{.Size}}' "$tag") bytes)"
