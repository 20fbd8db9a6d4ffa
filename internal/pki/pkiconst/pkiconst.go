// Package pkiconst holds the constants of package pki that code which
// must not import crypto/x509 needs: the cluster's state machine
// (internal/cluster/statemachine) checks fingerprints' lengths and
// computes client certificates' ends with them, and crypto/x509 brings
// in the network packages it keeps out.
package pkiconst

import (
	"crypto/sha256"
	"time"
)

// ClientValidity is how long a client certificate is valid (at most
// until its CA's end).
const ClientValidity = 5 * 365 * 24 * time.Hour

// FingerprintLength is the length of a certificate's fingerprint: the
// hex of its SHA-256.
const FingerprintLength = 2 * sha256.Size
