#!/usr/bin/env bash
# Print the -ldflags value that stamps herd with its version and commit, for
# the checkout this script is in:
#
#   go build -ldflags "$(scripts/ldflags.sh)" -o bin/herd ./cmd/herd
#
# The version is the VERSION file at the repository root. The commit (git
# rev-parse HEAD), its time (git log -1 --format=%cI) and whether the work
# tree has uncommitted changes come from git, when git is installed and the
# root is a checkout's top level; otherwise only the version is stamped. Every
# build path uses this (scripts/dev-cluster.sh, scripts/test.sh,
# deploy/build-image.sh, internal/testcluster, bench/lib.sh; version_test.go
# checks the scripts and the README), so a binary says what it is
# even where the build records no VCS information (-buildvcs=false).
#
# Only bash builtins are needed besides git, so it runs anywhere bash does.
set -euo pipefail
here=${BASH_SOURCE[0]%/*}
[ "$here" != "${BASH_SOURCE[0]}" ] || here=.
root=$(cd "$here/.." && pwd -P)
package=github.com/herd-storage/herd/internal/version

if [ ! -r "$root/VERSION" ]; then
  echo "ldflags.sh: no version: cannot read $root/VERSION" >&2
  exit 1
fi
version=
read -r version < "$root/VERSION" || true # the first line; no newline at its end is fine
case $version in
'' | *[!A-Za-z0-9.+_-]*)
  echo "ldflags.sh: $root/VERSION: version '$version': want letters, digits and . + _ -" >&2
  exit 1
  ;;
esac
flags="-X $package.Version=$version"

# A root that is not a checkout's top level (a copy of the sources inside some
# other repository, say) has no commit of its own.
if command -v git >/dev/null 2>&1 &&
  top=$(git -C "$root" rev-parse --show-toplevel 2>/dev/null) &&
  [ "$(cd "$top" && pwd -P)" = "$root" ] &&
  commit=$(git -C "$root" rev-parse --verify --quiet HEAD 2>/dev/null); then
  time=$(git -C "$root" log -1 --format=%cI HEAD)
  flags+=" -X $package.Commit=$commit -X $package.CommitTime=$time"
  # As go build's vcs.modified: tracked changes or untracked (not ignored)
  # files. --no-optional-locks: never take the index lock from someone
  # working in this checkout.
  if [ -n "$(git --no-optional-locks -C "$root" status --porcelain 2>/dev/null)" ]; then
    flags+=" -X $package.Modified=true"
  fi
fi
printf '%s\n' "$flags"
