package cluster

// The cluster-level rows of docs/TESTING.md's table of bugs the tests
// found, as scenario files (testdata/scenarios, etcd's datadriven
// style): each file replays the sequence that went wrong, through the
// production state machine (Local applies every entry with the FSM
// every node runs) or the leader's voter plan, and its expected output
// says what must happen instead. `go test ./internal/cluster -run
// TestScenarios -rewrite` rewrites the expected outputs; read the diff
// before committing it.
//
// Directives, state machine (Local, the leader's log, and its members):
//
//	join id=ID [zone=Z] [capacity=BYTES] [incarnation=I]  -> the epoch
//	leave id=ID                                            -> the epoch
//	format copies=N [object-size=BYTES]
//	finalize-upgrade [level=N]  (default: the highest this binary has)
//	member id=ID incarnation=I [lag=DURATION]  a node's process
//	create name=NAME size=BYTES [exclusive] [copies=N]
//	snapshot via=ID name=NAME tag=TAG
//	rollback name=NAME tag=TAG
//	delete name=FULLNAME
//	lock via=ID key=KEY session=S|session-hex=HEX
//	lookup via=ID name=NAME
//	merged via=ID layer=L child=L parent=L|none (L: NAME, NAME@TAG or a vdi id)
//	vdis     every VDI and snapshot, by id
//	epochs   the epoch history with each epoch's members
//
// Directives, the voter plan (voters.go) of a leader over nodes by name:
//
//	plan leader=ID voters=ID,... [nonvoters=ID,...] [nodes=ID,...]
//	unreachable ID...  /  reachable ID...  (the leader's raft contact)
//	dead ID...         the log records them left, gossip lost them
//	stopping ID...     they announced a clean stop
//	gone ID...         gossip lost them, the log not yet
//	settle             make every change the plan asks, one by one,
//	                   printing each and whether the voters the leader
//	                   reaches are still a majority after it

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/hashicorp/raft"

	"github.com/herd-storage/herd/internal/size"
)

func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		s := &scenario{t: t}
		defer s.close()
		datadriven.RunTest(t, path, s.run)
	})
}

type scenario struct {
	t       *testing.T
	local   *Local
	members map[string]*LocalMember
	plan    *planFixture
}

func (s *scenario) close() {
	for _, m := range s.members {
		m.Stop()
	}
	if s.local != nil {
		s.local.Close()
	}
}

func (s *scenario) log() *Local {
	if s.local == nil {
		s.local = NewLocal()
		s.members = map[string]*LocalMember{}
	}
	return s.local
}

func (s *scenario) via(d *datadriven.TestData) *LocalMember {
	id := arg(d, "via")
	m := s.members[id]
	if m == nil {
		d.Fatalf(s.t, "no member %q (use member id=%s incarnation=...)", id, id)
	}
	return m
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch d.Cmd {
	case "join":
		n := Node{ID: arg(d, "id"), Zone: optArg(d, "zone", ""), Incarnation: optArg(d, "incarnation", "1"), State: NodeAlive}
		n.PeerAddr = n.ID + ":7000"
		if c := optArg(d, "capacity", ""); c != "" {
			n.Capacity = bytesArg(t, d, c)
		}
		epoch, err := s.log().NodeJoin(n)
		return result(fmt.Sprintf("epoch %d", epoch), err)
	case "leave":
		epoch, err := s.log().NodeLeave(arg(d, "id"), "scenario")
		return result(fmt.Sprintf("epoch %d", epoch), err)
	case "format":
		copies, _ := strconv.Atoi(arg(d, "copies"))
		objectSize := uint64(DefaultObjectSize)
		if o := optArg(d, "object-size", ""); o != "" {
			objectSize = bytesArg(t, d, o)
		}
		f, err := s.log().Format(copies, objectSize)
		return result(fmt.Sprintf("copies %d, objects of %d bytes", f.Copies, f.ObjectSize), err)
	case "finalize-upgrade":
		target := SupportedLevel
		if l := optArg(d, "level", ""); l != "" {
			target, _ = strconv.Atoi(l)
		}
		level, err := s.log().FinalizeUpgrade(target)
		return result(fmt.Sprintf("feature level %d", level), err)
	case "member":
		id := arg(d, "id")
		m := s.log().Member(id, arg(d, "incarnation"), 0)
		m.SetConnected(true)
		if lag := optArg(d, "lag", ""); lag != "" {
			l, err := time.ParseDuration(lag)
			if err != nil {
				d.Fatalf(t, "lag: %v", err)
			}
			m.SetLag(l)
		}
		if old := s.members[id]; old != nil {
			old.Stop()
		}
		s.members[id] = m
		return "ok"
	case "create":
		copies := 0
		if c := optArg(d, "copies", ""); c != "" {
			copies, _ = strconv.Atoi(c)
		}
		v, err := s.log().CreateVDIWithCopies(arg(d, "name"), bytesArg(t, d, arg(d, "size")), d.HasArg("exclusive"), copies)
		return result(describeVDI(v), err)
	case "snapshot":
		r, err := s.via(d).SnapshotVDI(ctx, arg(d, "name"), arg(d, "tag"), "")
		return result(fmt.Sprintf("snapshot %s, the name now vdi %d", r.Snapshot.FullName(), r.VDI.ID), err)
	case "rollback":
		v, err := s.log().cmds.RollbackVDI(ctx, arg(d, "name"), arg(d, "tag"))
		return result(describeVDI(v), err)
	case "delete":
		return result("ok", s.log().DeleteVDI(arg(d, "name")))
	case "lock":
		session := optArg(d, "session", "")
		if h := optArg(d, "session-hex", ""); h != "" {
			b, err := hex.DecodeString(h)
			if err != nil {
				d.Fatalf(t, "session-hex: %v", err)
			}
			session = string(b)
		}
		l, err := s.via(d).AcquireLock(ctx, arg(d, "key"), session)
		return result(fmt.Sprintf("lock %s held by %s (process %s), generation %d", l.Key, l.Node, l.Incarnation, l.Generation), err)
	case "lookup":
		v, err := s.via(d).LookupVDI(ctx, arg(d, "name"))
		return result(describeVDI(v), err)
	case "merged":
		var layer, child, parent uint32
		s.local.fsm.View(func(st *State) {
			layer = s.idOf(d, st, arg(d, "layer"))
			child = s.idOf(d, st, arg(d, "child"))
			if p := arg(d, "parent"); p != "none" {
				parent = s.idOf(d, st, p)
			}
		})
		return result("ok", s.via(d).LayerMerged(ctx, layer, child, parent))
	case "vdis":
		var out []string
		s.local.fsm.View(func(st *State) {
			all := slices.Collect(func(yield func(*VDI) bool) {
				for _, v := range st.VDIs {
					yield(v)
				}
				for _, v := range st.Snapshots {
					yield(v)
				}
			})
			sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
			for _, v := range all {
				out = append(out, describeVDI(*v))
			}
		})
		return strings.Join(out, "\n")
	case "epochs":
		var out []string
		s.local.fsm.View(func(st *State) {
			for _, e := range st.Epochs {
				var members []string
				for _, m := range e.Members {
					members = append(members, fmt.Sprintf("%s(zone %q, weight %d)", m.ID, m.Zone, m.Weight))
				}
				out = append(out, fmt.Sprintf("epoch %d %s: %s", e.Number, e.Reason, strings.Join(members, " ")))
			}
		})
		return strings.Join(out, "\n")

	case "plan":
		s.plan = newScenarioPlan(d)
		return strings.Join(s.plan.voters(), " ")
	case "unreachable", "reachable", "dead", "stopping", "gone":
		for _, a := range d.CmdArgs {
			id := a.Key
			if _, ok := s.plan.nodes[id]; !ok {
				d.Fatalf(t, "no node %q in the plan", id)
			}
			switch d.Cmd {
			case "unreachable", "reachable":
				s.plan.reachable[id] = d.Cmd == "reachable"
			case "dead":
				s.plan.dead(id)
			case "stopping":
				s.plan.stopping[id] = true
			case "gone":
				delete(s.plan.members, id)
			}
		}
		return "ok"
	case "settle":
		return s.settle()
	}
	d.Fatalf(t, "unknown directive %q", d.Cmd)
	return ""
}

// settle applies the plan's changes one by one, as the leader's
// reconcile loop does, and says after each whether the voters the leader
// reaches are still a majority of the configuration (raft commits a
// change by the new configuration's majority; without one the cluster
// cannot commit or elect).
func (s *scenario) settle() string {
	var out []string
	for range 20 {
		ch, held := s.plan.next()
		if len(held) > 0 {
			out = append(out, "held back: "+strings.Join(held, ", "))
		}
		if ch == nil {
			out = append(out, "voters: "+strings.Join(s.plan.voters(), " "))
			return strings.Join(out, "\n")
		}
		s.plan.apply(s.t, *ch)
		voters := s.plan.voters()
		reached := 0
		for _, v := range voters {
			if v == s.plan.self || s.plan.reachable[v] {
				reached++
			}
		}
		majority := "majority kept"
		if 2*reached <= len(voters) {
			majority = "MAJORITY LOST"
		}
		out = append(out, fmt.Sprintf("%v: voters %s, %d reached (%s)", ch, strings.Join(voters, " "), reached, majority))
	}
	return strings.Join(append(out, "the plan never settled"), "\n")
}

func newScenarioPlan(d *datadriven.TestData) *planFixture {
	voters := listArg(d, "voters")
	nonvoters := listArg(d, "nonvoters")
	nodes := listArg(d, "nodes")
	if len(nodes) == 0 {
		nodes = append(slices.Clone(voters), nonvoters...)
	}
	f := &planFixture{self: arg(d, "leader"), nodes: map[string]Node{}, members: map[string]Node{}, stopping: map[string]bool{}, reachable: map[string]bool{}}
	for _, id := range nodes {
		n := Node{ID: id, PeerAddr: id + ":7000", State: NodeAlive}
		f.nodes[id], f.members[id], f.reachable[id] = n, n, true
	}
	for _, id := range voters {
		f.servers = append(f.servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7000"), Suffrage: raft.Voter})
	}
	for _, id := range nonvoters {
		f.servers = append(f.servers, raft.Server{ID: raft.ServerID(id), Address: raft.ServerAddress(id + ":7000"), Suffrage: raft.Nonvoter})
	}
	return f
}

func (s *scenario) idOf(d *datadriven.TestData, st *State, full string) uint32 {
	if id, err := strconv.ParseUint(full, 10, 32); err == nil {
		return uint32(id) // a layer merged away has no name left
	}
	// Deleted snapshots too: a merge names the deleted layer.
	name, tag := SplitName(full)
	if tag == "" {
		if v, ok := st.VDIs[name]; ok {
			return v.ID
		}
	}
	for _, v := range st.Snapshots {
		if v.Name == name && v.Tag == tag {
			return v.ID
		}
	}
	d.Fatalf(s.t, "no vdi or snapshot %s", full)
	return 0
}

func describeVDI(v VDI) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vdi %d %s", v.ID, v.FullName())
	if v.Parent != 0 {
		fmt.Fprintf(&b, " parent=%d", v.Parent)
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{v.Snapshot, "snapshot"}, {v.Deleted, "deleted"}, {v.Exclusive, "exclusive"}, {v.Unclean, "unclean"}, {v.Flatten, "flatten"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	if v.Handovers != 0 {
		fmt.Fprintf(&b, " handovers=%d", v.Handovers)
	}
	if v.BrokenGeneration != 0 {
		fmt.Fprintf(&b, " broken-generation=%d", v.BrokenGeneration)
	}
	return b.String()
}

func result(ok string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return ok
}

func arg(d *datadriven.TestData, key string) string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			return strings.Join(a.Vals, ",")
		}
	}
	panic(fmt.Sprintf("%s: %s needs %s=", d.Pos, d.Cmd, key))
}

func optArg(d *datadriven.TestData, key, def string) string {
	if !d.HasArg(key) {
		return def
	}
	return arg(d, key)
}

func listArg(d *datadriven.TestData, key string) []string {
	for _, a := range d.CmdArgs {
		if a.Key == key {
			var out []string
			for _, v := range a.Vals {
				out = append(out, strings.Split(v, ",")...)
			}
			return out
		}
	}
	return nil
}

func bytesArg(t *testing.T, d *datadriven.TestData, s string) uint64 {
	n, err := size.Parse(s)
	if err != nil {
		d.Fatalf(t, "%s: %v", s, err)
	}
	return n
}
