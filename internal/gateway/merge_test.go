package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/object"
)

// fakeMergeLog is the merge runner's log on the world's: it records
// merges and flattens in the real log through node00's member; it lists
// no jobs (the tests give them) and says it leads, at the highest level.
type fakeMergeLog struct{ c *fakeCluster }

func (l fakeMergeLog) IsLeader() bool                { return true }
func (l fakeMergeLog) LayerJobs() []cluster.LayerJob { return nil }
func (l fakeMergeLog) Level() int                    { return cluster.SupportedLevel }

func (l fakeMergeLog) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	defer l.c.sync()
	return l.c.member("node00").LayerMerged(ctx, layer, child, parent)
}

func (l fakeMergeLog) LayerFlattened(ctx context.Context, child, parent uint32) error {
	defer l.c.sync()
	return l.c.member("node00").LayerFlattened(ctx, child, parent)
}

// freeLayer removes a VDI's data and map objects, as the garbage
// collector does once a merge committed.
func freeLayer(t *testing.T, g *Gateway, id uint32, objects int) {
	ctx := context.Background()
	for i := range objects {
		if err := g.RemoveObject(ctx, object.DataOID(object.VDIID(id), uint32(i)), 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := g.RemoveObject(ctx, object.MapOID(object.VDIID(id), 0), 3); err != nil {
		t.Fatal(err)
	}
}

// TestMergeDeletedLayerWhileWriting: a deleted snapshot is merged into
// the writable VDI while a guest writes it through the same gateway (the
// merge job on the writer's open): no write is lost, nothing the layer
// held is lost, and once the layer's objects are freed the VDI and the
// snapshot below it still read the same; a snapshot child is merged
// without a writer; a flatten makes a clone independent.
func TestMergeDeletedLayerWhileWriting(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.finalize(cluster.FeatureLayerMerge.Level)
	const objects = 12
	const size = objects * objectSize
	w.cluster.addVDI("disk", 1, size)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	m := make(model, size)
	write := func(seed int64, off, n int) {
		p := pattern(seed, n)
		if err := e.WriteAt(ctx, p, uint64(off), false); err != nil {
			t.Error(err)
			return
		}
		m.write(p, uint64(off))
	}
	write(1, 0, size/2)
	r1, err := g.Snapshot(ctx, "disk", "base")
	if err != nil {
		t.Fatal(err)
	}
	base := append(model(nil), m...)
	write(2, 3*objectSize+100, 5*objectSize) // partly over base: copy-on-write
	if err := e.Trim(ctx, 10*objectSize, objectSize, false); err != nil {
		t.Fatal(err)
	}
	clear(m[10*objectSize : 11*objectSize])
	r2, err := g.Snapshot(ctx, "disk", "b1")
	if err != nil {
		t.Fatal(err)
	}
	// b1 is deleted (kept for disk): merge it into disk while the guest
	// writes small pieces all over.
	w.cluster.deleteVDI("disk@b1")
	layer, _ := w.cluster.VDIByID(r2.Snapshot.ID)
	child, _ := w.cluster.VDI("disk")
	job := cluster.LayerJob{Child: child, Layer: layer.ID, Sources: []uint32{layer.ID}, LayerParent: layer.Parent}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 40 {
			off := (i*7919*4096 + 512) % (size - 8192)
			p := pattern(int64(100+i), 4096)
			if err := e.WriteAt(ctx, p, uint64(off), i%3 == 0); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			m.write(p, uint64(off))
			mu.Unlock()
		}
	}()
	rate := &MergeRate{}
	if err := g.RunLayerJob(ctx, job, fakeMergeLog{w.cluster}, rate); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if chain := w.cluster.Chain(child.ID); len(chain) != 2 || chain[1] != r1.Snapshot.ID {
		t.Fatalf("chain after the merge: %v", chain)
	}
	freeLayer(t, g, layer.ID, objects)
	verify(t, e, m) // the open's old chain: re-read through the new one
	g.layers.refreshChains()
	verify(t, e, m)
	verify(t, open(t, w.gateway("node01"), "disk"), m)
	verify(t, open(t, g, "disk@base"), base)

	// Flatten a clone of base while it is written: base can then go.
	w.cluster.clone(r1.Snapshot.ID, "copy")
	w.cluster.flatten("copy")
	c := open(t, g, "copy")
	cm := append(model(nil), base...)
	p := pattern(7, 2*objectSize)
	if err := c.WriteAt(ctx, p, objectSize/2, false); err != nil {
		t.Fatal(err)
	}
	cm.write(p, objectSize/2)
	clone, _ := w.cluster.VDI("copy")
	if err := g.RunLayerJob(ctx, cluster.LayerJob{Child: clone, Flatten: true, Sources: w.cluster.Chain(clone.ID)[1:]}, fakeMergeLog{w.cluster}, rate); err != nil {
		t.Fatal(err)
	}
	if chain := w.cluster.Chain(clone.ID); len(chain) != 1 {
		t.Fatalf("chain after the flatten: %v", chain)
	}
	g.layers.refreshChains()
	verify(t, c, cm)
	// base's objects are still disk's: only the clone is independent.
	verify(t, e, m)
}

// TestMergeIntoSnapshotChild: a deleted layer whose only child is a
// snapshot is merged without any writer, and the layer freed.
func TestMergeIntoSnapshotChild(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.finalize(cluster.FeatureLayerMerge.Level)
	const objects = 6
	w.cluster.addVDI("disk", 1, objects*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx := context.Background()
	m := make(model, objects*objectSize)
	for i, off := range []int{0, 2 * objectSize, 4*objectSize + 77} {
		p := pattern(int64(i), objectSize)
		if err := e.WriteAt(ctx, p, uint64(off), false); err != nil {
			t.Fatal(err)
		}
		m.write(p, uint64(off))
		if _, err := g.Snapshot(ctx, "disk", string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := w.cluster.VDI("disk@a")
	b, _ := w.cluster.VDI("disk@b")
	w.cluster.deleteVDI("disk@a")
	if err := g.RunLayerJob(ctx, cluster.LayerJob{Child: b, Layer: a.ID, Sources: []uint32{a.ID}, LayerParent: a.Parent}, fakeMergeLog{w.cluster}, &MergeRate{}); err != nil {
		t.Fatal(err)
	}
	freeLayer(t, g, a.ID, objects)
	verify(t, e, m)
}

// gatedMergeLog lists one merge job while its layer is deleted and not
// merged, at a feature level the test sets, and counts the merges.
type gatedMergeLog struct {
	fakeMergeLog
	job    cluster.LayerJob
	level  *atomic.Int64
	merged *atomic.Int64
}

func (l gatedMergeLog) Level() int { return int(l.level.Load()) }

func (l gatedMergeLog) LayerJobs() []cluster.LayerJob {
	if v, ok := l.c.VDIByID(l.job.Layer); ok && v.Deleted {
		return []cluster.LayerJob{l.job}
	}
	return nil
}

func (l gatedMergeLog) LayerMerged(ctx context.Context, layer, child, parent uint32) error {
	l.merged.Add(1)
	return l.fakeMergeLog.LayerMerged(ctx, layer, child, parent)
}

// TestMergesWaitForTheirLevel: below cluster.FeatureLayerMerge's level (a
// cluster upgraded from before merges, not yet finalized) the merge
// runner starts no job, though the log lists one (the log would refuse
// its merged entry after the copies); once the level is reached it
// merges the deleted layer.
func TestMergesWaitForTheirLevel(t *testing.T) {
	w := newWorld(t, 3, 3)
	w.cluster.finalize(cluster.FeatureLayerMerge.Level)
	const objects = 4
	w.cluster.addVDI("disk", 1, objects*objectSize)
	g := w.gateway("node00")
	e := open(t, g, "disk")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := make(model, objects*objectSize)
	p := pattern(1, 2*objectSize)
	if err := e.WriteAt(ctx, p, objectSize/2, false); err != nil {
		t.Fatal(err)
	}
	m.write(p, objectSize/2)
	r, err := g.Snapshot(ctx, "disk", "gone")
	if err != nil {
		t.Fatal(err)
	}
	w.cluster.deleteVDI("disk@gone")
	layer, _ := w.cluster.VDIByID(r.Snapshot.ID)
	child, _ := w.cluster.VDI("disk")
	log := gatedMergeLog{fakeMergeLog: fakeMergeLog{w.cluster}, job: cluster.LayerJob{Child: child, Layer: layer.ID, Sources: []uint32{layer.ID}, LayerParent: layer.Parent},
		level: &atomic.Int64{}, merged: &atomic.Int64{}}
	log.level.Store(int64(cluster.FeatureLayerMerge.Level - 1))
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.RunMerges(ctx, log, &MergeRate{})
	}()
	time.Sleep(2500 * time.Millisecond) // the runner looks each second
	if n := log.merged.Load(); n != 0 || g.Merges().Copied.Load() != 0 {
		t.Fatalf("below the merges' level: %d merges, %d objects copied; want none", n, g.Merges().Copied.Load())
	}
	if chain := w.cluster.Chain(child.ID); len(chain) != 2 {
		t.Fatalf("chain below the merges' level: %v; want disk and its deleted layer", chain)
	}

	log.level.Store(int64(cluster.FeatureLayerMerge.Level))
	deadline := time.Now().Add(10 * time.Second)
	for log.merged.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no merge 10 s after the cluster reached the merges' level")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	if chain := w.cluster.Chain(child.ID); len(chain) != 1 {
		t.Fatalf("chain after the merge: %v", chain)
	}
	freeLayer(t, g, layer.ID, objects)
	g.layers.refreshChains()
	verify(t, e, m)
}
