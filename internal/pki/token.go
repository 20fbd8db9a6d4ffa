package pki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"
)

// Tokens carry, in one string an operator can paste, what a newcomer needs
// to trust the cluster (the CA's fingerprint) and to be trusted by it (a
// secret whose hash the cluster stored). They are secrets: whoever holds a
// join token can add a node.
//
//	join:  herd-join.FINGERPRINT.SECRET
//	admin: herd-admin.FINGERPRINT.ID.SECRET
//
// FINGERPRINT is 64 hex digits (Fingerprint), SECRET 64 (NewSecret), ID 16
// (NewTokenID). Parsing accepts surrounding white space and upper case.
const (
	joinPrefix   = "herd-join."
	adminPrefix  = "herd-admin."
	secretLength = 64
	tokenIDBytes = 8
	secretBytes  = 32
)

// JoinToken lets a new node verify the cluster (Fingerprint) and prove it
// was invited (Secret).
type JoinToken struct {
	Fingerprint string
	Secret      string
}

func (t JoinToken) String() string { return joinPrefix + t.Fingerprint + "." + t.Secret }

// ParseJoinToken parses a join token; its errors wrap ErrBadToken and say
// what is wrong.
func ParseJoinToken(s string) (JoinToken, error) {
	parts, err := splitToken(s, joinPrefix, "join", 2)
	if err != nil {
		return JoinToken{}, err
	}
	return JoinToken{Fingerprint: parts[0], Secret: parts[1]}, nil
}

// AdminToken lets an operator's tool verify the cluster (Fingerprint) and
// authenticate with a secret the cluster knows by ID.
type AdminToken struct {
	Fingerprint string
	ID          string
	Secret      string
}

func (t AdminToken) String() string {
	return adminPrefix + t.Fingerprint + "." + t.ID + "." + t.Secret
}

// ParseAdminToken parses an admin token; its errors wrap ErrBadToken and
// say what is wrong.
func ParseAdminToken(s string) (AdminToken, error) {
	parts, err := splitToken(s, adminPrefix, "admin", 3)
	if err != nil {
		return AdminToken{}, err
	}
	return AdminToken{Fingerprint: parts[0], ID: parts[1], Secret: parts[2]}, nil
}

// splitToken checks s's prefix and splits the rest into its n fields:
// fingerprint, [id,] secret, each lowercased and checked.
func splitToken(s, prefix, kind string, n int) ([]string, error) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(strings.ToLower(s), prefix) {
		switch other := strings.ToLower(s); {
		case kind == "join" && strings.HasPrefix(other, adminPrefix):
			return nil, badToken("this is an admin token, not a join token (a join token starts with %s)", prefix)
		case kind == "admin" && strings.HasPrefix(other, joinPrefix):
			return nil, badToken("this is a join token, not an admin token (an admin token starts with %s)", prefix)
		}
		return nil, badToken("not a herd %s token (it starts with %s)", kind, prefix)
	}
	parts := strings.Split(strings.ToLower(s[len(prefix):]), ".")
	if len(parts) != n {
		return nil, badToken("a herd %s token has %d fields after %s, this one has %d (was it cut when copied?)", kind, n, prefix, len(parts))
	}
	if err := checkFingerprint(parts[0]); err != nil {
		return nil, badToken("%s token: %v", kind, err)
	}
	if n == 3 {
		if err := checkHex("token id", parts[1], 2*tokenIDBytes); err != nil {
			return nil, badToken("%s token: %v", kind, err)
		}
	}
	if err := checkHex("secret", parts[n-1], secretLength); err != nil {
		return nil, badToken("%s token: %v", kind, err)
	}
	return parts, nil
}

func checkFingerprint(fingerprint string) error {
	return checkHex("CA fingerprint", fingerprint, FingerprintLength)
}

func checkHex(what, s string, length int) error {
	if len(s) != length {
		return fmt.Errorf("the %s has %d characters, not %d (was it cut when copied?)", what, len(s), length)
	}
	if _, err := hex.DecodeString(s); err != nil {
		return fmt.Errorf("the %s is not hexadecimal", what)
	}
	return nil
}

// NewSecret returns 32 random bytes in hex (64 characters).
func NewSecret() string { return randomHex(secretBytes) }

// NewTokenID returns 8 random bytes in hex (16 characters): a name for a
// token that is not secret, to list and revoke it.
func NewTokenID() string { return randomHex(tokenIDBytes) }

func randomHex(n int) string {
	raw := make([]byte, n)
	rand.Read(raw) // never fails (crypto/rand documents it)
	return hex.EncodeToString(raw)
}

// HashSecret returns what the cluster stores to check a secret later: the
// hex SHA-256 of it. A secret has 256 random bits, so a fast hash is
// enough: nobody can search that space.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// SecretMatches reports whether secret hashes to hash, in time that does
// not depend on where they differ.
func SecretMatches(hash, secret string) bool {
	return subtle.ConstantTimeCompare([]byte(strings.ToLower(hash)), []byte(HashSecret(secret))) == 1
}
