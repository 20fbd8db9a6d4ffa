// Package version says which herd this is: `herd version`, `herd
// --version`, and the start line of every node's log.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by every build path (scripts/ldflags.sh prints the flags:
// the VERSION file and git), so that a binary knows what it is even when the
// build records no VCS information (-buildvcs=false, a build outside a
// checkout):
//
//	go build -ldflags "$(scripts/ldflags.sh)" -o bin/herd ./cmd/herd
//
// which amounts to
//
//	go build -ldflags "-X github.com/herd-storage/herd/internal/version.Version=1.2.0 \
//	  -X github.com/herd-storage/herd/internal/version.Commit=$(git rev-parse HEAD) \
//	  -X github.com/herd-storage/herd/internal/version.CommitTime=$(git log -1 --format=%cI)" ./cmd/herd
//
// Get prefers them to the build information; empty ones are taken from it.
var (
	// Version is the release. Empty: the module version from the build
	// information, or "devel".
	Version string
	// Commit is the full hash of the commit built. Empty: vcs.revision from
	// the build information, if any (CommitTime and Modified then come from
	// there too).
	Commit string
	// CommitTime is the commit's time (RFC 3339, git's %cI).
	CommitTime string
	// Modified is "true" when the checkout built had uncommitted changes.
	Modified string
)

// Info is what the binary knows about its build: the link-time variables
// above, else runtime/debug's build information (go build records the commit
// of a checkout it builds unless -buildvcs=false).
type Info struct {
	Version    string `json:"version"`
	Commit     string `json:"commit,omitempty"`      // Commit, else vcs.revision
	CommitTime string `json:"commit_time,omitempty"` // CommitTime, else vcs.time (the build's own time is not recorded: builds are reproducible)
	Modified   bool   `json:"modified,omitempty"`    // built from a checkout with uncommitted changes
	GoVersion  string `json:"go_version"`
}

// Get reads the link-time variables and the build information.
func Get() Info {
	info := Info{Version: Version, GoVersion: runtime.Version()}
	if Commit != "" {
		info.Commit, info.CommitTime, info.Modified = Commit, CommitTime, Modified == "true"
	}
	if build, ok := debug.ReadBuildInfo(); ok {
		if build.GoVersion != "" {
			info.GoVersion = build.GoVersion
		}
		if info.Version == "" && build.Main.Version != "" && build.Main.Version != "(devel)" {
			info.Version = build.Main.Version
		}
		if Commit == "" {
			for _, s := range build.Settings {
				switch s.Key {
				case "vcs.revision":
					info.Commit = s.Value
				case "vcs.time":
					info.CommitTime = s.Value
				case "vcs.modified":
					info.Modified = s.Value == "true"
				}
			}
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	return info
}

// String is one line: "herd VERSION (commit C of TIME, modified) GOVERSION".
func (i Info) String() string {
	s := "herd " + i.Version
	if i.Commit != "" {
		commit := i.Commit
		if len(commit) > 12 {
			commit = commit[:12]
		}
		s += fmt.Sprintf(" (commit %s", commit)
		if i.CommitTime != "" {
			s += " of " + i.CommitTime
		}
		if i.Modified {
			s += ", with uncommitted changes"
		}
		s += ")"
	}
	if i.GoVersion != "" {
		s += " " + i.GoVersion
	}
	return s
}
