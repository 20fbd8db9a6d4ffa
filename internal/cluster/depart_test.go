package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// A leader stopped cleanly with a down-out interval commits its own
// window before its leave: the others hold its objects' recovery until
// the window's end, and the events say it stopped before they say it
// left. With no interval (0) it commits none: its objects are recovered
// at once, as before.
func TestCleanStopOpensADownOutWindow(t *testing.T) {
	for _, interval := range []time.Duration{time.Minute, 0} {
		t.Run(interval.String(), func(t *testing.T) {
			nodes, clusters := startGossipNodes(t, id0, id1, id2)
			waitUntil(t, 20*time.Second, "three voters", func() bool {
				l := leaderOf(nodes, []int{0, 1, 2})
				return l >= 0 && len(configVoters(t, nodes[l].raft)) == 3
			})
			stopped := leaderOf(nodes, []int{0, 1, 2})
			other := (stopped + 1) % 3
			clusters[stopped].cfg.DownOutInterval = interval
			before := time.Now()
			clusters[stopped].Close()
			after := time.Now()
			cut(nodes[stopped], nodes)
			id := nodes[stopped].id
			var n Node
			waitUntil(t, 20*time.Second, "the stopped node's leave", func() bool {
				n, _ = clusters[other].Node(id)
				return n.State == NodeDead
			})
			until, held := clusters[other].MaintenanceHold(after)
			if interval == 0 {
				if n.Stopped || !n.MaintenanceUntil.IsZero() || len(held) != 0 {
					t.Fatalf("stopped with no down-out interval: %+v, hold %v; want no window", n, held)
				}
				return
			}
			if !n.Stopped || n.MaintenanceUntil.Before(before.Add(interval)) || n.MaintenanceUntil.After(after.Add(interval)) {
				t.Fatalf("the stopped node: %+v; want a stop window ending %v after its stop (%v to %v)", n, interval, before, after)
			}
			if !slices.Equal(held, []string{id}) || !until.Equal(n.MaintenanceUntil) {
				t.Fatalf("recovery hold: %v until %v; want the stopped node until its window's end", held, until)
			}
			var window, leave uint64
			clusters[other].fsm.View(func(s *State) {
				for _, e := range s.Events {
					switch {
					case strings.Contains(e.Text, "is stopping cleanly: down, not out"):
						window = e.Index
					case strings.Contains(e.Text, id+" left (stopped)"):
						leave = e.Index
					}
				}
			})
			if window == 0 || leave == 0 || window > leave {
				t.Fatalf("events: the window at entry %d, the leave at %d; want the window first", window, leave)
			}
		})
	}
}
