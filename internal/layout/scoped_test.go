package layout

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

// A round's scope ends when the node applies a newer epoch, through the
// epoch's context (no goroutine per round), and only then: node changes
// that leave the epoch alone, or a round that ended first, do not end
// another round's scope.
func TestScopedEndsWithItsEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := cluster.NewLocal()
		defer log.Close()
		m := log.Member("a", "a.1", 0)
		defer m.Stop()
		m.SetConnected(true)
		for _, id := range []string{"a", "b", "c"} {
			if _, err := log.NodeJoin(cluster.Node{ID: id, Incarnation: id + ".1"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := log.Format(2, cluster.MinObjectSize); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		epoch := m.Epoch()
		if _, current := m.EpochContext(); current != epoch {
			t.Fatalf("EpochContext says epoch %d, the member applied %d", current, epoch)
		}

		epochCtx, _ := m.EpochContext()
		ctx := context.Background()
		round, endRound := Scoped(ctx, m, object.Epoch(epoch), time.Hour)
		finished, endFinished := Scoped(ctx, m, object.Epoch(epoch), time.Hour)
		endFinished() // a round that is over before the epoch changes
		if _, err := log.SetMaintenance("b", time.Minute); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m.Epoch() == epoch && round.Err() != nil {
			t.Fatalf("a change without a new epoch ended the round: %v", round.Err())
		}
		if m.Epoch() == epoch && epochCtx.Err() != nil {
			t.Fatal("the epoch's context ended without a new epoch")
		}
		if !errors.Is(finished.Err(), context.Canceled) {
			t.Fatalf("the finished round's scope: %v, want canceled", finished.Err())
		}

		if _, err := log.NodeLeave("c", "test"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m.Epoch() <= epoch {
			t.Fatalf("no new epoch after a node left (still %d)", m.Epoch())
		}
		if epochCtx.Err() == nil || round.Err() == nil {
			t.Fatalf("the epoch's context (%v) or the round's scope (%v) outlived the epoch", epochCtx.Err(), round.Err())
		}
		endRound()

		// A round for an epoch already past ends at once; one for the
		// current epoch stays open, and ends at its time limit.
		late, endLate := Scoped(ctx, m, object.Epoch(epoch), time.Hour)
		defer endLate()
		if late.Err() == nil {
			t.Fatal("a round for a past epoch was not ended")
		}
		current, endCurrent := Scoped(ctx, m, object.Epoch(m.Epoch()), time.Minute)
		defer endCurrent()
		synctest.Wait()
		if current.Err() != nil {
			t.Fatalf("a round for the current epoch ended: %v", current.Err())
		}
		time.Sleep(time.Minute + time.Second)
		if !errors.Is(current.Err(), context.DeadlineExceeded) {
			t.Fatalf("the round's time limit: %v, want deadline exceeded", current.Err())
		}
	})
}
