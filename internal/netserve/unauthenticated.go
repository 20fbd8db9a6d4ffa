package netserve

import (
	"net"
	"sync"
)

// Unauthenticated is the pool of a server's connections that have not
// authenticated yet (no TLS client certificate verified, no request with a
// valid token): anyone who reaches the port can open them, so they have a
// pool of their own, apart from the authenticated connections' limits,
// and a full pool never refuses a newcomer. When the pool is full, in all
// (Max) or for the newcomer's source (MaxPerSource), the oldest
// connection is closed to admit the new one: the oldest of the
// newcomer's own source when that source is at its bound, else the oldest
// of the source holding the most (the oldest of all when every source
// holds as many). A client that authenticates within its handshake gets
// through however many connections strangers hold, even reconnecting as
// fast as they can: a flood from a few addresses only ever recycles its
// own slots, and a legitimate client's one connection is never the
// first to go while any address holds more.
//
// The zero value is not usable: set Max and MaxPerSource (at least 1).
// Its methods are safe for concurrent use.
type Unauthenticated struct {
	Max          int
	MaxPerSource int

	mu      sync.Mutex // guards the fields below
	next    uint64     // admission order
	total   int
	sources map[string]*sourceQueue
	evicted uint64 // connections closed to admit others, for metrics and tests
}

// sourceQueue is one source's connections, oldest first.
type sourceQueue struct {
	oldest, newest *Pending
	count          int
}

// Pending is one connection in an Unauthenticated pool.
type Pending struct {
	pool   *Unauthenticated
	source string
	order  uint64
	close  func()
	// Guarded by pool.mu: the connection is in the pool until it leaves
	// (Leave) or is closed to admit another (evicted).
	in           bool
	evicted      bool
	older, newer *Pending
}

// Source is the source of a connection: its remote IP address, or "local"
// for anything but TCP.
func Source(conn net.Conn) string {
	if address, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		return address.IP.String()
	}
	return "local"
}

// Admit adds a connection from source to the pool; close closes it (it
// must not block or call the pool). If the pool is full, the oldest
// connection of the source the rule above picks is closed first, and its
// source is returned (else ""). close is called outside the pool's lock.
func (u *Unauthenticated) Admit(source string, close func()) (p *Pending, evictedSource string) {
	u.mu.Lock()
	if u.sources == nil {
		u.sources = map[string]*sourceQueue{}
	}
	var victim *Pending
	if q := u.sources[source]; q != nil && q.count >= max(u.MaxPerSource, 1) {
		victim = q.oldest
	} else if u.total >= max(u.Max, 1) {
		victim = u.largestLocked()
	}
	if victim != nil {
		u.removeLocked(victim)
		victim.evicted = true
		u.evicted++
		evictedSource = victim.source
	}
	u.next++
	p = &Pending{pool: u, source: source, order: u.next, close: close, in: true}
	q := u.sources[source]
	if q == nil {
		q = &sourceQueue{}
		u.sources[source] = q
	}
	p.older = q.newest
	if q.newest != nil {
		q.newest.newer = p
	} else {
		q.oldest = p
	}
	q.newest = p
	q.count++
	u.total++
	u.mu.Unlock()
	if victim != nil {
		victim.close()
	}
	return p, evictedSource
}

// largestLocked returns the oldest connection of the source holding the
// most (of those, the one whose oldest is oldest).
func (u *Unauthenticated) largestLocked() *Pending {
	var best *sourceQueue
	for _, q := range u.sources {
		if best == nil || q.count > best.count || (q.count == best.count && q.oldest.order < best.oldest.order) {
			best = q
		}
	}
	if best == nil {
		return nil
	}
	return best.oldest
}

func (u *Unauthenticated) removeLocked(p *Pending) {
	q := u.sources[p.source]
	if p.older != nil {
		p.older.newer = p.newer
	} else {
		q.oldest = p.newer
	}
	if p.newer != nil {
		p.newer.older = p.older
	} else {
		q.newest = p.older
	}
	p.older, p.newer = nil, nil
	p.in = false
	q.count--
	u.total--
	if q.count == 0 {
		delete(u.sources, p.source)
	}
}

// Leave takes the connection out of the pool: it authenticated, or it
// ended. It reports false if the connection had been closed to admit
// another (the caller then treats it as closed); calling it again reports
// the same.
func (p *Pending) Leave() bool {
	u := p.pool
	u.mu.Lock()
	defer u.mu.Unlock()
	if p.in {
		u.removeLocked(p)
	}
	return !p.evicted
}

// Evicted reports whether the connection was closed to admit another.
func (p *Pending) Evicted() bool {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	return p.evicted
}

// Len returns the connections in the pool, in all and from source.
func (u *Unauthenticated) Len(source string) (total, fromSource int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if q := u.sources[source]; q != nil {
		fromSource = q.count
	}
	return u.total, fromSource
}

// Evictions is how many connections were closed to admit others.
func (u *Unauthenticated) Evictions() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.evicted
}
