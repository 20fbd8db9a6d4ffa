package recovery

import (
	"fmt"
	"testing"

	"github.com/herd-storage/herd/internal/cluster"
)

// The holders of the newest stamp are ranked the same way on every node
// (the sources of a tie: recovery.go, "Copies with the same stamp"):
// those that stayed members of every epoch after the stamp first, then by
// id, whatever order a survey (a map) or a listing found them in.
func TestHoldersThatStayedRankFirst(t *testing.T) {
	log := newLog(4, 3)                                  // epoch 1: node00..node03
	log.setNodes("node00", "node01", "node02", "node03") // 2: the stamp
	log.setNodes("node00", "node01", "node03")           // 3: node02 dropped (killed)
	log.setNodes("node00", "node01", "node03")           // 4
	log.setNodes("node00", "node01", "node02", "node03") // 5: node02 back
	r := &Recovery{cluster: log}
	stayed := r.stayedSince(2, 5)
	for id, want := range map[string]bool{"node00": true, "node01": true, "node02": false, "node03": true, "node09": false} {
		if got := stayed(id); got != want {
			t.Errorf("%s stayed since epoch 2: %v, want %v", id, got, want)
		}
	}
	if !r.stayedSince(4, 5)("node02") || !r.stayedSince(1, 2)("node02") {
		t.Errorf("node02 was a member of epoch 2 (and 5): it stayed over ranges of those alone")
	}
	if r.stayedSince(2, 3)("node02") {
		t.Errorf("node02 left in epoch 3")
	}
	node := func(id string) cluster.Node { return cluster.Node{ID: id} }
	for _, order := range [][]string{
		{"node02", "node01", "node03"},
		{"node03", "node02", "node01"},
		{"node01", "node03", "node02"},
	} {
		var holders []cluster.Node
		for _, id := range order {
			holders = append(holders, node(id))
		}
		ranked := rankHolders(holders, stayed)
		if got := fmt.Sprintf("%s %s %s", ranked[0].ID, ranked[1].ID, ranked[2].ID); got != "node01 node03 node02" {
			t.Errorf("holders %v ranked %s, want node01 node03 node02", order, got)
		}
	}
}
