// Package version says which herd this is: `herd version`, `herd
// --version`, and the start line of every node's log.
package version

import (
	"fmt"
	"runtime/debug"
)

// Version is the release, set at link time for release builds:
//
//	go build -ldflags "-X github.com/herd-storage/herd/internal/version.Version=1.2.0" ./cmd/herd
//
// Empty: the module version from the build information, or "devel".
var Version string

// Info is what the binary knows about its build (runtime/debug's build
// information: go build records the commit of a checkout it builds).
type Info struct {
	Version    string `json:"version"`
	Commit     string `json:"commit,omitempty"`      // vcs.revision
	CommitTime string `json:"commit_time,omitempty"` // vcs.time (the build's own time is not recorded: builds are reproducible)
	Modified   bool   `json:"modified,omitempty"`    // built from a checkout with uncommitted changes
	GoVersion  string `json:"go_version"`
}

// Get reads the build information.
func Get() Info {
	info := Info{Version: Version}
	build, ok := debug.ReadBuildInfo()
	if !ok {
		if info.Version == "" {
			info.Version = "devel"
		}
		return info
	}
	info.GoVersion = build.GoVersion
	if info.Version == "" && build.Main.Version != "" && build.Main.Version != "(devel)" {
		info.Version = build.Main.Version
	}
	if info.Version == "" {
		info.Version = "devel"
	}
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
