package testcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BinaryVariable names an environment variable holding the path of a
// prebuilt herd binary to use instead of building one, for example one built
// with -race.
const BinaryVariable = "HERD_TEST_BINARY"

// KnobsBinaryVariable names one for KnobsBinary: a herd built with -tags
// testknobs (scripts/test.sh builds its -race herd so, for both).
const KnobsBinaryVariable = "HERD_TEST_KNOBS_BINARY"

const (
	// modulePath is the module whose ./cmd/herd Binary builds.
	modulePath = "github.com/herd-storage/herd"
	// buildDirectoryPattern names the directories Binary builds into, under
	// os.TempDir().
	buildDirectoryPattern = "herd-testcluster-bin-*"
	// ownerFile, inside a build directory, holds the ownerRecord of the test
	// process that built it.
	ownerFile = "owner"
)

// build and knobsBuild hold the results of the one build of each kind
// per test process.
var build, knobsBuild struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of a herd binary built from this module's
// ./cmd/herd, or the path in $HERD_TEST_BINARY when that is set. The build
// runs once per test process, however many tests and clusters ask for it; a
// build failure fails every test that asks.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		if path := os.Getenv(BinaryVariable); path != "" {
			build.path, build.err = givenBinary(path)
			return
		}
		build.path, build.err = buildBinary("")
	})
	if build.err != nil {
		t.Fatalf("%v", build.err)
	}
	return build.path
}

// KnobsBinary returns the path of a herd built with -tags testknobs, whose
// nodes read the test knobs from their environment (HERD_TEST_PEER_DELAY:
// Options.ZoneDelay); a production build reads none. Built once per test
// process, or the one in $HERD_TEST_KNOBS_BINARY.
func KnobsBinary(t testing.TB) string {
	t.Helper()
	knobsBuild.once.Do(func() {
		if path := os.Getenv(KnobsBinaryVariable); path != "" {
			knobsBuild.path, knobsBuild.err = givenBinary(path)
			return
		}
		knobsBuild.path, knobsBuild.err = buildBinary("testknobs")
	})
	if knobsBuild.err != nil {
		t.Fatalf("%v", knobsBuild.err)
	}
	return knobsBuild.path
}

// givenBinary checks the path of a prebuilt herd.
func givenBinary(path string) (string, error) {
	absolute, err := filepath.Abs(path)
	if err == nil {
		_, err = os.Stat(absolute)
	}
	if err != nil {
		return "", fmt.Errorf("testcluster: a prebuilt herd ($%s or $%s): %w", BinaryVariable, KnobsBinaryVariable, err)
	}
	return absolute, nil
}

// buildBinary builds ./cmd/herd, static and with the build tags given,
// into a fresh directory under os.TempDir().
// The directory outlives the test process (a test package has no hook that
// runs after its last test), so each build first removes the directories of
// earlier test processes that have exited.
func buildBinary(tags string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	removeStaleBuilds()
	directory, err := os.MkdirTemp("", buildDirectoryPattern)
	if err != nil {
		return "", fmt.Errorf("testcluster: build directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(directory, ownerFile), []byte(ownerRecord()+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("testcluster: build directory: %w", err)
	}
	ldflags, err := linkFlags(root)
	if err != nil {
		return "", err
	}
	path := filepath.Join(directory, "herd")
	command := exec.Command("go", "build", "-tags", tags, "-ldflags", ldflags, "-o", path, "./cmd/herd")
	command.Dir = root
	// Static, as the container image ships it (deploy/build-image.sh):
	// the image of the compose test is this binary, not another build.
	command.Env = append(os.Environ(), "CGO_ENABLED=0")
	output, err := command.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("testcluster: go build -tags %q -ldflags %q -o %s ./cmd/herd in %s: %w\n%s", tags, ldflags, path, root, err, output)
	}
	return path, nil
}

// linkFlags is the -ldflags value of every build path, from
// scripts/ldflags.sh: the version (the VERSION file) and the commit (git, when
// root is a checkout), so that a test's nodes log what they are.
func linkFlags(root string) (string, error) {
	command := exec.Command("bash", filepath.Join(root, "scripts", "ldflags.sh"))
	command.Dir = root
	var stderr bytes.Buffer
	command.Stderr = &stderr
	output, err := command.Output()
	if err != nil {
		return "", fmt.Errorf("testcluster: scripts/ldflags.sh in %s: %w\n%s", root, err, stderr.Bytes())
	}
	return strings.TrimSpace(string(output)), nil
}

// removeStaleBuilds removes build directories whose owner process has exited.
// A directory without an owner file is being created right now by another
// test process, unless it is old.
func removeStaleBuilds() {
	directories, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirectoryPattern))
	for _, directory := range directories {
		record, err := os.ReadFile(filepath.Join(directory, ownerFile))
		if err != nil {
			info, statErr := os.Stat(directory)
			if statErr != nil || time.Since(info.ModTime()) < time.Hour {
				continue
			}
		} else if ownerAlive(string(record)) {
			continue
		}
		os.RemoveAll(directory)
	}
}

// moduleRoot walks up from the working directory (a test runs in its
// package's directory) to the go.mod of this module.
func moduleRoot() (string, error) {
	directory, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("testcluster: working directory: %w", err)
	}
	for {
		contents, err := os.ReadFile(filepath.Join(directory, "go.mod"))
		if err == nil {
			if declaresModule(contents, modulePath) {
				return directory, nil
			}
			return "", fmt.Errorf("testcluster: %s/go.mod is not module %s", directory, modulePath)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("testcluster: %w", err)
		}
		parent := filepath.Dir(directory)
		if parent == directory {
			return "", fmt.Errorf("testcluster: no go.mod above the working directory")
		}
		directory = parent
	}
}

// declaresModule reports whether a go.mod declares the module path.
func declaresModule(goMod []byte, path string) bool {
	scanner := bufio.NewScanner(bytes.NewReader(goMod))
	for scanner.Scan() {
		fields := strings.Fields(scanner.Text())
		if len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == path
		}
	}
	return false
}
