// Package sim is a simulator of herd's data path, in the spirit of
// TigerBeetle's VOPR and FoundationDB's simulation: a whole cluster in one
// process, on a fake clock, driven by a schedule drawn from a seed, with
// invariants checked after every step. Any failure prints its seed, the
// step log, the nodes' last log lines and the command that replays it:
//
//	go test ./internal/sim -run TestSimulate -sim.seed=N -v
//
// # What is real
//
// Everything on the data path is the production code: per node a
// store.Store on its own directory (real files, headers, stamps, flushes),
// gateway.NewReplica, gateway.New (the gateway; clients use the NBD-facing
// export that gateway.Open returns) and gateway.NewRecovery (background and
// on-demand recovery, the proof of currency, surplus removal). The cluster
// log is cluster.Local: the real commands, encoded by the real encoder and
// applied by the real FSM, one member per node process, each applying a
// prefix of the log (cluster/local.go).
//
// # What is faked
//
//   - Raft and gossip. The log is the committed history; a member applies
//     it while its process runs and reaches the majority, lags while it is
//     paused or cut off, and says it has no quorum 3 s after losing the
//     majority (as Cluster.QuorumStatus). A node that returns (resumed,
//     healed, restarted) has contact with the leader at once, as a
//     heartbeat held in its socket across a pause gives it, but applies
//     the entries it missed only after a catch-up delay drawn from the
//     seed (0, 50 ms, 300 ms or 1 s: raft sends heartbeats apart from
//     entries, and backs off replication to a follower that failed), so
//     for that long it has contact and applies epochs the cluster left.
//     The failure detector is the leader's reconcile loop reduced to its
//     timing: a node the majority has not reached for 2.5-4.5 s (per
//     node, from the seed) is committed as gone, a node (or a new process
//     of it) reachable again for 0.8 s is committed as alive. Without a
//     majority nothing is committed.
//   - Leases (cluster/lease.go) are modelled by cluster.Local as the real
//     runtime has them, on the fake clock: a member renews every 500 ms,
//     and at once on a new epoch or a request without a lease, only while
//     it reaches the majority; its lease runs from the renewal's start
//     t0, once it applied the log up to the leader's commit index, until
//     t0 + 2 s. Writes in an epoch wait until every member whose lease
//     may still run reported the entry that began it (the leader's rule,
//     the same code), and the leader commits a node's leave only 2.5 s
//     after its last grant to it. The replica side is the real one
//     (replica.Replica: admission under a lease, the check after every
//     read, activation before writes).
//   - The network (transport.go): gateway.Replicas and recovery's Lister,
//     done by calling the target process's *replica.Replica directly, as
//     PeerReplicas does over the peer protocol, including its shortcut to
//     the local replica. The target runs each request in a goroutine of its
//     own with its own context, as the peer server does, so a request its
//     caller gave up on may still land. Faults: drops (a request, or only
//     its answer), delays (hence reordering), partitions and pauses (a
//     request across the cut, or to or from a paused process, waits until
//     that ends or its caller's context does), kills (refused).
//   - Processes. Kill ends a process like kill -9: its context is
//     cancelled, its member stops, requests to and from it fail; its files
//     stay, with everything it wrote (the page cache survives a process;
//     machine crashes that lose unflushed writes are not simulated).
//     Restart opens the store again and starts a new incarnation that has
//     applied the log its predecessor had. Pause holds every request to or
//     from the node, but its goroutines are not frozen: timers of a paused
//     process still fire.
//   - Clients (client.go): VMs writing, reading and flushing 4 KiB blocks
//     of their own VDI through the export of the node they run on, several
//     operations in flight on distinct blocks, with test/robustness's model
//     of every block. A VM whose node is killed starts again on the next
//     node that runs.
//   - Readers (reader.go): on every node, one reader of the clients' VDIs
//     through its read-only export (ro/NAME) beside the writers, with two
//     lanes: one gives a read up after 1 s (so it reads again while its
//     node is paused or cut off, after writes acknowledged meanwhile), one
//     after 8 s (past the gateway's 5 s failover from a silent replica).
//     Reads so go through nodes that are paused, on the minority side of
//     a partition, resumed and catching up, restarted or lagging, not only
//     through the writer's node.
//   - Time: each seed runs in a testing/synctest bubble, so every timeout
//     of herd (30 s retries, 5 s reads, 2 s catch-up, recovery back-off)
//     passes in fake time, and a minute of cluster life costs a fraction of
//     a second.
//
// # Schedule and steps
//
// A seed determines the cluster (4-5 nodes, 2-3 copies, at most copies-1
// or copies nodes faulty at once, 64 KiB objects, 1 MiB VDIs), the faults
// (kill, restart, pause, resume, partition, heal, message drops and delays,
// apply lag, the catch-up delay of each node that returns; often nodes
// that return are followed at once by others that fail) over 15-30 fake
// seconds, and a check every fake second. A quarter of the seeds are also
// a rolling upgrade (Config.OldNodes, from a stream of their own): some
// nodes start on an older herd of feature level 1 (cluster.Local.SetBuild)
// and are restarted on this one partway through; the operator's
// finalize-upgrade (Local.FinalizeUpgrade) and a VDI of its own copies
// must be refused while one is a member, and once the level is raised a
// VDI of one copy fewer than the format's (at least 1) gets a client
// and readers of its own (World.finalize). A third of the other seeds
// (Config.ClientEC, from a stream of their own) give one client an
// erasure-coded VDI of a scheme that fits the nodes (2+1, 3+1, 2+2,
// 3+2), and kill the node whose gateway is inside one of its writes or
// folds, between two of its replicated writes (gateway.ECStep: after
// the entries, after the blocks; after the chunks, after the head,
// after the trim), with a chance per step drawn from the seed and a
// hash of the object, the step and the fake time; such a node starts
// again at the next step (ec.go). Options.EC (-sim.ec) gives every seed
// one instead, with crash points often, or none: the seeds that replay
// what they found before (TestFailedWritesLeaveNoDivergentReplicas,
// TestReturningNodesServeNoStaleRead) run as they were then. Each event
// is a step: it is applied, synctest.Wait lets the world settle (every
// goroutine blocked), and the invariants are checked while nothing moves.
// Then every fault heals, the clients finish, every block is read back
// through a new export, and recovery must converge.
//
// # Invariants
//
//	(a) No stale read: every read a client completes returns the block's
//	    last acknowledged write or a write whose outcome it does not know
//	    (test/robustness's model); every read a reader completes returns
//	    the write acknowledged before the read began, a later one begun
//	    before it ended, or one of unknown outcome (never anything
//	    older); at the end, every block reads back so.
//	(b) No acknowledged write lost, no copy deleted before its
//	    replacement exists: after every step, every acknowledged block is
//	    held by some copy of its object on some node's disk (killed nodes
//	    count), unless a later write of unknown outcome replaced it, and
//	    some copy of its map object records the object. A block of an
//	    erasure-coded object is read as a node's copy of its replicated
//	    part presents it: from that copy's overlay when its entry says so
//	    (ec.Resolve), else from the data chunk its head names, on the
//	    chunk's home's disk, checked against the head's CRC, or decoded
//	    from any K chunks that pass theirs.
//	(c) Stamps never go backwards: per node and object, a copy's epoch
//	    stamp never decreases while the copy exists (checked on every
//	    object the clients' VDIs can have).
//	(d) Convergence: once faults stop, every object ends with exactly
//	    its VDI's copies (the format's, or the VDI's own: Config.
//	    ClientCopies; M+1 for an erasure-coded VDI's), on the nodes the
//	    final epoch places it on, all stamped with that epoch and
//	    identical (an erasure-coded object's whole replicated part:
//	    overlay, entries, heads), within 3 fake minutes; the current head
//	    of every erasure-coded object names chunks that exist on their
//	    homes, match every block's CRC, and whose parity is that of their
//	    data.
//
// A run also fails if the clients cannot finish, the log does not take
// every node back, or the final reads fail (liveness after healing).
// Client I/O errors during faults are allowed and counted.
//
// The simulator found one real herd bug this way: a write that reached
// some replicas and then failed left replicas that differed under the
// same stamp, and nothing made them identical (seeds 230, 358, 784, 860,
// 1081; TestFailedWritesLeaveNoDivergentReplicas replays them). The
// gateway now repairs such objects (gateway/suspect.go).
//
// # Trust
//
// TestScenarioRotations adds the trust state machine (trust.go): the
// cluster at LevelSecurity, a CA rotation and a gossip key rotation
// committed through Local's real records, each node's trust (its CAs,
// its certificates, its gossip keyring) modelled from the log it applied
// as server/trust.go and cluster/gossipkeys.go derive it, and every
// request between two nodes a handshake of that model, checked by each
// side's own log (a refusal is a violation). No TLS and no gossip run:
// the certificates are serials and the keys ids.
//
// # Determinism
//
// The schedule is a pure function of the seed: the configuration, every
// fault and its fake time, every client's and reader's operation (kind,
// block, pause before it), the failure detector's timing, and the fate of each message
// (a hash of the seed, the message and the fake time, not a shared stream
// consumed in scheduling order). Goroutine interleavings within one fake
// instant are Go's, and herd iterates maps in random order, so a replay
// follows the same schedule but not necessarily the same interleaving: a
// bug that depends on the schedule (the seeded bugs below: 8 of 8 replays
// fail again) reproduces reliably, one that depends on a race between two
// goroutines at the same instant may need a few replays.
//
// # Seeded bugs
//
// With the build tag simbugs, old bugs of docs/TESTING.md's table can be
// switched on again (-sim.bug, setSeededBug): recovery's
// "every-node-witnesses" (background recovery counting every node as a
// witness in the proof of currency: recovery.SetSeededBug), the
// simulator's own "lease-by-contact" (bugs.go: the replica side served
// data while its node had contact with the leader, with no lease and no
// activation, as before cluster/lease.go, so a node that returned served
// its own copies in the epoch it left until it caught up), and the
// gateway's "ec-head-before-chunks" and "ec-trim-before-head"
// (gateway/bugs.go: a fold of an erasure-coded object writing its head
// before its chunks, or trimming its overlay before its head), searched
// with every seed erasure-coded and crash points often (-sim.ec=always,
// Options.EC). For each, a TestSimulatorFindsSeededBug test shows the
// simulator finds it and replays it (and TestScenario*FindsSeededBug a
// hand-written schedule):
//
//	go test -tags simbugs ./internal/sim -run FindsSeededBug -v
//	go test -tags simbugs ./internal/sim -run TestSimulate -sim.bug=every-node-witnesses -sim.seed=2 -v
//	go test -tags simbugs ./internal/sim -run TestSimulate -sim.bug=lease-by-contact -sim.seed=16 -v
//	go test -tags simbugs ./internal/sim -run TestSimulate -sim.bug=ec-head-before-chunks -sim.ec=always -sim.seed=1 -v
//
// The erasure-coded seeds found two real bugs of the gateway's
// erasure-coded writes: a write put its blocks before their entries, so
// a writer killed between the two left an overwritten block whose entry
// named neither its old bytes nor its new ones (its acknowledged content
// lost), and entries and heads were written with object.FlagCreate, so
// a replica the placement had just moved the object to created a copy
// of that piece alone, which the others then recovered as the newest
// (gateway TestErasureCodedWriteCutBetweenItsTwoWrites; ARCHITECTURE.md,
// "No write hole", 3); under -race they found the background folder
// reading an object's state without its lock.
//
// # Raft mode
//
// Everything above fakes raft, gossip and the leader's reconcile loop.
// TestSimulateRaft (raftworld.go) runs them instead: three nodes (five
// in a quarter of the seeds), each process a cluster.StartSim (hashicorp/raft with herd's configuration
// on in-memory stores that outlive the process, the FSM, memberlist,
// reconcile with the voter management, leases, rejoin, Depart and
// Close) over the network of raftnet.go (a raft.Transport and a
// memberlist.Transport that delay, drop, reorder, partition and hold
// messages across a pause on the bubble's clock, and forwarded requests
// carried to the leader's ProposeForwarded), under kills, clean stops,
// pauses and partitions, one node at a time. It checks (Q) that the
// quorum survives, (S) that no node serves in an epoch the cluster left
// without it and (L) that the cluster settles after each fault; it runs
// no data path. Raft draws its timeouts from math/rand, so a seed does
// not replay bit for bit: a failing seed is replayed raftReplays times
// and the count of failures reported. The seeded bugs of cluster/bugs.go
// (demote-healthy-voter, serve-by-contact) are found by
// TestRaftSimulatorFindsSeededBug*:
//
//	go test ./internal/sim -run TestSimulateRaft -sim.raft.seed=N -v
//	go test -tags simbugs ./internal/sim -run TestRaftSimulatorFindsSeededBug -v
//
// # Deviations from the design
//
//   - Locks: the gateway held sync.Mutex and sync.RWMutex across round
//     trips (an object's exclusive lock during a copy, a first write's
//     allocation lock). A goroutine waiting for a sync.Mutex is not
//     durably blocked for synctest (golang/go#77687), so the fake clock
//     stopped for good; those locks are now waitlock.RWLock, which waits
//     on a sync.Cond (same semantics).
//   - Invariant (c) looks at the objects the VDIs can have rather than
//     listing every store after every step: store.List opens every fan-out
//     directory, which made the checks cost more than the simulation.
//   - gateway/fake_test.go stays: the gateway's unit tests use it for
//     snapshots, copy-on-write, damaged copies and check/repair, which the
//     simulator does not exercise.
package sim
