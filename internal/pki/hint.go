package pki

import "strings"

// CA hints. During a CA rotation a node holds a certificate from each of
// the two CAs it trusts, and a client that knows only one of them (a CLI
// whose admin token carries its fingerprint, a node that missed the
// rotation) must be shown the certificate from that one. The client says
// which in the TLS server name it sends (SNI): CAHint(fingerprint). A
// client that sends none (QEMU, libnbd, herds before rotations) gets the
// node's default, the certificate from the CA the cluster trusted before
// the rotation, until the rotation finishes.

const hintSuffix = ".herd"

// CAHint is the TLS server name that asks a node for its certificate
// from the CA of fingerprint: "ca-" and the fingerprint's first 32 hex
// digits, then its last 32, as two DNS labels ("" for a malformed
// fingerprint).
func CAHint(fingerprint string) string {
	fingerprint = strings.ToLower(fingerprint)
	if checkFingerprint(fingerprint) != nil {
		return ""
	}
	return "ca-" + fingerprint[:FingerprintLength/2] + "." + fingerprint[FingerprintLength/2:] + hintSuffix
}

// HintedCA returns the CA fingerprint a server name made by CAHint
// names.
func HintedCA(serverName string) (string, bool) {
	name, ok := strings.CutSuffix(strings.ToLower(serverName), hintSuffix)
	if !ok {
		return "", false
	}
	first, second, ok := strings.Cut(strings.TrimPrefix(name, "ca-"), ".")
	if !ok || !strings.HasPrefix(name, "ca-") {
		return "", false
	}
	fingerprint := first + second
	if checkFingerprint(fingerprint) != nil {
		return "", false
	}
	return fingerprint, true
}
