package version

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/herd-storage/herd/internal/testenv"
)

const packagePath = "github.com/herd-storage/herd/internal/version"

// setLinkTime sets the link-time variables for one test.
func setLinkTime(t *testing.T, version, commit, commitTime, modified string) {
	saved := [4]string{Version, Commit, CommitTime, Modified}
	t.Cleanup(func() { Version, Commit, CommitTime, Modified = saved[0], saved[1], saved[2], saved[3] })
	Version, Commit, CommitTime, Modified = version, commit, commitTime, modified
}

func TestGetPrefersLinkTimeVariables(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	setLinkTime(t, "1.2.3", commit, "2026-01-02T03:04:05+00:00", "true")
	info := Get()
	want := Info{Version: "1.2.3", Commit: commit, CommitTime: "2026-01-02T03:04:05+00:00", Modified: true, GoVersion: runtime.Version()}
	if info != want {
		t.Fatalf("Get() = %+v, want %+v", info, want)
	}
	if s, want := info.String(), "herd 1.2.3 (commit 0123456789ab of 2026-01-02T03:04:05+00:00, with uncommitted changes) "+runtime.Version(); s != want {
		t.Errorf("String() = %q, want %q", s, want)
	}
}

func TestGetFallsBack(t *testing.T) {
	setLinkTime(t, "", "", "", "")
	info := Get()
	// A test binary's build information has no module version: "devel".
	if info.Version != "devel" || info.GoVersion != runtime.Version() {
		t.Errorf("Get() without link-time variables = %+v, want version devel and Go %s", info, runtime.Version())
	}
}

// moduleRoot walks up from the package directory to go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	directory, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(directory, "go.mod")); err == nil {
			return directory
		}
		parent := filepath.Dir(directory)
		if parent == directory {
			t.Fatal("no go.mod above the package directory")
		}
		directory = parent
	}
}

// linkTimeValues parses "-X package.Name=value ..." into Name -> value.
func linkTimeValues(t *testing.T, ldflags string) map[string]string {
	t.Helper()
	fields := strings.Fields(ldflags)
	values := map[string]string{}
	for i := 0; i < len(fields); i += 2 {
		var name, value string
		ok := fields[i] == "-X" && i+1 < len(fields)
		if ok {
			name, ok = strings.CutPrefix(fields[i+1], packagePath+".")
		}
		if ok {
			name, value, ok = strings.Cut(name, "=")
		}
		if !ok {
			t.Fatalf("scripts/ldflags.sh printed %q: want -X %s.NAME=VALUE ...", ldflags, packagePath)
		}
		values[name] = value
	}
	return values
}

func bash(t *testing.T) string {
	t.Helper()
	return testenv.LookPath(t, "bash", "bash") // under CI=true a missing bash fails
}

// TestBinaryStamped builds herd as the build scripts do, with the flags
// scripts/ldflags.sh prints, and without VCS information in the build
// (-buildvcs=false): `herd version`, `herd version --json` and `herd
// --version` must still say the VERSION file's version and the commit.
func TestBinaryStamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds herd")
	}
	root := moduleRoot(t)
	output, err := exec.Command(bash(t), filepath.Join(root, "scripts", "ldflags.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/ldflags.sh: %v", errorOutput(err))
	}
	ldflags := strings.TrimSpace(string(output))
	values := linkTimeValues(t, ldflags)
	contents, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimSpace(string(contents)); values["Version"] != want {
		t.Errorf("scripts/ldflags.sh: version %q, want %q (the VERSION file)", values["Version"], want)
	}
	if head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		commitTime, _ := exec.Command("git", "-C", root, "log", "-1", "--format=%cI").Output()
		if values["Commit"] != strings.TrimSpace(string(head)) || values["CommitTime"] != strings.TrimSpace(string(commitTime)) {
			t.Errorf("scripts/ldflags.sh: commit %q of %q, want git's %q of %q", values["Commit"], values["CommitTime"], strings.TrimSpace(string(head)), strings.TrimSpace(string(commitTime)))
		}
	}
	if values["Commit"] == "" {
		// Not a git checkout: still check that a commit given at link time
		// is the one the binary prints.
		values["Commit"], values["CommitTime"] = "0123456789abcdef0123456789abcdef01234567", "2026-01-02T03:04:05+00:00"
		ldflags += " -X " + packagePath + ".Commit=" + values["Commit"] + " -X " + packagePath + ".CommitTime=" + values["CommitTime"]
	}

	herd := filepath.Join(t.TempDir(), "herd")
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", ldflags, "-o", herd, "./cmd/herd")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as testcluster builds it: one compile of herd for both
	if output, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags %q ./cmd/herd: %v\n%s", ldflags, err, output)
	}

	want := Info{Version: values["Version"], Commit: values["Commit"], CommitTime: values["CommitTime"], Modified: values["Modified"] == "true", GoVersion: runtime.Version()}
	output, err = exec.Command(herd, "version", "--json").Output()
	if err != nil {
		t.Fatalf("herd version --json: %v", errorOutput(err))
	}
	var got Info
	if err := json.Unmarshal(output, &got); err != nil || got != want {
		wantJSON, _ := json.Marshal(want)
		t.Errorf("herd version --json printed %s (%v), want %s", output, err, wantJSON)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		output, err := exec.Command(herd, args...).Output()
		if err != nil {
			t.Fatalf("herd %s: %v", strings.Join(args, " "), errorOutput(err))
		}
		if got := strings.TrimSpace(string(output)); got != want.String() || !strings.Contains(got, want.Commit[:12]) {
			t.Errorf("herd %s printed %q, want %q", strings.Join(args, " "), got, want.String())
		}
	}
}

// TestLdflagsWithoutGit runs scripts/ldflags.sh from a copy of the sources
// that is no git checkout, with and without git installed: only the version.
func TestLdflagsWithoutGit(t *testing.T) {
	shell := bash(t)
	root := moduleRoot(t)
	copy := t.TempDir()
	if err := os.Mkdir(filepath.Join(copy, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"VERSION", "scripts/ldflags.sh"} {
		contents, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(copy, name), contents, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	contents, _ := os.ReadFile(filepath.Join(root, "VERSION"))
	want := "-X " + packagePath + ".Version=" + strings.TrimSpace(string(contents))
	for _, path := range []string{os.Getenv("PATH"), t.TempDir()} { // the second has no git (nor anything else)
		command := exec.Command(shell, "scripts/ldflags.sh")
		command.Dir = copy
		command.Env = append(os.Environ(), "PATH="+path)
		output, err := command.Output()
		if err != nil || strings.TrimSpace(string(output)) != want {
			t.Errorf("scripts/ldflags.sh outside a checkout, PATH=%s: %q, %v; want %q", path, output, errorOutput(err), want)
		}
	}
}

// errorOutput adds a command's standard error to its error.
func errorOutput(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return errors.New(err.Error() + ": " + strings.TrimSpace(string(exit.Stderr)))
	}
	return err
}

// stampedLdflags: a -ldflags value that uses scripts/ldflags.sh's output,
// through a variable ($ldflags), the script itself or bench/lib.sh's
// ldflags function.
var stampedLdflags = regexp.MustCompile(`-ldflags "[^"]*\$(\{?ldflags\b|\((scripts/)?ldflags\b)`)

// TestEveryBuildOfHerdStamped reads every `go build` of ./cmd/herd in
// scripts/, deploy/, bench/ and the README: each must stamp the version
// and commit with the flags scripts/ldflags.sh prints, and the file (or
// bench/lib.sh, which the bench scripts source) must run that script.
func TestEveryBuildOfHerdStamped(t *testing.T) {
	root := moduleRoot(t)
	read := func(path string) string {
		contents, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(contents)
	}
	lib := read(filepath.Join(root, "bench", "lib.sh"))
	files := []string{filepath.Join(root, "README.md")}
	for _, dir := range []string{"scripts", "deploy", "bench"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && !strings.HasSuffix(path, ".go") {
				files = append(files, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	builds := 0
	for _, path := range files {
		text := read(path)
		name, _ := filepath.Rel(root, path)
		runsScript := strings.Contains(text, "ldflags.sh") ||
			strings.HasPrefix(name, "bench"+string(filepath.Separator)) && strings.Contains(text, "lib.sh") && strings.Contains(lib, "ldflags.sh")
		for i, line := range strings.Split(strings.ReplaceAll(text, "\\\n", " "), "\n") {
			if !strings.Contains(line, "go build") || !strings.Contains(line, "./cmd/herd") {
				continue
			}
			builds++
			if !stampedLdflags.MatchString(line) || !runsScript {
				t.Errorf("%s: line %d builds herd without the version flags of scripts/ldflags.sh (-ldflags \"$(scripts/ldflags.sh)\"): %s", name, i+1, strings.TrimSpace(line))
			}
		}
	}
	if builds < 5 {
		t.Errorf("found %d builds of ./cmd/herd in scripts/, deploy/, bench/ and README.md; want at least 5 (is the search still finding them?)", builds)
	}
}
