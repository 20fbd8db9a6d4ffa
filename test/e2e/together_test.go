package e2e

import (
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/testcluster"
)

// TestNodesStartedTogetherFormCluster: three nodes started at the same
// moment, as deploy/docker-compose.yml starts them, form one cluster. The
// joiners reach node 0 before it has recorded its join secret in the log
// (it has just written its join token and is still electing itself), so
// they are told the cluster is starting: they must keep trying until
// --join-timeout instead of exiting (testcluster fails the start if a
// node exits).
func TestNodesStartedTogetherFormCluster(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3, Together: true})
	waitAgreement(t, c, []int{0, 1, 2}, 30*time.Second)
}
