package sim

// The trust state machine in the simulator: a CA rotation and a gossip
// key rotation while clients write and nodes are killed and paused.
//
// The simulator has no TLS and no gossip, so it does not run server/
// trust.go or memberlist. What it runs for real is the log: the rotation
// records (cluster/carotation.go, cluster/gossipkeys.go), committed
// through cluster.Local and applied by each node's own FSM
// (cluster.LocalMember), each node deciding by its own applied prefix
// which certificates it lets in (State.peerAllowed, through
// LocalMember.PeerAllowedUnder, as Credentials.AllowedUnder does). What
// it models is each node's side, derived from the log it applied as
// server/trust.go's followRotation and cluster's syncGossipKeys derive
// it: the CAs it trusts, the certificate serials it holds from each (got
// from the new CA's holder, which must be reachable, and recorded in the
// log), its gossip keyring (fetched from a reachable member, reported,
// switched, pruned), and a started process's refresh from a member (its
// gossip keyring, and the new CA it trusts: RefreshGossipKeys,
// learnCAs). Every request between two nodes is a handshake of the
// model (handshake): each side shows the certificate server/trust.go
// shows and verifies the other's against the CAs it trusts and its log;
// a refused handshake between two admitted nodes is a violation.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/pki"
)

// trustTurn is how often a node's model follows its log (trustLoop's
// and gossipKeyLoop's turns, shortened: the simulation only gets denser).
const trustTurn = 100 * time.Millisecond

// trustWorld is every node's trust and the handshakes made with it.
type trustWorld struct {
	w        *World
	first    string // the first CA's fingerprint (the log names it "")
	firstKey string // the first gossip key's id (the log names it "")

	mu     sync.Mutex // guards the fields below and every nodeTrust
	nodes  map[string]*nodeTrust
	nameMu sync.Mutex        // guards cas and keys (taken after mu, if both)
	cas    map[string]string // CA fingerprint to its name in the step log
	keys   map[string]string // gossip key id to its name in the step log
	// handshakes counts the handshakes that succeeded, by the CAs of
	// the certificates the two sides presented ("old>new": the dialer's
	// from the old CA, the server's from the new one).
	handshakes map[string]int
	refused    []string
	serial     int
}

// nodeTrust is what a node trusts and holds: on its disk, so a restart
// keeps it.
type nodeTrust struct {
	id      string
	current string            // the CA it trusts as the cluster's
	next    string            // during a rotation: the new one ("": none)
	certs   map[string]string // the serial of its certificate from each CA
	keys    []string          // its gossip keyring: key ids, the one it encrypts with first
	// started is the process whose start (its refresh from a member)
	// was handled; halted says why the node stopped, if it did.
	started *process
	halted  string
	// starting: the node is starting a rotation (its new CA trusted,
	// its new key in its keyring, the log's start not applied here
	// yet), as creatingCA and GossipKeys.pending: its turns leave them.
	starting bool
}

func (n *nodeTrust) trusted() []string {
	if n.next == "" {
		return []string{n.current}
	}
	return []string{n.current, n.next}
}

func (n *nodeTrust) trusts(ca string) bool { return ca == n.current || (ca != "" && ca == n.next) }

func (n *nodeTrust) holdsKey(id string) bool { return slices.Contains(n.keys, id) }

// newTrustWorld raises w's cluster to LevelSecurity with every node
// admitted under a certificate of the first CA, each node's keyring the
// first gossip key, and starts following the log on every process.
// Call it after World.start.
func newTrustWorld(w *World) (*trustWorld, error) {
	ca, err := pki.NewCA("sim first CA")
	if err != nil {
		return nil, err
	}
	tw := &trustWorld{w: w, first: ca.Fingerprint(), nodes: map[string]*nodeTrust{}, cas: map[string]string{}, keys: map[string]string{}, handshakes: map[string]int{}}
	tw.cas[tw.first] = "CA0"
	firstKey := newKeyID()
	tw.firstKey = firstKey
	tw.keys[firstKey] = "K0"
	admitted := map[string]string{}
	for _, n := range w.nodes {
		nt := &nodeTrust{id: n.id, current: tw.first, certs: map[string]string{}, keys: []string{firstKey}}
		nt.certs[tw.first] = tw.newSerial()
		admitted[n.id] = nt.certs[tw.first]
		tw.nodes[n.id] = nt
	}
	if _, err := w.log.FinalizeSecurity(admitted); err != nil {
		return nil, err
	}
	if err := w.waitApplied(time.Minute); err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.trust = tw
	w.mu.Unlock()
	w.wg.Add(1)
	go tw.run()
	return tw, nil
}

func newKeyID() string {
	key := make([]byte, 32)
	rand.Read(key)
	return cluster.GossipKeyID(key)
}

func (tw *trustWorld) newSerial() string {
	tw.serial++
	return fmt.Sprintf("%032x", tw.serial)
}

// caName is a CA's name in the step log.
func (tw *trustWorld) caName(fingerprint string) string {
	tw.nameMu.Lock()
	defer tw.nameMu.Unlock()
	if name, ok := tw.cas[fingerprint]; ok {
		return name
	}
	return "CA?" + fingerprint[:min(8, len(fingerprint))]
}

// keyName is a gossip key's name in the step log.
func (tw *trustWorld) keyName(id string) string {
	tw.nameMu.Lock()
	defer tw.nameMu.Unlock()
	if name, ok := tw.keys[id]; ok {
		return name
	}
	return "K?" + id[:min(8, len(id))]
}

func (tw *trustWorld) caNames(list []string) string  { return names(list, tw.caName) }
func (tw *trustWorld) keyNames(list []string) string { return names(list, tw.keyName) }

func names(list []string, name func(string) string) string {
	var out []string
	for _, v := range list {
		out = append(out, name(v))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// logTrusted are the CAs the log trusts: the cluster's, and during a
// rotation the new one.
func (tw *trustWorld) logTrusted(s cluster.CAState) []string {
	out := []string{s.Fingerprint}
	if out[0] == "" {
		out[0] = tw.first
	}
	if s.Rotation != nil {
		out = append(out, s.Rotation.Fingerprint)
	}
	return out
}

// run gives every running process its turns until the world ends: one
// goroutine per process, as each process runs its own loops.
func (tw *trustWorld) run() {
	defer tw.w.wg.Done()
	ticker := time.NewTicker(trustTurn)
	defer ticker.Stop()
	for {
		select {
		case <-tw.w.ctx.Done():
			return
		case <-ticker.C:
		}
		w := tw.w
		var start []*process
		w.mu.Lock()
		for _, n := range w.nodes {
			if p := n.proc; p != nil && !p.dead && !n.paused {
				tw.mu.Lock()
				if nt := tw.nodes[n.id]; nt.started != p && nt.halted == "" {
					nt.started = p
					start = append(start, p)
				}
				tw.mu.Unlock()
			}
		}
		w.mu.Unlock()
		for _, p := range start {
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				tw.process(p)
			}()
		}
		// The leader's turn of gossipKeyLoop: the next phase when due.
		if tw.majority() {
			if step, err := w.log.AdvanceGossipKeyRotation(); err != nil {
				w.note("log: gossip key rotation: %s refused: %v", step, err)
			} else if step != "" {
				w.note("log: gossip key rotation: %s", step)
			}
		}
	}
}

// majority says whether the leader's side exists (some node reaches the
// majority).
func (tw *trustWorld) majority() bool {
	w := tw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.nodes {
		if n.reachable {
			return true
		}
	}
	return false
}

// process runs p's turns until it dies: first its refresh from a member
// (at the start of a process), then followCA and followGossip, every
// trustTurn while it is not paused.
func (tw *trustWorld) process(p *process) {
	nt := tw.node(p.node.id)
	refreshed := false
	ticker := time.NewTicker(trustTurn)
	defer ticker.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-ticker.C:
		}
		tw.w.mu.Lock()
		paused := p.node.paused
		tw.w.mu.Unlock()
		if paused {
			continue
		}
		tw.mu.Lock()
		halted := nt.halted != ""
		tw.mu.Unlock()
		if halted {
			return
		}
		// At its start, and whenever gossip leaves it alone (a member
		// cannot read what it sends, or it cannot read the members'),
		// a node asks a member for its keys (and learns its CAs).
		if !refreshed || tw.leftAlone(p) {
			refreshed = tw.refresh(p)
		}
		ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		tw.followCA(ctx, p)
		tw.followGossip(ctx, p)
		cancel()
	}
}

func (tw *trustWorld) node(id string) *nodeTrust {
	tw.mu.Lock()
	defer tw.mu.Unlock()
	return tw.nodes[id]
}

// reachable says whether a request from p could reach node id's process
// now (both run, neither is paused, no partition between them), and
// returns that process.
func (tw *trustWorld) reachable(p *process, id string) (*process, bool) {
	w := tw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	to := w.index(id)
	if to < 0 || p.dead || p.node.paused {
		return nil, false
	}
	target := w.nodes[to]
	if target.killed || target.paused || target.proc.dead || w.cut[p.node.index] != w.cut[to] {
		return nil, false
	}
	return target.proc, true
}

// members are the other nodes (the simulation removes none).
func (tw *trustWorld) members(p *process) []string {
	var out []string
	for _, n := range tw.w.nodes {
		if n.id != p.node.id {
			out = append(out, n.id)
		}
	}
	return out
}

// refresh is a started process's question to a member over mTLS (the
// secrets protocol): its gossip keyring (RefreshGossipKeys) and the CAs
// it trusts (learnCAs). It reports whether a member answered.
func (tw *trustWorld) refresh(p *process) bool {
	self := p.node.id
	for _, id := range tw.members(p) {
		target, ok := tw.reachable(p, id)
		if !ok || tw.handshake(p, target) != nil {
			continue
		}
		tw.mu.Lock()
		nt, member := tw.nodes[self], tw.nodes[id]
		before := nt.keys[0]
		held := nt.holdsKey(member.keys[0])
		readable := member.holdsKey(nt.keys[0])
		for _, key := range member.keys {
			if !nt.holdsKey(key) {
				nt.keys = append(nt.keys, key)
			}
		}
		if !held || !readable {
			nt.use(member.keys[0])
		}
		if nt.next == "" && member.next != "" && member.current == nt.current {
			nt.next = member.next // learnCAs
		}
		after := nt.keys[0]
		keys, trusted := tw.keyNames(nt.keys), tw.caNames(nt.trusted())
		tw.mu.Unlock()
		if before != after {
			tw.w.note("%s: asked %s for the gossip keys: encrypts with %s now (keyring %s; trusts %s)", self, id, tw.keyName(after), keys, trusted)
		}
		return true
	}
	return false
}

// use makes key the keyring's first.
func (n *nodeTrust) use(key string) {
	i := slices.Index(n.keys, key)
	if i <= 0 {
		return
	}
	n.keys = append([]string{key}, slices.Delete(slices.Clone(n.keys), i, i+1)...)
}

// leftAlone says whether gossip leaves p alone: some member it reaches
// cannot read what it sends, or sends what it cannot read.
func (tw *trustWorld) leftAlone(p *process) bool {
	for _, id := range tw.members(p) {
		if _, ok := tw.reachable(p, id); !ok {
			continue
		}
		tw.mu.Lock()
		nt, member := tw.nodes[p.node.id], tw.nodes[id]
		alone := !member.holdsKey(nt.keys[0]) || !nt.holdsKey(member.keys[0])
		tw.mu.Unlock()
		if alone {
			return true
		}
	}
	return false
}

// followCA is one turn of server/trust.go's followRotation on the log p
// applied.
func (tw *trustWorld) followCA(ctx context.Context, p *process) {
	self := p.node.id
	m := p.member
	state := m.CA()
	tw.mu.Lock()
	nt := tw.nodes[self]
	current, next, nextCert := nt.current, nt.next, ""
	if next != "" {
		nextCert = nt.certs[next]
	}
	tw.mu.Unlock()
	switch r := state.Rotation; {
	case r != nil:
		if next != r.Fingerprint {
			tw.mu.Lock()
			nt.next, nextCert = r.Fingerprint, nt.certs[r.Fingerprint]
			tw.mu.Unlock()
			tw.w.note("%s: trusts the new CA %s", self, tw.caName(r.Fingerprint))
		}
		if nextCert == "" {
			// The holder of the new CA's key signs it, for this node
			// only, over the peer port.
			holder, ok := tw.reachable(p, r.Holder)
			if r.Holder != self && (!ok || tw.handshake(p, holder) != nil) {
				return
			}
			tw.mu.Lock()
			if h := tw.nodes[r.Holder]; h.next != r.Fingerprint {
				tw.mu.Unlock()
				return // the holder has not applied its own start yet
			}
			nextCert = tw.newSerial()
			nt.certs[r.Fingerprint] = nextCert
			tw.mu.Unlock()
			tw.w.note("%s: got its certificate from the new CA %s (serial %s) from %s", self, tw.caName(r.Fingerprint), nextCert, r.Holder)
		}
		if r.Certificates[self] != nextCert {
			if err := m.RecordCACertificate(ctx, r.Fingerprint, nextCert); err == nil {
				tw.w.note("%s: recorded its certificate from the new CA", self)
			}
		}
	case state.Fingerprint != "" && state.Fingerprint != current:
		if err := tw.sync(ctx, p); err != nil {
			return // the leader's word only
		}
		if state = m.CA(); state.Rotation != nil || state.Fingerprint == current {
			return
		}
		tw.mu.Lock()
		if nt.next != state.Fingerprint || nt.certs[state.Fingerprint] == "" {
			nt.halted = fmt.Sprintf("the cluster's CA is now %s and %s has no certificate from it", tw.caName(state.Fingerprint), self)
			why := nt.halted
			tw.mu.Unlock()
			tw.w.note("%s: stops: %s", self, why)
			return
		}
		delete(nt.certs, nt.current)
		nt.current, nt.next = nt.next, ""
		tw.mu.Unlock()
		tw.w.note("%s: the new CA %s is the cluster's; trusts it alone", self, tw.caName(state.Fingerprint))
	case next != "":
		if err := tw.sync(ctx, p); err != nil {
			return
		}
		if m.CA().Rotation != nil {
			return
		}
		tw.mu.Lock()
		if nt.starting {
			tw.mu.Unlock()
			return
		}
		delete(nt.certs, nt.next)
		nt.next = ""
		tw.mu.Unlock()
		tw.w.note("%s: dropped the new CA (cancelled)", self)
	}
}

// followGossip is one turn of cluster's syncGossipKeys on the log p
// applied (the fetches go to reachable members that hold the key).
func (tw *trustWorld) followGossip(ctx context.Context, p *process) {
	self := p.node.id
	m := p.member
	ring := m.GossipKeyState()
	r := ring.Rotation
	tw.mu.Lock()
	nt := tw.nodes[self]
	primary, count := nt.keys[0], len(nt.keys)
	tw.mu.Unlock()
	want := ring.Primary
	if want == "" {
		want = tw.firstKey
	}
	if r == nil {
		if primary == want && count == 1 {
			return
		}
		if err := tw.sync(ctx, p); err != nil {
			return
		}
		if ring = m.GossipKeyState(); ring.Rotation != nil {
			return
		}
		if want = ring.Primary; want == "" {
			want = tw.firstKey
		}
		if primary != want && !tw.fetchKey(p, want, "") {
			return
		}
		tw.mu.Lock()
		if nt.starting {
			tw.mu.Unlock()
			return
		}
		nt.use(want)
		nt.keys = nt.keys[:1]
		tw.mu.Unlock()
		tw.w.note("%s: encrypts gossip with %s alone", self, tw.keyName(want))
		return
	}
	if _, member := m.Node(self); !member {
		return
	}
	if !tw.fetchKey(p, r.Key, r.Holder) {
		return
	}
	if !slices.Contains(r.Installed, self) {
		if err := m.ReportGossipKey(ctx, r.Key, false); err == nil {
			tw.w.note("%s: installed gossip key %s", self, tw.keyName(r.Key))
		}
	}
	if r.Phase == cluster.GossipKeyUse {
		tw.mu.Lock()
		nt.use(r.Key)
		tw.mu.Unlock()
		if !slices.Contains(r.Using, self) {
			if err := m.ReportGossipKey(ctx, r.Key, true); err == nil {
				tw.w.note("%s: encrypts gossip with %s", self, tw.keyName(r.Key))
			}
		}
	}
}

// fetchKey makes sure p's node holds key: held already, or fetched from a
// reachable member that holds it (first first).
func (tw *trustWorld) fetchKey(p *process, key, first string) bool {
	tw.mu.Lock()
	held := tw.nodes[p.node.id].holdsKey(key)
	tw.mu.Unlock()
	if held {
		return true
	}
	ids := tw.members(p)
	if first != "" && first != p.node.id {
		ids = append([]string{first}, slices.DeleteFunc(ids, func(id string) bool { return id == first })...)
	}
	for _, id := range ids {
		target, ok := tw.reachable(p, id)
		if !ok || tw.handshake(p, target) != nil {
			continue
		}
		tw.mu.Lock()
		if tw.nodes[id].holdsKey(key) {
			nt := tw.nodes[p.node.id]
			nt.keys = append(nt.keys, key)
			tw.mu.Unlock()
			return true
		}
		tw.mu.Unlock()
	}
	return false
}

// rotateGossipKey is `herd cluster rotate-gossip-key` on holder: a new key
// in its keyring, then the start in the log, which the holder applies
// before the command returns (Cluster.RotateGossipKey). A start the log
// refuses leaves the key out again.
func (tw *trustWorld) rotateGossipKey(holder, name string) error {
	key := newKeyID()
	tw.mu.Lock()
	tw.nameMu.Lock()
	tw.keys[key] = name
	tw.nameMu.Unlock()
	nt := tw.nodes[holder]
	nt.keys = append(nt.keys, key)
	nt.starting = true
	tw.mu.Unlock()
	err := tw.w.log.StartGossipKeyRotation(key, holder)
	if err == nil {
		err = tw.applied(holder)
	}
	tw.mu.Lock()
	nt.starting = false
	if err != nil {
		nt.keys = slices.DeleteFunc(nt.keys, func(k string) bool { return k == key })
	}
	tw.mu.Unlock()
	return err
}

// rotateCA is `herd cluster rotate-ca` on holder: a new CA, its key kept
// there and trusted there at once, then the start in the log, which the
// holder applies before the command returns. A start the log refuses
// leaves the holder's trust as it was.
func (tw *trustWorld) rotateCA(holder, name string) error {
	ca, err := pki.NewCA("sim " + name)
	if err != nil {
		return err
	}
	tw.mu.Lock()
	tw.nameMu.Lock()
	tw.cas[ca.Fingerprint()] = name
	tw.nameMu.Unlock()
	nt := tw.nodes[holder]
	before := nt.next
	nt.next, nt.starting = ca.Fingerprint(), true
	tw.mu.Unlock()
	_, err = tw.w.log.StartCARotation(ca.CertPEM, holder)
	if err == nil {
		err = tw.applied(holder)
	}
	tw.mu.Lock()
	nt.starting = false
	if err != nil {
		nt.next = before
	}
	tw.mu.Unlock()
	return err
}

// applied waits until node id's process applied the whole log, as a
// proposer's Cluster.propose waits for its own FSM.
func (tw *trustWorld) applied(id string) error {
	w := tw.w
	w.mu.Lock()
	p := w.nodes[w.index(id)].proc
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	return p.member.Sync(ctx)
}

// errHandshake is a handshake the trust model refuses.
var errHandshake = errors.New("TLS handshake refused")

// handshake is the peer port's handshake of a request from `from` to
// `to`'s process, as server/trust.go and peer make it: the dialer names
// the newest CA it trusts, the server shows its certificate from that CA
// if it holds one (else its one from the CA it trusts as the cluster's,
// else any); the dialer presents the newest of its certificates whose
// CA the server trusts. Each side verifies the other's against the CAs
// it trusts and its log (PeerAllowedUnder, with allowedUnder's leniency
// for a CA learnt from a member before the log names it).
func (tw *trustWorld) handshake(from, to *process) error {
	tw.mu.Lock()
	d, s := tw.nodes[from.node.id], tw.nodes[to.node.id]
	hint := d.current
	if d.next != "" {
		hint = d.next
	}
	shown := ""
	switch {
	case s.certs[hint] != "" && s.trusts(hint):
		shown = hint
	case s.certs[s.current] != "":
		shown = s.current
	default:
		for _, ca := range s.trusted() {
			if s.certs[ca] != "" {
				shown = ca
			}
		}
	}
	presented := ""
	for _, ca := range []string{d.next, d.current} {
		if ca != "" && d.certs[ca] != "" && s.trusts(ca) {
			presented = ca
			break
		}
	}
	dialerTrusts, serverSerial, dialerSerial := d.trusted(), s.certs[shown], d.certs[presented]
	dialerNext, serverNext := d.next, s.next
	tw.mu.Unlock()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s to %s: %s", errHandshake, from.node.id, to.node.id, fmt.Sprintf(format, args...))
	}
	if shown == "" || !slices.Contains(dialerTrusts, shown) {
		return fail("the server's certificate is from %s, the dialer trusts %s", tw.caName(shown), tw.caNames(dialerTrusts))
	}
	if err := allowedBy(from.member, dialerNext, to.node.id, serverSerial, shown); err != nil {
		return fail("the dialer refuses the server: %v", err)
	}
	if presented == "" {
		return fail("the dialer holds no certificate from a CA the server trusts")
	}
	if err := allowedBy(to.member, serverNext, from.node.id, dialerSerial, presented); err != nil {
		return fail("the server refuses the dialer: %v", err)
	}
	tw.mu.Lock()
	tw.handshakes[tw.caName(presented)+">"+tw.caName(shown)]++
	tw.mu.Unlock()
	return nil
}

// allowedBy is server's credentials.allowedBy on member m, for a node
// that trusts next as the new CA.
func allowedBy(m *cluster.LocalMember, next, id, serial, ca string) error {
	err := m.PeerAllowedUnder(id, serial, ca)
	if err != nil && next != "" && ca == next {
		if r := m.CA().Rotation; r == nil || r.Fingerprint != ca {
			return m.PeerAdmitted(id)
		}
	}
	return err
}

// checkTrust is the step's check of the trust: every node that runs,
// reaches the leader and applied the whole log trusts exactly the CAs
// the log does, holds a certificate from each, and holds the keys the
// log's phase says; any two such nodes alive in the log read each
// other's gossip. Nodes not caught up are checked once they are. It
// returns the problems and how many nodes it checked.
func (tw *trustWorld) checkTrust() (problems []string, checked int) {
	w := tw.w
	length := w.log.Len()
	logCA := w.log.CA()
	ring := w.log.GossipKeyState()
	want := tw.logTrusted(logCA)
	var ready []*process
	w.mu.Lock()
	for _, n := range w.nodes {
		if p := n.proc; !n.killed && !n.paused && n.reachable && p.member.Applied() == length {
			if logged, ok := w.log.Node(n.id); ok && logged.State == cluster.NodeAlive && logged.Incarnation == p.incarnation {
				ready = append(ready, p)
			}
		}
	}
	w.mu.Unlock()
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for _, p := range ready {
		nt := tw.nodes[p.node.id]
		checked++
		if nt.halted != "" {
			problems = append(problems, fmt.Sprintf("%s stopped: %s", nt.id, nt.halted))
			continue
		}
		if got := nt.trusted(); !slices.Equal(got, want) {
			problems = append(problems, fmt.Sprintf("%s trusts %s, the log %s", nt.id, tw.caNames(got), tw.caNames(want)))
		}
		if nt.certs[nt.current] == "" {
			problems = append(problems, fmt.Sprintf("%s holds no certificate from %s", nt.id, tw.caName(nt.current)))
		}
		if r := ring.Rotation; r != nil {
			if slices.Contains(r.Installed, nt.id) && !nt.holdsKey(r.Key) {
				problems = append(problems, fmt.Sprintf("%s reported gossip key %s installed but does not hold it (%s)", nt.id, tw.keyName(r.Key), tw.keyNames(nt.keys)))
			}
			if slices.Contains(r.Using, nt.id) && nt.keys[0] != r.Key {
				problems = append(problems, fmt.Sprintf("%s reported it encrypts with %s but encrypts with %s", nt.id, tw.keyName(r.Key), tw.keyName(nt.keys[0])))
			}
		}
		for _, q := range ready {
			other := tw.nodes[q.node.id]
			if other != nt && !other.holdsKey(nt.keys[0]) {
				problems = append(problems, fmt.Sprintf("%s encrypts gossip with %s, which %s, alive, cannot read (its keyring %s)", nt.id, tw.keyName(nt.keys[0]), other.id, tw.keyNames(other.keys)))
			}
		}
	}
	return problems, checked
}

// settled says whether every node trusts what the log does and holds
// the log's gossip key alone (the end of both rotations everywhere).
func (tw *trustWorld) settled() (bool, string) {
	logCA := tw.w.log.CA()
	want := tw.logTrusted(logCA)
	primary := tw.w.log.GossipKeyState().Primary
	if primary == "" {
		primary = tw.firstKey
	}
	tw.mu.Lock()
	defer tw.mu.Unlock()
	for _, n := range tw.w.nodes {
		nt := tw.nodes[n.id]
		if got := nt.trusted(); !slices.Equal(got, want) {
			return false, fmt.Sprintf("%s trusts %s, the log %s", nt.id, tw.caNames(got), tw.caNames(want))
		}
		if !slices.Equal(nt.keys, []string{primary}) {
			return false, fmt.Sprintf("%s holds gossip keys %s, the log %s", nt.id, tw.keyNames(nt.keys), tw.keyName(primary))
		}
	}
	return true, ""
}

// trustModel is the world's trust model, nil when it has none.
func (w *World) trustModel() *trustWorld {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.trust
}

// sync is Cluster.Sync for p: the leader's commit index, applied. A node
// the log has gone (or an earlier process of) is out of raft's
// configuration (voters.go takes dead servers out) and gets no entries
// until the leader sees it alive again, through gossip: until then it
// cannot sync.
func (tw *trustWorld) sync(ctx context.Context, p *process) error {
	if logged, ok := tw.w.log.Node(p.node.id); !ok || logged.State != cluster.NodeAlive || logged.Incarnation != p.incarnation {
		return fmt.Errorf("%w: %s is not in raft's configuration", cluster.ErrNoQuorum, p.node.id)
	}
	return p.member.Sync(ctx)
}

// gossipSees says whether gossip lets n in: every other node alive in the
// log that runs reads the key n's process sends with, and n reads each
// one's (memberlist drops what it cannot decrypt). The failure detector
// takes a node back only then. Called with w.mu held.
func (tw *trustWorld) gossipSees(n *node) bool {
	w := tw.w
	tw.mu.Lock()
	defer tw.mu.Unlock()
	nt := tw.nodes[n.id]
	for _, m := range w.nodes {
		if m == n || m.killed || m.paused || w.cut[m.index] != w.cut[n.index] {
			continue
		}
		if logged, ok := w.log.Node(m.id); !ok || logged.State != cluster.NodeAlive {
			continue
		}
		other := tw.nodes[m.id]
		if !other.holdsKey(nt.keys[0]) || !nt.holdsKey(other.keys[0]) {
			return false
		}
	}
	return true
}
