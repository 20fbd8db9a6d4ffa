package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTokenFileModes: a token file others may read is refused with a
// message naming it and its mode; a missing one is no token; one of mode
// 0600 is read.
func TestTokenFileModes(t *testing.T) {
	dir := t.TempDir()
	if data, err := readTokenFile(dir, AdminTokenFile); data != nil || err != nil {
		t.Fatalf("no file: %q, %v", data, err)
	}
	for name, mode := range map[string]os.FileMode{AdminTokenFile: 0o644, JoinTokenFile: 0o640} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("token\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if data, err := readTokenFile(dir, name); err != nil || string(data) != "token\n" {
			t.Fatalf("%s at 0600: %q, %v", name, data, err)
		}
		os.Chmod(path, mode)
		_, err := readTokenFile(dir, name)
		if err == nil {
			t.Fatalf("%s at %04o: read", name, mode)
		}
		for _, want := range []string{path + " has mode " + fmt.Sprintf("%04o", mode), "chmod 600", "herd "} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s at %04o: %q does not say %q", name, mode, err, want)
			}
		}
	}
}
