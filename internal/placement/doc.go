// Package placement decides which nodes hold the replicas of an object: a
// pure, deterministic function of (object id, the epoch's node set), so
// every node computes the replica set of any object without asking anyone
// (DESIGN.md, "Placement"). It does no I/O.
//
// # The function
//
// Weighted rendezvous hashing, in the form Ceph calls straw2. For object
// oid, every node draws a number u in (0, 1) from a 64-bit hash of (oid,
// node id) and gets the score -log2(u)/v, where v is its effective weight
// (its capacity, corrected as below). The replicas are the nodes with the
// lowest scores, taken in order and skipping a node whose zone already
// holds a replica when zones are set. -log2(u) is an exponential random
// variable, and the minimum of exponentials with rates v_i falls on node i
// with probability v_i/Σv, so:
//
//   - balance: the first replica lands on each node in exact proportion to
//     its weight, with no table to tune;
//   - movement: a node joining takes objects only for itself (an object
//     changes replica set only if the new node enters it, and the others
//     keep their relative order), and a node leaving gives up only its own
//     replicas. No other node exchanges data;
//   - zones: a zone's best node is the minimum of its nodes' exponentials,
//     so zones compete with their total weight and inside a zone each node
//     is picked in proportion to its weight.
//
// With several copies, picking the k lowest scores is sampling without
// replacement, which gives heavy nodes less than their share when weights
// differ; without zones the weights are corrected for that (Rosén's
// successive-sampling correction, see weight.go for the derivation,
// the measurements, and why zoned rings are not corrected).
//
// # Erasure-coded chunks
//
// Ring.Chunks places the K+M chunks of a stripe, one node per chunk
// position, as CRUSH's "indep" mode does: each position c ranks the
// nodes by the same straw2 scores with a key of its own, chunkKey(key,
// c) = mix64(objectKey(key) ⊕ mix64(c + chunkSalt)), and takes its best
// node; a node two positions want goes to the one with the better score
// on it, and the other takes its next best (no zone may hold more than
// perZone chunks when zones are set). A node leaving moves the chunks it
// held and, when the stripe is a small part of the ring, almost nothing
// else (a ranking cut into K+M positions would shift every position
// after the lost one). The weights are Replicas' for K+M copies. Its
// cost is a Replicas lookup per position: about 2 µs for 4+2 on 12
// nodes (BenchmarkChunks).
//
// # Why not Sheepdog's virtual nodes
//
// Sheepdog hashed each node to 64 points of a ring (FNV-1a, scaled by
// free space) and took the next distinct nodes clockwise. A node's share
// is then the sum of 64 random arcs, with a standard deviation of 1/√64 =
// 12.5%: with an ideal hash, the fullest of 100 or 1,000 nodes holds 1.34
// to 1.37 times the mean, and 1,024 points per node (a million-entry ring)
// still give 1.10 at 1,000 nodes. With plain FNV-1a of similar names the
// points clump and the fullest node held 3 to 4.7 times the mean in our
// measurement. The design requires max/mean <= 1.10; rendezvous hashing
// meets it at every size (see the simulation test) and keeps movement at
// the minimum, for the price of O(nodes) work per lookup.
//
// # Cost
//
// A lookup hashes every node (one multiply-xorshift mix each), but
// computes the logarithm only for the few nodes whose hash is close enough
// to win: the score is bounded below by (1-u)·log2(e), so most nodes are
// ruled out with one multiplication. About 26 of 1,000 nodes get a
// logarithm. Measured: about 150 ns for 3 nodes, 1.4 µs for 100 and
// 4 µs for 1,000 (BenchmarkReplicas), without allocation when the caller
// reuses the destination slice (AppendReplicas).
//
// # Determinism
//
// Every node of a cluster must compute the same replica sets, whatever its
// CPU, so the function uses no floating point: the hash is FNV-1a of the
// node id and the splitmix64 finalizer, the logarithm is fixed point with
// a table built from integers, scores are compared exactly as 128-bit
// cross products, and the correction is computed with a small integer
// floating point type. The input order of New does not matter (nodes are
// sorted by id, and exact ties go to the lower id). TestPlacementIsPinned
// pins the function: changing it would move almost every object of an
// existing cluster, so it may change only with a new cluster format.
//
// # Contract
//
// New copies its input; a Ring is immutable afterwards and all its methods
// are safe for concurrent use. Callers must refuse a copy count above
// MaxCopies (the number of zones when zones are set, otherwise of nodes):
// Replicas then returns fewer ids than asked. A copy count below 1 is a
// programming error and panics. Chunks, whose stripes cannot be shorter
// than asked, returns an error instead when the ring cannot place them.
package placement
