package e2e

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/testcluster"
)

// TestClusterLifecycle walks one cluster through the membership scenarios in
// order: growth to 5 voters, concurrent creates, kill -9 of a non-voter, a
// voter and the leader, restarts, and a whole-cluster restart in another
// order.
func TestClusterLifecycle(t *testing.T) {
	c := testcluster.Start(t, testcluster.Options{Nodes: 3})
	all := []int{0, 1, 2}

	t.Run("three nodes, three voters", func(t *testing.T) {
		waitAgreement(t, c, all, 30*time.Second)
	})
	t.Run("five nodes joined through the first, five voters", func(t *testing.T) {
		c.AddNode()
		c.AddNode()
		all = []int{0, 1, 2, 3, 4}
		history := waitAgreement(t, c, all, 30*time.Second)
		if len(history) < 5 {
			t.Fatalf("epoch history %+v: want at least one epoch per join", history)
		}
		for i, e := range history {
			if e.Number != uint64(i+1) {
				t.Fatalf("epoch numbers are not consecutive: %+v", history)
			}
		}
		if _, stderr, err := c.Herd(ctx(t), 3, "cluster", "format", "--copies", "3"); err != nil {
			t.Fatalf("format: %v: %s", err, stderr)
		}
		nodes, err := client(c, 4).Nodes(ctx(t))
		if err != nil || len(nodes) != 5 {
			t.Fatalf("node list: %+v, %v", nodes, err)
		}
	})

	t.Run("200 concurrent creates, 50 duplicates, through every node", func(t *testing.T) {
		const total, duplicates = 200, 50
		names := make([]string, total)
		for i := range names {
			names[i] = fmt.Sprintf("vm-%03d", i)
			if i >= total-duplicates {
				names[i] = fmt.Sprintf("vm-%03d", i-(total-duplicates)) // a name already used
			}
		}
		var mu sync.Mutex
		created := map[string]int{}
		exists := 0
		var wg sync.WaitGroup
		for i, name := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := client(c, i%len(all)).CreateVDI(ctx(t), name, 1<<30)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					created[name]++
				case errors.Is(err, cluster.ErrAlreadyExists) && strings.Contains(err.Error(), "already exists"):
					exists++
				default:
					t.Errorf("create %s through node %d: %v", name, i%len(all), err)
				}
			}()
		}
		wg.Wait()
		if len(created) != total-duplicates || exists != duplicates {
			t.Fatalf("%d names created, %d 'already exists'; want %d and %d", len(created), exists, total-duplicates, duplicates)
		}
		for name, n := range created {
			if n != 1 {
				t.Fatalf("%s created %d times", name, n)
			}
		}
		var reference string
		for _, i := range all {
			testcluster.WaitFor(t, 10*time.Second, fmt.Sprintf("node %d to list every vdi", i), func() (bool, error) {
				vdis, err := client(c, i).VDIs(ctx(t))
				if err != nil {
					return false, err
				}
				if len(vdis) != total-duplicates {
					return false, fmt.Errorf("%d vdis", len(vdis))
				}
				ids := map[uint32]bool{}
				var b strings.Builder
				for _, v := range vdis {
					if ids[v.ID] {
						return false, fmt.Errorf("id %d used twice", v.ID)
					}
					ids[v.ID] = true
					fmt.Fprintf(&b, "%s=%d;", v.Name, v.ID)
				}
				if reference == "" {
					reference = b.String()
				} else if b.String() != reference {
					return false, fmt.Errorf("node %d lists other vdis than node %d", i, all[0])
				}
				return true, nil
			})
		}
	})

	t.Run("kill -9 a non-voter, a voter, the leader", func(t *testing.T) {
		// Two more nodes so that there are non-voters, and a dead voter
		// must be replaced to keep five.
		c.AddNode()
		c.AddNode()
		all = []int{0, 1, 2, 3, 4, 5, 6}
		waitAgreement(t, c, all, 30*time.Second)

		pick := func(role string) int {
			leader := leaderIndex(t, c, all)
			for _, i := range all {
				r := roleOf(t, c, leader, i)
				if r == role {
					return i
				}
			}
			t.Fatalf("no %s among %v", role, all)
			return -1
		}
		for _, role := range []string{"nonvoter", "voter", "leader"} {
			victim := pick(role)
			deadID := nodeID(t, c, victim)
			before, err := client(c, victim).Info(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			c.Node(victim).Kill()
			killed := time.Now()
			all = without(all, victim)
			for _, i := range all {
				testcluster.WaitFor(t, failoverDeadline-time.Since(killed), fmt.Sprintf("node %d to commit an epoch without the dead %s %d", i, role, victim), func() (bool, error) {
					_, epochs, err := epochsJSON(t, c, i)
					if err != nil {
						return false, err
					}
					last := epochs[len(epochs)-1]
					if last.Number <= before.Epoch || slices.Contains(last.Nodes, deadID) {
						return false, fmt.Errorf("latest epoch %d: %v", last.Number, last.Nodes)
					}
					return true, nil
				})
			}
			t.Logf("%s %d killed: every survivor committed a new epoch after %v", role, victim, time.Since(killed).Round(time.Millisecond))
			waitAgreement(t, c, all, 20*time.Second)
			if role != "nonvoter" {
				if n, _ := voterCount(t, c, all[0]); n != targetVoters(len(all)) {
					t.Fatalf("%d voters after a voter died, want %d", n, targetVoters(len(all)))
				}
			}
			if _, err := client(c, all[len(all)-1]).CreateVDI(ctx(t), "after-"+role, 1<<20); err != nil {
				t.Fatalf("create after %s died: %v", role, err)
			}
		}
	})

	t.Run("killed nodes restart with the same ids", func(t *testing.T) {
		// The ids every node had, as a survivor lists them.
		before := map[string]bool{}
		nodes, err := client(c, all[0]).Nodes(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			before[n.ID] = true
		}
		ids := map[int]string{}
		for _, n := range c.Nodes() {
			if !n.Running() {
				n.Restart()
				all = append(all, n.Index())
				ids[n.Index()] = ""
			}
		}
		slices.Sort(all)
		waitAgreement(t, c, all, 30*time.Second)
		nodes, err = client(c, 0).Nodes(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != len(all) {
			t.Fatalf("%d nodes listed after restarts, want %d (same ids, no new nodes)", len(nodes), len(all))
		}
		for i := range ids {
			if id := nodeID(t, c, i); !before[id] {
				t.Fatalf("node %d came back with a new id %s", i, id)
			}
		}
	})

	t.Run("every node stopped, started again in reverse order", func(t *testing.T) {
		history := waitAgreement(t, c, all, 30*time.Second)
		vdis, err := client(c, 0).VDIs(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, i := range all {
			wg.Add(1)
			go func() { defer wg.Done(); c.Node(i).Stop() }()
		}
		wg.Wait()
		for i := len(all) - 1; i >= 0; i-- {
			c.Node(all[i]).Restart()
		}
		after := waitAgreement(t, c, all, 60*time.Second)
		if len(after) < len(history) {
			t.Fatalf("epoch history shrank from %d to %d entries", len(history), len(after))
		}
		for i := range history {
			if history[i].Number != after[i].Number || !slices.Equal(history[i].Nodes, after[i].Nodes) || !history[i].Time.Equal(after[i].Time) {
				t.Fatalf("epoch %d changed across the restart: %+v -> %+v", history[i].Number, history[i], after[i])
			}
		}
		for _, i := range all {
			got, err := client(c, i).VDIs(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(vdis) {
				t.Fatalf("node %d lists %d vdis after restart, had %d", i, len(got), len(vdis))
			}
			for k := range got {
				if got[k] != vdis[k] {
					t.Fatalf("node %d: vdi %+v became %+v", i, vdis[k], got[k])
				}
			}
		}
		if _, err := client(c, all[0]).CreateVDI(ctx(t), "after-restart", 1<<20); err != nil {
			t.Fatalf("create after whole-cluster restart: %v", err)
		}
	})
}
