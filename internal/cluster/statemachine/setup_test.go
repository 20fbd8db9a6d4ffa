package statemachine

import "github.com/herd-storage/herd/internal/pki"

// The runtime (internal/cluster) gives the state machine its X.509
// parser; the tests do the same, from pki, which only they may import.
func init() {
	ParseCA = func(certPEM []byte) (string, bool, error) {
		cert, err := pki.ParseCertificate(certPEM)
		if err != nil {
			return "", false, err
		}
		return pki.Fingerprint(cert), cert.IsCA, nil
	}
}
