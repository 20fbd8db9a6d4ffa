package reach

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestDirectories(t *testing.T) {
	top := t.TempDir()
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is 0700 too: check only below it by starting
	// from a directory everyone may enter.
	parent := filepath.Dir(top)
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(top)
	if err != nil {
		t.Fatal(err)
	}
	stat := info.Sys().(*syscall.Stat_t)
	owner, ownerGroup := int(stat.Uid), int(stat.Gid)
	stranger := Who{Name: "user stranger", UID: owner + 12345, GIDs: []int{ownerGroup + 12345}}
	group := Who{Name: "group same", UID: -1, GIDs: []int{ownerGroup}}

	private := filepath.Join(top, "private")
	shared := filepath.Join(top, "shared")
	groupOnly := filepath.Join(top, "group")
	for dir, mode := range map[string]os.FileMode{private: 0o700, shared: 0o755, groupOnly: 0o710} {
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		dir     string
		who     Who
		blocked string
	}{
		{shared, stranger, ""},
		{filepath.Join(shared, "not-yet"), stranger, ""},
		{private, stranger, private},
		{filepath.Join(private, "below"), group, private},
		{groupOnly, group, ""},
		{groupOnly, stranger, groupOnly},
		{private, Who{Name: "user root", UID: 0}, ""},
		{private, Who{Name: "the owner", UID: owner}, ""},
	}
	for _, c := range cases {
		err := Directories(c.dir, c.who)
		switch {
		case c.blocked == "" && err != nil:
			t.Errorf("Directories(%s, %s) = %v, want nil", c.dir, c.who.Name, err)
		case c.blocked != "" && (err == nil || !strings.Contains(err.Error(), c.blocked+" (mode 0")):
			t.Errorf("Directories(%s, %s) = %v, want an error naming %s and its mode", c.dir, c.who.Name, err, c.blocked)
		}
	}
}

func TestParseOwner(t *testing.T) {
	root, err := ParseOwner("root")
	if err != nil || root.UID != 0 || root.GID != 0 {
		t.Fatalf("ParseOwner(root) = %+v, %v", root, err)
	}
	if o, err := ParseOwner("0:0"); err != nil || o.UID != 0 || o.GID != 0 {
		t.Fatalf("ParseOwner(0:0) = %+v, %v", o, err)
	}
	for _, bad := range []string{"", ":root", "root:", "no-such-user-herd", "root:no-such-group-herd"} {
		if _, err := ParseOwner(bad); err == nil {
			t.Errorf("ParseOwner(%q) succeeded", bad)
		}
	}
}
