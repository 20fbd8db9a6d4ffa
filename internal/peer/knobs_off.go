//go:build !testknobs

package peer

import "net"

// TestKnobs is true in a herd built with -tags testknobs: a production
// build reads no test knob from its environment.
const TestKnobs = false

func withTestDelay(conn net.Conn, _ string) net.Conn { return conn }
