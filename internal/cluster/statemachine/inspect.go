package statemachine

import (
	"encoding/json"
)

// What the runtime must know of an entry before it proposes it, without
// the command types themselves.

// Known reports whether data is a command this binary can apply.
func Known(data []byte) bool {
	return len(data) > 0 && commands[commandType(data[0])] != nil
}

// Drop says which node an entry takes out of the cluster, if any: a
// leave (remove false) or a removal for good (remove true). The leader
// waits for the node's leases to run out before it commits one
// (internal/cluster, awaitDrop). A malformed entry takes no node out:
// the state machine refuses it with its own error.
func Drop(data []byte) (node string, remove bool, ok bool) {
	if len(data) == 0 {
		return "", false, false
	}
	switch commandType(data[0]) {
	case commandNodeLeave:
		var cmd nodeLeaveCommand
		if json.Unmarshal(data[1:], &cmd) != nil {
			return "", false, false
		}
		return cmd.ID, false, true
	case commandNodeRemove:
		var cmd nodeRemoveCommand
		if json.Unmarshal(data[1:], &cmd) != nil {
			return "", false, false
		}
		return cmd.ID, true, true
	}
	return "", false, false
}

// credentialCommands change who may do what: admin tokens, NBD clients,
// node admission and removal, join secrets and tokens, the gossip key,
// the CA and the feature level (which turns the peer allow-list on).
var credentialCommands = map[commandType]bool{
	commandSecurityInit:    true,
	commandTokenCreate:     true,
	commandTokenRevoke:     true,
	commandClientAdd:       true,
	commandClientRevoke:    true,
	commandNodeRemove:      true,
	commandJoinSecretSet:   true,
	commandFeatureLevel:    true,
	commandNodeAdmit:       true,
	commandJoinTokenCreate: true,
	commandJoinTokenRevoke: true,
	commandGossipKey:       true,
	commandCA:              true,
}

// ChangesCredentials reports whether data is a command that changes
// credentials (the leader proposes one forwarded only from a node that
// runs: internal/cluster, forwardRefusal).
func ChangesCredentials(data []byte) bool {
	return len(data) > 0 && credentialCommands[commandType(data[0])]
}
