package testcluster

import "errors"

// ErrNamespacesUnavailable reports that this machine cannot run nodes in
// network namespaces (not root, no ip or nft, or namespaces forbidden, as in
// an unprivileged container). Start skips the test on it, or fails it under
// CI=true.
var ErrNamespacesUnavailable = errors.New("testcluster: network namespaces unavailable")

// errProcessExited reports that a signal was not sent because the process had
// already exited.
var errProcessExited = errors.New("testcluster: process already exited")
