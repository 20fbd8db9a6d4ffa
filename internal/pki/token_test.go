package pki

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var testFingerprint = strings.Repeat("ab", 32)

func TestJoinTokenRoundTrip(t *testing.T) {
	token := JoinToken{Fingerprint: testFingerprint, Secret: NewSecret()}
	s := token.String()
	if !strings.HasPrefix(s, "herd-join."+testFingerprint+".") {
		t.Fatalf("token %q", s)
	}
	for _, variant := range []string{s, "  " + s + "\n", strings.ToUpper(s)} {
		parsed, err := ParseJoinToken(variant)
		if err != nil || parsed != token {
			t.Fatalf("ParseJoinToken(%q) = %+v, %v; want %+v", variant, parsed, err, token)
		}
	}
}

func TestAdminTokenRoundTrip(t *testing.T) {
	token := AdminToken{Fingerprint: testFingerprint, ID: NewTokenID(), Secret: NewSecret()}
	s := token.String()
	if s != "herd-admin."+testFingerprint+"."+token.ID+"."+token.Secret {
		t.Fatalf("token %q", s)
	}
	parsed, err := ParseAdminToken(s + "\n")
	if err != nil || parsed != token {
		t.Fatalf("ParseAdminToken = %+v, %v; want %+v", parsed, err, token)
	}
}

// TestBadTokens: every mistake an operator can make while pasting gets an
// error that says what is wrong.
func TestBadTokens(t *testing.T) {
	secret := NewSecret()
	id := NewTokenID()
	join := "herd-join." + testFingerprint + "." + secret
	admin := "herd-admin." + testFingerprint + "." + id + "." + secret
	for _, test := range []struct {
		name, token, want string
		admin             bool
	}{
		{"empty", "", "not a herd join token (it starts with herd-join.)", false},
		{"old cluster token", "herd-0123456789abcdef0123456789abcdef", "not a herd join token (it starts with herd-join.)", false},
		{"admin for join", admin, "this is an admin token, not a join token", false},
		{"join for admin", join, "this is a join token, not an admin token", true},
		{"not admin", "hello", "not a herd admin token (it starts with herd-admin.)", true},
		{"cut secret", join[:len(join)-10], "the secret has 54 characters, not 64 (was it cut when copied?)", false},
		{"short fingerprint", "herd-join.abcd." + secret, "the CA fingerprint has 4 characters, not 64", false},
		{"fingerprint not hex", "herd-join." + strings.Repeat("zz", 32) + "." + secret, "the CA fingerprint is not hexadecimal", false},
		{"missing secret", "herd-join." + testFingerprint, "has 2 fields after herd-join., this one has 1", false},
		{"extra field", join + ".x", "has 2 fields after herd-join., this one has 3", false},
		{"secret not hex", "herd-join." + testFingerprint + "." + strings.Repeat("q", 64), "the secret is not hexadecimal", false},
		{"short id", "herd-admin." + testFingerprint + ".abc." + secret, "the token id has 3 characters, not 16", true},
	} {
		t.Run(test.name, func(t *testing.T) {
			var err error
			if test.admin {
				_, err = ParseAdminToken(test.token)
			} else {
				_, err = ParseJoinToken(test.token)
			}
			if !errors.Is(err, ErrBadToken) || !strings.Contains(err.Error(), test.want) {
				t.Fatalf("error %v; want ErrBadToken saying %q", err, test.want)
			}
			if strings.Contains(err.Error(), secret[:20]) {
				t.Fatalf("the error repeats the secret: %v", err)
			}
		})
	}
}

func TestSecrets(t *testing.T) {
	a, b := NewSecret(), NewSecret()
	if len(a) != 64 || a == b || strings.Trim(a, "0123456789abcdef") != "" {
		t.Fatalf("secrets %q, %q", a, b)
	}
	if id := NewTokenID(); len(id) != 16 || strings.Trim(id, "0123456789abcdef") != "" {
		t.Fatalf("token id %q", id)
	}
	hash := HashSecret(a)
	if len(hash) != 64 || hash == a {
		t.Fatalf("hash %q", hash)
	}
	if !SecretMatches(hash, a) || !SecretMatches(strings.ToUpper(hash), a) {
		t.Fatal("a secret does not match its hash")
	}
	if SecretMatches(hash, b) || SecretMatches(hash, "") || SecretMatches("", a) || SecretMatches(hash[:63], a) {
		t.Fatal("a wrong secret matched")
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ca.key")
	if err := WriteSecretFile(path, []byte("first")); err != nil {
		t.Fatal(err)
	}
	if err := WriteSecretFile(path, []byte("second")); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", info.Mode().Perm())
	}
	data, err := ReadSecretFile(path)
	if err != nil || string(data) != "second" {
		t.Fatalf("ReadSecretFile = %q, %v", data, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}

	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o601} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := ReadSecretFile(path)
		var modeError *ModeError
		if !errors.Is(err, ErrInsecureMode) || !errors.As(err, &modeError) || modeError.Mode != mode {
			t.Fatalf("mode %04o: %v; want a *ModeError", mode, err)
		}
		if mode == 0o644 {
			want := path + " has mode 0644: it holds a secret, make it 0600 (chmod 600 " + path + ")"
			if err.Error() != want {
				t.Fatalf("error %q, want %q", err, want)
			}
		}
	}
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadSecretFile(path); err != nil {
		t.Fatalf("mode 0400: %v", err)
	}
	if _, err := ReadSecretFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := ReadSecretFile(dir); err == nil {
		t.Fatal("ReadSecretFile read a directory")
	}
	if err := WriteSecretFile(filepath.Join(dir, "no", "such"), nil); err == nil {
		t.Fatal("WriteSecretFile into a missing directory succeeded")
	}
}

func TestCheckDirMode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := CheckDirMode(dir); err != nil {
		t.Fatalf("mode 0700: %v", err)
	}
	for _, mode := range []os.FileMode{0o755, 0o750, 0o701, 0o770} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		err := CheckDirMode(dir)
		if !errors.Is(err, ErrInsecureMode) || !strings.Contains(err.Error(), "chmod 700 "+dir) {
			t.Fatalf("mode %04o: %v", mode, err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CheckDirMode(file); err == nil {
		t.Fatal("CheckDirMode accepted a file")
	}
}
