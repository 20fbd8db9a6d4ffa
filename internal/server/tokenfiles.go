package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/herd-storage/herd/internal/pki"
)

// readTokenFile reads DATA/name, a token file the first node wrote (nil,
// nil if there is none). One the group or others may read is refused,
// naming the file and its mode, not skipped: a node that went on without
// it would hide that the token may have leaked.
func readTokenFile(dir, name string) ([]byte, error) {
	data, err := pki.ReadSecretFile(filepath.Join(dir, name))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case errors.As(err, new(*pki.ModeError)):
		return nil, fmt.Errorf("%w; whoever could read it may hold the token: once the node runs, %s", err, tokenLeakAdvice[name])
	case err != nil:
		return nil, err
	}
	return data, nil
}

// tokenLeakAdvice says how to retire a token file's token.
var tokenLeakAdvice = map[string]string{
	JoinTokenFile:  "rotate it (herd cluster rotate-join-token)",
	AdminTokenFile: "create another admin token and revoke this one (herd token create, herd token revoke admin)",
}
