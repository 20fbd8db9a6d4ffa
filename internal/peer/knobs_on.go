//go:build testknobs

package peer

import (
	"net"
	"os"
)

// TestKnobs is true in a herd built with -tags testknobs.
const TestKnobs = true

// Test-only latency between nodes (zones far apart; this machine's
// kernel has no netem), in a herd built with -tags testknobs only.
// HERD_TEST_PEER_DELAY lists remote addresses and the one-way delay to
// them:
//
//	HERD_TEST_PEER_DELAY="127.1.2.3,127.1.2.4=25ms"
//
// Every peer connection this node dials to one of them (object protocol,
// raft, forwarding) delays what it sends and what it receives by that
// much, so the round trip between the two nodes is twice it whichever
// side dialed. Gossip (UDP) is not delayed.
var testDelays = parseDelays(os.Getenv("HERD_TEST_PEER_DELAY"))

// withTestDelay wraps a dialed connection to address if the test asks
// for a delay to its host.
func withTestDelay(conn net.Conn, address string) net.Conn {
	if testDelays == nil {
		return conn
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	d, ok := testDelays[host]
	if !ok || d == 0 {
		return conn
	}
	return newDelayConn(conn, d)
}
