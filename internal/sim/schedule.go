package sim

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/ec"
)

// Config is the shape of one simulated cluster, drawn from the seed.
type Config struct {
	Nodes  int
	Copies int
	// MaxFaulty bounds the nodes faulty at once: killed, paused or cut off
	// from the others. Above copies-1 an object can have every replica of
	// an epoch down (the paper's Fig. 4), which the proof of currency must
	// handle by refusing the object, never by serving an older copy.
	MaxFaulty  int
	ObjectSize uint64 // bytes
	VDISize    uint64 // bytes, per client
	Clients    int    // each writes and reads its own VDI
	Lanes      int    // operations a client has in flight at once, on distinct blocks
	// ClientCopies are the clients' VDIs' own numbers of copies (`vdi
	// create --copies`), by client; 0 or absent: the format's. Another
	// number than the format's needs the cluster's feature level raised
	// first (World.start finalizes the upgrade).
	ClientCopies []int
	// Faults is how long faults are injected; then everything heals.
	Faults time.Duration
	// OldNodes start on an older herd, whose binary supports only
	// feature level 1 (cluster.Build, Local.SetBuild), until an Upgrade
	// event restarts each on this one. Finalize events then raise the
	// cluster's level (refused while an old node is a member), and once
	// it is raised a VDI of UpgradeCopies copies of its own (not the
	// format's) is created, with a client of its own. Empty: every node
	// runs this herd from the start.
	OldNodes      []int
	UpgradeCopies int
	// Layers runs every process's merge runner (gateway.RunMerges, paced
	// at eight objects a second of fake time), and
	// allows Snapshot, DeleteSnapshot and Flatten events: the invariants
	// then follow each client's VDI through its chain.
	Layers bool
	// ClientEC are the clients' VDIs' erasure-coding schemes (`vdi
	// create --ec K+M`), by client; "" or absent: copies (ClientCopies).
	// A VDI of a scheme needs the cluster's level raised first
	// (World.start finalizes it), so no seed with OldNodes has one.
	ClientEC []string
	// ECWriteCrashPerMille is the chance, per 1000, that the node whose
	// gateway passes a gateway.ECStep of a write is killed right there;
	// ECFoldCrashPerMille at a step of a fold. ECCrashes bounds how many
	// are killed so in a run. A node so killed starts again at the first
	// step at least crashRestart later, unless the schedule kills it
	// meanwhile (then it waits for the schedule's restart).
	ECWriteCrashPerMille int
	ECFoldCrashPerMille  int
	ECCrashes            int
}

// EventKind is what a scheduled event does.
type EventKind int

const (
	Check       EventKind = iota // nothing: a step that only checks the invariants
	Kill                         // the node's process dies (its disk stays)
	Restart                      // a killed node starts again: a new process
	Pause                        // the node's process stops (SIGSTOP)
	Resume                       // ... and continues (SIGCONT)
	Partition                    // Nodes are cut off from the others, both ways
	Heal                         // the partition ends
	Network                      // message drops and delays change
	Lag                          // how far behind the log the node applies
	Maintenance                  // the node's maintenance window opens (Window)
	Upgrade                      // the node's process restarts on this herd (Config.OldNodes)
	Finalize                     // the operator runs `herd cluster finalize-upgrade`
	// The VDI tree (Config.Layers), on client Event.Client's VDI:
	Snapshot       // `herd vdi snapshot`, through the node holding its writer lock
	DeleteSnapshot // `herd vdi delete NAME@TAG` of its oldest snapshot left
	Flatten        // `herd vdi flatten`
	// Stop is a clean stop (SIGTERM), as server.Run's: the node opens its
	// down-out window, answers the requests in flight, flushes, and
	// ends; the leader commits its leave at once (stop.go).
	Stop
)

var eventNames = map[EventKind]string{Check: "check", Kill: "kill", Restart: "restart", Pause: "pause", Resume: "resume", Partition: "partition", Heal: "heal", Network: "network", Lag: "lag", Maintenance: "maintenance", Upgrade: "upgrade", Finalize: "finalize-upgrade", Snapshot: "snapshot", DeleteSnapshot: "delete-snapshot", Flatten: "flatten", Stop: "stop"}

func (k EventKind) String() string { return eventNames[k] }

// Event is one step of a schedule.
type Event struct {
	At           time.Duration // since the fault phase began
	Kind         EventKind
	Node         int   // Kill, Restart, Pause, Resume, Lag, Maintenance, Upgrade
	Nodes        []int // Partition: the nodes cut off
	DropPerMille int   // Network: requests (and, as often, answers) lost per 1000
	DelayMax     time.Duration
	Lag          time.Duration
	Window       time.Duration // Maintenance
	Client       int           // Snapshot, DeleteSnapshot, Flatten
	// CatchUp (Resume, Heal, Restart, Upgrade): how long the nodes this event
	// connects to the majority again take before they apply the log
	// entries they missed, while they have contact with the leader
	// already (cluster.LocalMember.SetCatchUp).
	CatchUp time.Duration
}

func (e Event) String() string {
	catchUp := ""
	if e.CatchUp > 0 {
		catchUp = fmt.Sprintf(" (catching up on the log after %v)", e.CatchUp)
	}
	switch e.Kind {
	case Restart, Resume:
		return fmt.Sprintf("%s n%d%s", e.Kind, e.Node, catchUp)
	case Upgrade:
		return fmt.Sprintf("upgrade: n%d restarts on this herd (feature level %d)%s", e.Node, cluster.SupportedLevel, catchUp)
	case Heal:
		return e.Kind.String() + catchUp
	case Kill, Pause:
		return fmt.Sprintf("%s n%d", e.Kind, e.Node)
	case Stop:
		return fmt.Sprintf("stop n%d (SIGTERM: a clean stop)", e.Node)
	case Partition:
		var ids []string
		for _, n := range e.Nodes {
			ids = append(ids, fmt.Sprintf("n%d", n))
		}
		return fmt.Sprintf("partition: %s cut off from the others", strings.Join(ids, ","))
	case Network:
		return fmt.Sprintf("network: drop %d/1000 requests and as many answers, delay up to %v", e.DropPerMille, e.DelayMax)
	case Lag:
		return fmt.Sprintf("lag: n%d applies the log %v late", e.Node, e.Lag)
	case Maintenance:
		return fmt.Sprintf("maintenance: n%d for %v", e.Node, e.Window)
	case Snapshot, DeleteSnapshot, Flatten:
		return fmt.Sprintf("%s of client %d's vdi", e.Kind, e.Client+1)
	}
	return e.Kind.String()
}

// Schedule is a seed's world and its faults: a pure function of the seed.
type Schedule struct {
	Seed   uint64
	Config Config
	Events []Event
}

// Step lengths. Checks run every checkInterval of fake time besides
// after every fault.
const (
	checkInterval = time.Second
	faultGapMin   = 200 * time.Millisecond
	faultGapMax   = 5 * time.Second
)

// NewSchedule draws a seed's configuration and fault schedule.
func NewSchedule(seed uint64) Schedule { return newSchedule(seed, ECSometimes) }

// ECSeeds says which seeds have an erasure-coded VDI (Options.EC).
type ECSeeds int

const (
	// ECSometimes: a third of them (drawEC).
	ECSometimes ECSeeds = iota
	// ECAlways: every one, with crash points often, and so no rolling
	// upgrade: the search for the seeded bugs of erasure coding.
	ECAlways
	// ECNever: none, each seed's world as before erasure-coded VDIs:
	// for the seeds that replay what they found then.
	ECNever
)

var ecSeedsNames = map[ECSeeds]string{ECSometimes: "sometimes", ECAlways: "always", ECNever: "never"}

func (e ECSeeds) String() string { return ecSeedsNames[e] }

// ParseECSeeds reads an ECSeeds by its name ("" is ECSometimes).
func ParseECSeeds(name string) (ECSeeds, error) {
	if name == "" {
		return ECSometimes, nil
	}
	for e, n := range ecSeedsNames {
		if n == name {
			return e, nil
		}
	}
	return 0, fmt.Errorf("sim: erasure-coded seeds %q: want sometimes, always or never", name)
}

// newSchedule is NewSchedule, with the erasure-coded VDIs mode says.
func newSchedule(seed uint64, mode ECSeeds) Schedule {
	r := rand.New(rand.NewPCG(seed, 0x5eed5eed))
	cfg := Config{
		Nodes:      5 - r.IntN(4)/3, // 5 nodes 3 times in 4
		Copies:     2 + r.IntN(3)/2, // 2 copies 2 times in 3
		ObjectSize: 64 << 10,
		VDISize:    1 << 20,
		Clients:    2,
		Lanes:      3,
		Faults:     time.Duration(15+r.IntN(16)) * time.Second,
	}
	// Mostly as many faulty nodes as copies (more than copies-1: every
	// replica of an epoch may be down), while a majority stays (or, with 4
	// nodes, half: the log then stalls until one returns).
	cfg.MaxFaulty = min(cfg.Copies-r.IntN(3)/2, cfg.Nodes/2)

	s := Schedule{Seed: seed, Config: cfg}
	killed, paused, cut := map[int]bool{}, map[int]bool{}, map[int]bool{}
	faulty := func() int { return len(killed) + len(paused) + len(cut) }
	healthy := func() []int {
		var out []int
		for n := 0; n < cfg.Nodes; n++ {
			if !killed[n] && !paused[n] && !cut[n] {
				out = append(out, n)
			}
		}
		return out
	}
	keys := func(m map[int]bool) []int {
		var out []int
		for n := range m {
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	var faults []Event
	for at := time.Duration(0); ; {
		at += faultGapMin + time.Duration(r.Int64N(int64(faultGapMax-faultGapMin)))
		if at >= cfg.Faults {
			break
		}
		type choice struct {
			weight int
			make   func() Event
		}
		var choices []choice
		if h := healthy(); faulty() < cfg.MaxFaulty && len(h) > 0 {
			choices = append(choices,
				choice{3, func() Event { n := h[r.IntN(len(h))]; killed[n] = true; return Event{Kind: Kill, Node: n} }},
				choice{2, func() Event { n := h[r.IntN(len(h))]; paused[n] = true; return Event{Kind: Pause, Node: n} }})
			if len(cut) == 0 {
				choices = append(choices, choice{2, func() Event {
					k := 1 + r.IntN(cfg.MaxFaulty-faulty())
					r.Shuffle(len(h), func(i, j int) { h[i], h[j] = h[j], h[i] })
					group := slices.Clone(h[:min(k, len(h))])
					slices.Sort(group)
					for _, n := range group {
						cut[n] = true
					}
					return Event{Kind: Partition, Nodes: group}
				}})
			}
		}
		if len(killed) > 0 {
			choices = append(choices, choice{2, func() Event {
				ks := keys(killed)
				n := ks[r.IntN(len(ks))]
				delete(killed, n)
				return Event{Kind: Restart, Node: n}
			}})
		}
		if len(paused) > 0 {
			choices = append(choices, choice{2, func() Event {
				ps := keys(paused)
				n := ps[r.IntN(len(ps))]
				delete(paused, n)
				return Event{Kind: Resume, Node: n}
			}})
		}
		if len(cut) > 0 {
			choices = append(choices, choice{2, func() Event { clear(cut); return Event{Kind: Heal} }})
		}
		choices = append(choices,
			choice{1, func() Event {
				drops := []int{0, 0, 10, 50}[r.IntN(4)]
				delay := []time.Duration{0, 2 * time.Millisecond, 20 * time.Millisecond, 200 * time.Millisecond}[r.IntN(4)]
				return Event{Kind: Network, DropPerMille: drops, DelayMax: delay}
			}},
			choice{1, func() Event {
				return Event{Kind: Lag, Node: r.IntN(cfg.Nodes), Lag: []time.Duration{0, 10 * time.Millisecond, 300 * time.Millisecond}[r.IntN(3)]}
			}})
		total := 0
		for _, c := range choices {
			total += c.weight
		}
		pick := r.IntN(total)
		for _, c := range choices {
			if pick < c.weight {
				e := c.make()
				e.At = at
				faults = append(faults, e)
				break
			}
			pick -= c.weight
		}
		// Rolling faults: half the time nodes that return are followed at
		// once by as many failing as the bound allows, so that what the
		// returning ones missed may be only on nodes that just went.
		if last := faults[len(faults)-1]; (last.Kind == Restart || last.Kind == Resume || last.Kind == Heal) && r.IntN(2) == 0 {
			for h := healthy(); faulty() < cfg.MaxFaulty && len(h) > 0; h = healthy() {
				n := h[r.IntN(len(h))]
				e := Event{At: at, Kind: Kill, Node: n}
				switch r.IntN(3) {
				case 0:
					e.Kind = Pause
					paused[n] = true
				case 1:
					killed[n] = true
				default:
					if len(cut) > 0 {
						killed[n] = true
						break
					}
					group := h[:0:0]
					for _, i := range r.Perm(len(h))[:min(cfg.MaxFaulty-faulty(), len(h))] {
						group = append(group, h[i])
					}
					slices.Sort(group)
					for _, i := range group {
						cut[i] = true
					}
					e = Event{At: at, Kind: Partition, Nodes: group}
				}
				faults = append(faults, e)
			}
		}
	}
	// A third of the kills follow a maintenance window for that node (5 to
	// 30 s), so that copies wait for it while it is down. These come from
	// their own random stream: the rest of each seed's schedule is what it
	// was before maintenance windows existed.
	m := rand.New(rand.NewPCG(seed, 0x6d61696e))
	withWindows := make([]Event, 0, len(faults))
	for _, e := range faults {
		if e.Kind == Kill && m.IntN(3) == 0 {
			withWindows = append(withWindows, Event{At: e.At, Kind: Maintenance, Node: e.Node, Window: time.Duration(5+m.IntN(26)) * time.Second})
		}
		withWindows = append(withWindows, e)
	}
	faults = withWindows
	// A third of the other kills are clean stops (SIGTERM) instead, from
	// a stream of their own.
	st := rand.New(rand.NewPCG(seed, 0x73746f70))
	for i, e := range faults {
		windowed := i > 0 && faults[i-1].Kind == Maintenance && faults[i-1].Node == e.Node && faults[i-1].At == e.At
		if e.Kind == Kill && !windowed && st.IntN(3) == 0 {
			faults[i].Kind = Stop
		}
	}
	// Nodes that return (resumed, healed, restarted) catch up on the log
	// late: a heartbeat reaches them before the entries they missed. From
	// a stream of their own too.
	u := rand.New(rand.NewPCG(seed, 0x63617463))
	for i, e := range faults {
		if e.Kind == Resume || e.Kind == Heal || e.Kind == Restart {
			faults[i].CatchUp = []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond, time.Second}[u.IntN(4)]
		}
	}
	// A rolling upgrade in a quarter of the seeds, from a stream of its
	// own too (so each seed's other events are what they were before).
	if mode != ECAlways {
		faults = append(faults, upgradeEvents(seed, &cfg)...)
	}
	// An erasure-coded VDI in a third of the seeds, from a stream of its
	// own too.
	drawEC(seed, &cfg, mode)
	s.Config = cfg
	// Checks every second between the faults.
	for at := checkInterval; at < cfg.Faults; at += checkInterval {
		faults = append(faults, Event{At: at, Kind: Check})
	}
	slices.SortStableFunc(faults, func(a, b Event) int {
		if c := cmp.Compare(a.At, b.At); c != 0 {
			return c
		}
		// Faults at one instant keep their order; a check follows them.
		return cmp.Compare(checkLast(a), checkLast(b))
	})
	s.Events = faults
	return s
}

func checkLast(e Event) int {
	if e.Kind == Check {
		return 1
	}
	return 0
}

// clientCopies is client i's VDI's own copies (0: the format's).
func (c Config) clientCopies(i int) int {
	if i < len(c.ClientCopies) {
		return c.ClientCopies[i]
	}
	return 0
}

// clientEC is client i's VDI's erasure-coding scheme ("": copies).
func (c Config) clientEC(i int) string {
	if i < len(c.ClientEC) {
		return c.ClientEC[i]
	}
	return ""
}

// hasEC says whether a client's VDI is erasure-coded.
func (c Config) hasEC() bool {
	for _, scheme := range c.ClientEC {
		if scheme != "" {
			return true
		}
	}
	return false
}

// ecSchemes are the schemes a seed's erasure-coded VDI draws from, by
// the nodes they need (K+M).
var ecSchemes = []string{"2+1", "3+1", "2+2", "3+2"}

// drawEC gives a third of the seeds (every one or none, as mode says)
// an erasure-coded VDI for one client, of a scheme that fits the seed's
// nodes, and the chance of a crash at each step of its writes and
// folds; never a seed with a rolling upgrade (its nodes start below the
// level erasure coding needs). From a stream of its own: the rest of
// each seed's schedule is what it was before.
func drawEC(seed uint64, cfg *Config, mode ECSeeds) {
	e := rand.New(rand.NewPCG(seed, 0x65637669))
	on := e.IntN(3) == 0
	var fit []string
	for _, scheme := range ecSchemes {
		if s, err := ec.Parse(scheme); err == nil && s.Chunks() <= cfg.Nodes {
			fit = append(fit, scheme)
		}
	}
	scheme := fit[e.IntN(len(fit))]
	client := e.IntN(cfg.Clients)
	// A write passes its steps some 20 times as often as a fold does.
	level := e.IntN(4)
	write, fold := []int{0, 2, 5, 10}[level], []int{0, 50, 100, 200}[level]
	crashes := 4
	switch mode {
	case ECAlways:
		on, write, fold, crashes = true, 10, 200, 6
	case ECNever:
		on = false
	}
	if !on || len(cfg.OldNodes) > 0 {
		return
	}
	cfg.ClientEC = make([]string, cfg.Clients)
	cfg.ClientEC[client] = scheme
	cfg.ECWriteCrashPerMille, cfg.ECFoldCrashPerMille, cfg.ECCrashes = write, fold, crashes
}

// ownCopies describes the clients' VDIs' own copies and schemes for the
// step log.
func (c Config) ownCopies() string {
	out := ""
	for i := 0; i < c.Clients; i++ {
		if scheme := c.clientEC(i); scheme != "" {
			out += fmt.Sprintf(", vdi%d erasure-coded %s (crash points: %d/1000 of a write's steps, %d/1000 of a fold's, at most %d)", i, scheme, c.ECWriteCrashPerMille, c.ECFoldCrashPerMille, c.ECCrashes)
		} else if n := c.clientCopies(i); n != 0 {
			out += fmt.Sprintf(", vdi%d's %d", i, n)
		}
	}
	if c.UpgradeCopies != 0 {
		out += fmt.Sprintf(", vdi%d's %d (created after the upgrade)", c.Clients, c.UpgradeCopies)
	}
	return out
}

// upgradeEvents draws a rolling upgrade for a quarter of the seeds: 1 to
// all nodes start on an older herd (Config.OldNodes); the operator tries
// `herd cluster finalize-upgrade` before any is upgraded (it must be
// refused), the old nodes are restarted on this herd one by one between
// 10% and 50% of the fault phase, and the operator finalizes between 55%
// and 70% of it (again at every step until it succeeds: a node that is
// down has an unknown version and keeps it refused). Once the level is
// raised, a VDI of one copy fewer than the format's (at least 1) gets a
// client of its own. It returns the events and fills cfg's fields.
func upgradeEvents(seed uint64, cfg *Config) []Event {
	u := rand.New(rand.NewPCG(seed, 0x75706772))
	if u.IntN(4) != 0 {
		return nil
	}
	at := func(from, to int) time.Duration {
		return cfg.Faults*time.Duration(from)/100 + time.Duration(u.Int64N(int64(cfg.Faults*time.Duration(to-from)/100)))
	}
	old := u.Perm(cfg.Nodes)[:1+u.IntN(cfg.Nodes)]
	cfg.OldNodes = slices.Sorted(slices.Values(old))
	cfg.UpgradeCopies = max(1, cfg.Copies-1)
	events := []Event{{At: at(2, 10), Kind: Finalize}}
	for _, n := range old {
		events = append(events, Event{At: at(10, 50), Kind: Upgrade, Node: n, CatchUp: []time.Duration{0, 50 * time.Millisecond, 300 * time.Millisecond, time.Second}[u.IntN(4)]})
	}
	return append(events, Event{At: at(55, 70), Kind: Finalize})
}

// upgrade describes the rolling upgrade for the step log.
func (c Config) upgrade() string {
	if len(c.OldNodes) == 0 {
		return ""
	}
	var ids []string
	for _, n := range c.OldNodes {
		ids = append(ids, fmt.Sprintf("n%d", n))
	}
	return fmt.Sprintf("; %s on an older herd (feature level %d) until upgraded, then finalize-upgrade", strings.Join(ids, ","), cluster.LevelBase)
}
