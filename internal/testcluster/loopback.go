package testcluster

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// The herd binary's default ports, which every node uses on its own bind
// address: each node has an address of its own (loopback or namespace), so
// no node needs other ports.
const (
	// PeerPort carries the peer protocol (raft and data).
	PeerPort = 7000
	// GossipPort carries gossip, over TCP and UDP.
	GossipPort = 7001
	// AdminPort serves the admin HTTP API, /v1/health among it.
	AdminPort = 7080
	// NBDPort serves NBD clients.
	NBDPort = 10809
)

// prefixAttempts bounds the search for a free loopback prefix.
const prefixAttempts = 20

// pickLoopbackPrefix returns a random "127.A.B." (A in 10..250) whose
// addresses .1 to .count have all herd ports free. On Linux the whole of
// 127.0.0.0/8 is local, so these addresses need no configuration; a random
// prefix keeps concurrent test processes apart and away from a developer's
// cluster on 127.0.0.1-3.
func pickLoopbackPrefix(count int) (string, error) {
	if count > 254 {
		return "", fmt.Errorf("testcluster: %d nodes do not fit in a loopback /24", count)
	}
	var lastError error
	for range prefixAttempts {
		prefix := fmt.Sprintf("127.%d.%d.", 10+rand.IntN(241), rand.IntN(256))
		lastError = nil
		for host := 1; host <= count && lastError == nil; host++ {
			lastError = portsFree(prefix + strconv.Itoa(host))
		}
		if lastError == nil {
			return prefix, nil
		}
	}
	return "", fmt.Errorf("testcluster: no free loopback prefix after %d attempts: %w", prefixAttempts, lastError)
}

// portsFree checks that every herd port on address can be bound, by binding
// it and closing it again. Gossip is also checked over UDP, which memberlist
// uses next to TCP.
func portsFree(address string) error {
	var errs []error
	for _, port := range []int{PeerPort, GossipPort, AdminPort, NBDPort} {
		listener, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		listener.Close()
	}
	connection, err := net.ListenPacket("udp", net.JoinHostPort(address, strconv.Itoa(GossipPort)))
	if err != nil {
		errs = append(errs, err)
	} else {
		connection.Close()
	}
	return errors.Join(errs...)
}
