package sim

// The network of the simulator's raft mode (raftworld.go): raft's RPCs
// (a raft.Transport of the simulator's own), memberlist's packets and
// streams (a memberlist.Transport) and the forwarded requests of the
// peer port (cluster.SimConfig.Forward), between the processes of the
// simulated nodes, on the bubble's fake clock, with the faults in force:
//
//   - a message to a node whose process is down is refused at once
//     (connection refused), and a process that died sends nothing more;
//   - raft's RPCs and forwarded requests travel over TCP: across a
//     partition, or to or from a paused process, they wait until it ends
//     (TCP retransmits), up to the sender's timeout (raft's transport
//     times out after 10 s); so a heartbeat sent before a node was paused
//     is delivered when it resumes, as one held in its socket is;
//   - gossip's packets are UDP: a partition loses them, a pause holds
//     them (the paused node's socket buffer, its own sends);
//   - drops reset a connection (the RPC fails) or lose a packet, delays
//     hold each direction of a message apart, so concurrent messages
//     are reordered.
//
// A message's fate is drawn from a hash of the seed, the message's
// sender, receiver and kind, and the fake time, not from a shared
// stream. Gossip's streams (push/pull, fallback probes) are net.Pipe
// pairs: their connection waits as a TCP connect does, and once open
// they are not cut by a later partition (they last a moment).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/herd-storage/herd/internal/cluster"
)

// raftTimeout is raft's network transport timeout in herd (cluster/raft.go).
const raftTimeout = 10 * time.Second

var errRefused = errors.New("connection refused")

// simNet is the network of one raft-mode run.
type simNet struct {
	seed    uint64
	started time.Time
	closed  chan struct{} // the run is over: every held message gives up

	mu           sync.Mutex
	changed      chan struct{}       // closed and replaced at every change below
	hosts        map[string]*netHost // by IP
	dropPerMille int
	delayMax     time.Duration
	sent         map[string]uint64 // messages sent per sender, receiver and kind (fates)
}

// netHost is a node's machine: its address, whether its process is
// paused, its partition group and its current process.
type netHost struct {
	ip     string
	paused bool
	group  int
	proc   *netProc // nil while no process runs
}

// netProc is one process of a node: its endpoints.
type netProc struct {
	host   *netHost
	dead   bool          // guarded by simNet.mu
	done   chan struct{} // closed when it dies
	raft   *simRaftTransport
	gossip *simGossipTransport
	node   *cluster.Cluster // set once started; guarded by simNet.mu
}

func newSimNet(seed uint64) *simNet {
	return &simNet{seed: seed, started: time.Now(), closed: make(chan struct{}), changed: make(chan struct{}), hosts: map[string]*netHost{}, sent: map[string]uint64{}}
}

func (n *simNet) notify() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// newProc gives host ip a new process with its endpoints.
func (n *simNet) newProc(ip string) *netProc {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.hosts[ip]
	if h == nil {
		h = &netHost{ip: ip}
		n.hosts[ip] = h
	}
	p := &netProc{host: h, done: make(chan struct{})}
	p.raft = &simRaftTransport{net: n, proc: p, addr: raft.ServerAddress(net.JoinHostPort(ip, strconv.Itoa(cluster.SimRaftPort))), consumer: make(chan raft.RPC, 64)}
	p.gossip = &simGossipTransport{net: n, proc: p, packets: make(chan *memberlist.Packet, 1024), streams: make(chan net.Conn, 64)}
	h.proc = p
	n.notify()
	return p
}

// kill ends a process's network: nothing more comes in or goes out.
func (n *simNet) kill(p *netProc) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p.dead {
		return
	}
	p.dead = true
	close(p.done)
	if p.host.proc == p {
		p.host.proc = nil
	}
	n.notify()
}

func (n *simNet) setPaused(ip string, paused bool) {
	n.mu.Lock()
	n.hosts[ip].paused = paused
	n.notify()
	n.mu.Unlock()
}

// partition puts each host in the group of its index in groups (0: the
// rest); nil heals.
func (n *simNet) partition(groups map[string]int) {
	n.mu.Lock()
	for ip, h := range n.hosts {
		h.group = groups[ip]
	}
	n.notify()
	n.mu.Unlock()
}

func (n *simNet) setFaults(dropPerMille int, delayMax time.Duration) {
	n.mu.Lock()
	n.dropPerMille, n.delayMax = dropPerMille, delayMax
	n.mu.Unlock()
}

func (n *simNet) close() {
	close(n.closed)
}

// fate draws what the network does to one message and its answer.
func (n *simNet) fate(from, to, kind string) fate {
	n.mu.Lock()
	drop, delay := n.dropPerMille, n.delayMax
	key := from + ">" + to + " " + kind
	n.sent[key]++
	count := n.sent[key]
	n.mu.Unlock()
	var f fate
	if drop == 0 && delay == 0 {
		return f
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s %d %d", key, count, time.Since(n.started)/time.Millisecond)
	r := newSplitMix(h.Sum64() ^ n.seed)
	f.dropRequest = int(r.next()%1000) < drop
	f.dropAnswer = int(r.next()%1000) < drop
	if delay > 0 {
		f.delayRequest = time.Duration(r.next() % uint64(delay))
		f.delayAnswer = time.Duration(r.next() % uint64(delay))
	}
	return f
}

// link waits until a message can go from process from to host to: both
// hosts run, neither is paused, no partition separates them. It returns
// the receiving process. With hold false (UDP) a partition loses the
// message at once. It fails when from has died (unless from is nil: an
// answer already sent), the receiver has no process (refused), or stop
// ends.
func (n *simNet) link(from *netProc, fromHost *netHost, to string, hold bool, stop <-chan struct{}) (*netProc, error) {
	for {
		n.mu.Lock()
		if from != nil && from.dead {
			n.mu.Unlock()
			return nil, errors.New("this process has died")
		}
		target := n.hosts[to]
		if target == nil || target.proc == nil {
			n.mu.Unlock()
			return nil, fmt.Errorf("%s: %w", to, errRefused)
		}
		cut := fromHost.group != target.group
		if !fromHost.paused && !target.paused && !cut {
			p := target.proc
			n.mu.Unlock()
			return p, nil
		}
		if cut && !hold {
			n.mu.Unlock()
			return nil, errors.New("lost across the partition")
		}
		changed := n.changed
		n.mu.Unlock()
		select {
		case <-changed:
		case <-stop:
			return nil, errors.New("timed out")
		case <-n.closed:
			return nil, errors.New("the simulation is over")
		}
	}
}

// wait sleeps d of fake time, or fails when stop ends first.
func (n *simNet) wait(d time.Duration, stop <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-stop:
		return errors.New("timed out")
	case <-n.closed:
		return errors.New("the simulation is over")
	}
}

func hostOf(address string) string {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return address
	}
	return host
}

// exchange carries one request from process from to host to and its
// answer back: serve runs on the receiving process and returns the
// answer (or fails: a reset connection). stop ends the wait (the
// sender's timeout or context).
func (n *simNet) exchange(from *netProc, to, kind string, stop <-chan struct{}, serve func(p *netProc, stop <-chan struct{}) error) error {
	f := n.fate(from.host.ip, to, kind)
	if err := n.wait(f.delayRequest, stop); err != nil {
		return err
	}
	p, err := n.link(from, from.host, to, true, stop)
	if err != nil {
		return err
	}
	if f.dropRequest {
		return errors.New("connection reset by peer")
	}
	if err := serve(p, stop); err != nil {
		return err
	}
	if f.dropAnswer {
		return errors.New("connection reset by peer")
	}
	if err := n.wait(f.delayAnswer, stop); err != nil {
		return err
	}
	// The answer is on the wire: it arrives once the path is open, even
	// if its sender died meanwhile.
	if _, err := n.link(nil, p.host, from.host.ip, true, stop); err != nil && !errors.Is(err, errRefused) {
		return err
	}
	select {
	case <-from.done:
		return errors.New("this process has died")
	default:
	}
	return nil
}

// stopAfter returns a channel closed after d or when any of the others
// is, and its cancel.
func stopAfter(d time.Duration, others ...<-chan struct{}) (<-chan struct{}, func()) {
	stop := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(stop) }) }
	timer := time.AfterFunc(d, end)
	quit := make(chan struct{})
	for _, o := range others {
		go func() {
			select {
			case <-o:
				end()
			case <-quit:
			case <-stop:
			}
		}()
	}
	return stop, func() {
		timer.Stop()
		close(quit)
		end()
	}
}

// contextUntil returns a context that ends after d or when any of the
// channels is closed.
func contextUntil(d time.Duration, ends ...<-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	for _, end := range ends {
		go func() {
			select {
			case <-end:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, cancel
}

// simRaftTransport is a process's raft transport over simNet.
type simRaftTransport struct {
	net      *simNet
	proc     *netProc
	addr     raft.ServerAddress
	consumer chan raft.RPC
}

var _ cluster.SimRaftTransport = (*simRaftTransport)(nil)

func (t *simRaftTransport) Consumer() <-chan raft.RPC { return t.consumer }

func (t *simRaftTransport) LocalAddr() raft.ServerAddress { return t.addr }

func (t *simRaftTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (t *simRaftTransport) AppendEntries(_ raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	out, err := t.rpc(target, "append", args, nil, raftTimeout)
	if err == nil {
		*resp = *out.(*raft.AppendEntriesResponse)
	}
	return err
}

func (t *simRaftTransport) RequestVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	out, err := t.rpc(target, "vote", args, nil, raftTimeout)
	if err == nil {
		*resp = *out.(*raft.RequestVoteResponse)
	}
	return err
}

func (t *simRaftTransport) RequestPreVote(_ raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	out, err := t.rpc(target, "prevote", args, nil, raftTimeout)
	if err == nil {
		*resp = *out.(*raft.RequestPreVoteResponse)
	}
	return err
}

func (t *simRaftTransport) InstallSnapshot(_ raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	out, err := t.rpc(target, "snapshot", args, data, 10*raftTimeout)
	if err == nil {
		*resp = *out.(*raft.InstallSnapshotResponse)
	}
	return err
}

func (t *simRaftTransport) TimeoutNow(_ raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	out, err := t.rpc(target, "timeoutnow", args, nil, raftTimeout)
	if err == nil {
		*resp = *out.(*raft.TimeoutNowResponse)
	}
	return err
}

func (t *simRaftTransport) EncodePeer(_ raft.ServerID, p raft.ServerAddress) []byte { return []byte(p) }

func (t *simRaftTransport) DecodePeer(buf []byte) raft.ServerAddress { return raft.ServerAddress(buf) }

func (t *simRaftTransport) SetHeartbeatHandler(func(raft.RPC)) {}

func (t *simRaftTransport) Close() error { return nil }

// rpc sends args to target's raft and waits for its answer, as raft's
// network transport does: up to timeout.
func (t *simRaftTransport) rpc(target raft.ServerAddress, kind string, args any, data io.Reader, timeout time.Duration) (any, error) {
	stop, cancel := stopAfter(timeout, t.proc.done)
	defer cancel()
	var answer any
	err := t.net.exchange(t.proc, hostOf(string(target)), kind, stop, func(p *netProc, stop <-chan struct{}) error {
		respCh := make(chan raft.RPCResponse, 1)
		select {
		case p.raft.consumer <- raft.RPC{Command: args, Reader: data, RespChan: respCh}:
		case <-p.done:
			return errors.New("connection reset by peer")
		case <-stop:
			return errors.New("timed out")
		}
		select {
		case r := <-respCh:
			if r.Error != nil {
				return r.Error
			}
			answer = r.Response
			return nil
		case <-p.done:
			return errors.New("connection reset by peer")
		case <-stop:
			return errors.New("timed out")
		}
	})
	if err != nil {
		return nil, fmt.Errorf("sim raft %s to %s: %w", kind, target, err)
	}
	return answer, nil
}

// forwarder carries a process's forwarded requests to the leader's
// ProposeForwarded (cluster.SimConfig.Forward), as the peer port's
// forwarding connection does.
func (n *simNet) forwarder(from *netProc) func(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error) {
	return func(ctx context.Context, address string, command []byte) (json.RawMessage, uint64, error) {
		stop, cancel := stopAfter(time.Hour, ctx.Done(), from.done)
		defer cancel()
		var value json.RawMessage
		var index uint64
		var remote error
		err := n.exchange(from, hostOf(address), "forward", stop, func(p *netProc, stop <-chan struct{}) error {
			n.mu.Lock()
			leader := p.node
			n.mu.Unlock()
			if leader == nil {
				return errRefused
			}
			type result struct {
				value json.RawMessage
				index uint64
				err   error
			}
			done := make(chan result, 1)
			go func() {
				// The leader serves it with a context of its own, as
				// serveForwardConn does.
				ctx, cancel := contextUntil(5*time.Second, p.done, n.closed)
				defer cancel()
				value, index, err := leader.ProposeForwarded(ctx, command)
				done <- result{value, index, err}
			}()
			select {
			case r := <-done:
				value, index, remote = r.value, r.index, r.err
				return nil
			case <-p.done:
				return errors.New("connection reset by peer")
			case <-stop:
				return errors.New("timed out")
			}
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			return nil, 0, err
		}
		if remote != nil {
			return nil, 0, cluster.ErrorFromCode(cluster.ErrorCode(remote), remote.Error())
		}
		return value, index, nil
	}
}

// simGossipTransport is a process's memberlist transport over simNet.
type simGossipTransport struct {
	net     *simNet
	proc    *netProc
	packets chan *memberlist.Packet
	streams chan net.Conn
}

var _ memberlist.Transport = (*simGossipTransport)(nil)

func (t *simGossipTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return net.ParseIP(ip), port, nil
}

func (t *simGossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	to := hostOf(addr)
	f := t.net.fate(t.proc.host.ip, to, "udp")
	if f.dropRequest {
		return now, nil
	}
	buf := append([]byte(nil), b...)
	from := &net.UDPAddr{IP: net.ParseIP(t.proc.host.ip), Port: cluster.SimGossipPort}
	go func() {
		if t.net.wait(f.delayRequest, t.proc.done) != nil {
			return
		}
		p, err := t.net.link(t.proc, t.proc.host, to, false, t.proc.done)
		if err != nil {
			return
		}
		select {
		case p.gossip.packets <- &memberlist.Packet{Buf: buf, From: from, Timestamp: time.Now()}:
		default: // the socket buffer is full
		}
	}()
	return now, nil
}

func (t *simGossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *simGossipTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *simGossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	stop, cancel := stopAfter(timeout, t.proc.done)
	defer cancel()
	to := hostOf(addr)
	f := t.net.fate(t.proc.host.ip, to, "tcp")
	if err := t.net.wait(f.delayRequest, stop); err != nil {
		return nil, err
	}
	p, err := t.net.link(t.proc, t.proc.host, to, true, stop)
	if err != nil {
		return nil, err
	}
	if f.dropRequest {
		return nil, errors.New("connection reset by peer")
	}
	local, remote := net.Pipe()
	select {
	case p.gossip.streams <- remote:
		return local, nil
	case <-p.done:
	case <-stop:
	}
	local.Close()
	remote.Close()
	return nil, errRefused
}

func (t *simGossipTransport) Shutdown() error { return nil }
