package server

// What a node trusts and presents, and how a CA rotation changes both
// while the node runs (cluster/carotation.go keeps the log's side).
//
// A node trusts the cluster CA and, during a rotation, the new one too;
// it holds a certificate from each (node.crt, node-next.crt). Every TLS
// server of the node picks the certificate per connection: the one from
// the CA the client names in its server name (pki.CAHint: the CLI names
// its token's CA, a node the newest it trusts), else the one from the
// CA the cluster trusted before the rotation, so that clients that know
// only that CA (QEMU with its ca-cert.pem, older CLIs) connect as before
// until the rotation finishes. On the peer port a dialer presents the
// newest certificate the server accepts (the CAs the server names in its
// certificate request). Every change swaps the whole trust at once
// (credentials.trust): new connections see it, open ones go on.
//
// The rotation, as each node's trustLoop follows the log:
//
//   - start: trust the new CA (DATA/ca-next.crt); ask its holder (the node
//     that made it, which alone holds its key, DATA/ca-next.key) for a
//     certificate from it (DATA/node-next.{crt,key}), and record its
//     serial in the log (it is used only on the peer port of nodes that
//     let it in: cluster.PeerAllowedUnder);
//   - finish: the new CA becomes ca.crt, the new certificate node.crt;
//     the old CA is trusted no more; the holder's new key becomes ca.key
//     and any other node's old ca.key is deleted (it signs nothing the
//     cluster trusts); DATA/admin.token and DATA/join.token, if here, get
//     the new fingerprint (same id and secret);
//   - cancel: the new CA and the certificates from it are dropped.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/herd-storage/herd/internal/cluster"
	"github.com/herd-storage/herd/internal/metrics"
	"github.com/herd-storage/herd/internal/peer"
	"github.com/herd-storage/herd/internal/pki"
)

// Files of a CA rotation in the data directory.
const (
	caNextCertFile   = "ca-next.crt"
	caNextKeyFile    = "ca-next.key"
	nodeNextCertFile = "node-next.crt"
	nodeNextKeyFile  = "node-next.key"
)

// trust is what the node trusts and presents at one moment; never
// modified once stored (credentials.trust).
type trust struct {
	current  *pki.CA          // the cluster's CA (during a rotation: the old one)
	next     *pki.CA          // during a rotation: the new one
	node     *tls.Certificate // from current: leaf, then current's certificate
	nodeNext *tls.Certificate // from next, once issued
	pool     *x509.CertPool   // current and next
}

func newTrust(current, next *pki.CA, node, nodeNext *tls.Certificate) *trust {
	t := &trust{current: current, next: next, node: node, nodeNext: nodeNext, pool: x509.NewCertPool()}
	t.pool.AddCert(current.Cert)
	if next != nil {
		t.pool.AddCert(next.Cert)
	} else {
		t.nodeNext = nil
	}
	return t
}

// fingerprints are the trusted CAs', the cluster's first.
func (t *trust) fingerprints() []string {
	out := []string{t.current.Fingerprint()}
	if t.next != nil {
		out = append(out, t.next.Fingerprint())
	}
	return out
}

// ca returns the trusted CA of fingerprint, nil if none.
func (t *trust) ca(fingerprint string) *pki.CA {
	switch {
	case fingerprint == t.current.Fingerprint():
		return t.current
	case t.next != nil && fingerprint == t.next.Fingerprint():
		return t.next
	}
	return nil
}

// newest is the newest CA trusted: the one clients should pin.
func (t *trust) newest() *pki.CA {
	if t.next != nil {
		return t.next
	}
	return t.current
}

// serverCertificate is the certificate for a client that sent serverName.
func (t *trust) serverCertificate(serverName string) *tls.Certificate {
	if fingerprint, ok := pki.HintedCA(serverName); ok && t.nodeNext != nil && fingerprint == t.next.Fingerprint() {
		return t.nodeNext
	}
	return t.node
}

// now is the node's trust (built from the setup's credentials before
// setTrust, as in tests).
func (cr *credentials) now() *trust {
	if t := cr.trust.Load(); t != nil {
		return t
	}
	node := cr.node
	return newTrust(cr.ca, nil, &node, nil)
}

// trustSource is the peer port's view of the trust (peer.Source).
type trustSource struct{ cr *credentials }

func (s trustSource) Roots() *x509.CertPool { return s.cr.now().pool }

func (s trustSource) ServerCertificate(serverName string) *tls.Certificate {
	return s.cr.now().serverCertificate(serverName)
}

// ClientCertificate presents the certificate from the new CA to a server
// that accepts it, else the one from the cluster's.
func (s trustSource) ClientCertificate(acceptable [][]byte) *tls.Certificate {
	t := s.cr.now()
	if t.nodeNext == nil {
		return t.node
	}
	if acceptable == nil {
		return t.nodeNext
	}
	for _, subject := range acceptable {
		if string(subject) == string(t.next.Cert.RawSubject) {
			return t.nodeNext
		}
	}
	return t.node
}

func (s trustSource) Hint() string { return pki.CAHint(s.cr.now().newest().Fingerprint()) }

// loadRotation completes the trust with a rotation's files (a restart
// during one): the new CA, with its key on its holder, and this node's
// certificate from it. Files left by a rotation that ended while the
// node was stopping are sorted out by trustLoop once the log is known.
func (cr *credentials) loadRotation(dir string) error {
	node := cr.node
	current := cr.ca
	var next *pki.CA
	var nodeNext *tls.Certificate
	certPEM, err := os.ReadFile(filepath.Join(dir, caNextCertFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		next, err = pki.ParseCACertificate(certPEM)
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(dir, caNextCertFile), err)
		}
		if next.Fingerprint() == current.Fingerprint() {
			next = nil // promoted already: the leftovers go (trustLoop)
			break
		}
		if keyPEM, err := pki.ReadSecretFile(filepath.Join(dir, caNextKeyFile)); err == nil {
			if next, err = pki.ParseCA(certPEM, keyPEM); err != nil {
				return fmt.Errorf("%s: %w", filepath.Join(dir, caNextKeyFile), err)
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		nodeNext = loadNodeCertificate(dir, nodeNextCertFile, nodeNextKeyFile, next)
	}
	cr.trust.Store(newTrust(current, next, &node, nodeNext))
	return nil
}

// loadNodeCertificate loads a node certificate issued by ca, nil if there
// is none (or it is not ca's).
func loadNodeCertificate(dir, certFile, keyFile string, ca *pki.CA) *tls.Certificate {
	certPEM, err := os.ReadFile(filepath.Join(dir, certFile))
	if err != nil {
		return nil
	}
	keyPEM, err := pki.ReadSecretFile(filepath.Join(dir, keyFile))
	if err != nil {
		return nil
	}
	certificate, err := pki.NodeTLSCertificate(certPEM, keyPEM, ca.CertPEM)
	if err != nil {
		return nil
	}
	return &certificate
}

// rotationState is what trustLoop reads from the log (*cluster.Cluster).
type rotationState interface {
	CA() cluster.CAState
	ID() string
	Sync(ctx context.Context) error
	RecordCACertificate(ctx context.Context, fingerprint, serial string) error
	Node(id string) (cluster.Node, bool)
	PeerAllowedUnder(id, serial, ca string) error
	Halt(err error)
}

// trustInterval is how often trustLoop compares the trust with the log.
const trustInterval = 500 * time.Millisecond

// trustLoop follows the log's CA rotation (see the top of this file).
func (cr *credentials) trustLoop(ctx context.Context, c rotationState, logger *slog.Logger) {
	var last string
	for {
		step, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := cr.followRotation(step, c, logger)
		cancel()
		if err != nil && err.Error() != last {
			logger.Warn("CA rotation: this node's step failed, retrying", "err", err)
		}
		last = ""
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(trustInterval):
		}
	}
}

// followRotation is one turn of trustLoop.
func (cr *credentials) followRotation(ctx context.Context, c rotationState, logger *slog.Logger) error {
	state := c.CA()
	t := cr.now()
	switch r := state.Rotation; {
	case r != nil:
		if t.next == nil || t.next.Fingerprint() != r.Fingerprint {
			if t.next != nil && cr.creatingCA.Load() {
				return nil // this node is starting another rotation
			}
			next, err := pki.ParseCACertificate(r.Cert)
			if err != nil {
				return fmt.Errorf("the log's new CA: %w", err)
			}
			if next.Fingerprint() != r.Fingerprint {
				return errors.New("the log's new CA has another fingerprint than recorded")
			}
			if err := pki.WriteSecretFile(filepath.Join(cr.dir, caNextCertFile), r.Cert); err != nil {
				return err
			}
			cr.setTrust(newTrust(t.current, next, t.node, nil))
			logger.Info("CA rotation: trusting the new CA", "ca", r.Fingerprint, "and", t.current.Fingerprint())
			t = cr.now()
		}
		if t.nodeNext == nil {
			if err := cr.issueNext(ctx, c, r); err != nil {
				return fmt.Errorf("getting a certificate from the new CA %s: %w", r.Fingerprint, err)
			}
			t = cr.now()
			logger.Info("CA rotation: installed this node's certificate from the new CA", "ca", r.Fingerprint, "serial", pki.Serial(t.nodeNext.Leaf))
		}
		if serial := pki.Serial(t.nodeNext.Leaf); r.Certificates[c.ID()] != serial {
			if err := c.RecordCACertificate(ctx, r.Fingerprint, serial); err != nil {
				return fmt.Errorf("recording this node's certificate from the new CA: %w", err)
			}
		}
		return nil
	case state.Fingerprint != "" && state.Fingerprint != t.current.Fingerprint():
		// The rotation finished (while this node ran, or was away).
		if err := c.Sync(ctx); err != nil {
			// Act on the leader's word only, unless the log applied here
			// is past this node's CA already: a node left out by --force
			// cannot reach the leader (it refuses the node's certificate),
			// yet it may go on applying the log, over a raft connection
			// the leader opened before it applied the finish.
			if !t.pastCurrent(c, state) || t.admittedUnder(c, state) {
				return nil
			}
		} else if state = c.CA(); state.Rotation != nil || state.Fingerprint == t.current.Fingerprint() {
			return nil
		}
		if !t.admittedUnder(c, state) {
			// Left out of a rotation finished with --force: every other
			// node refuses this one's certificate from now on.
			if !cr.leftBehind.Swap(true) {
				c.Halt(fmt.Errorf("the cluster's CA is now %s and this node has no certificate from it (it trusts %s): every other node refuses it. Remove it (herd node remove %s, on a member) and start it on an empty data directory with a join token (herd cluster join-token create)",
					state.Fingerprint, strings.Join(t.fingerprints(), ", "), c.ID()))
			}
			return nil
		}
		if err := cr.promote(t); err != nil {
			return fmt.Errorf("making the new CA this node's: %w", err)
		}
		logger.Info("CA rotation finished: the new CA is the cluster's; the old one is trusted no more", "ca", state.Fingerprint, "old", t.current.Fingerprint())
		return nil
	case t.next != nil && !cr.creatingCA.Load():
		// Cancelled (or files of a rotation that ended otherwise).
		if err := c.Sync(ctx); err != nil {
			return nil
		}
		if state = c.CA(); state.Rotation != nil || cr.creatingCA.Load() {
			return nil
		}
		cr.setTrust(newTrust(t.current, nil, t.node, nil))
		for _, name := range []string{caNextCertFile, caNextKeyFile, nodeNextCertFile, nodeNextKeyFile} {
			os.Remove(filepath.Join(cr.dir, name))
		}
		logger.Info("CA rotation: dropped the new CA (cancelled)", "ca", t.next.Fingerprint())
	}
	return nil
}

// admittedUnder tells whether this node holds a certificate from the
// CA the log (state, a rotation finished) names the cluster's that the
// log admits: its certificate from the rotation's new CA, recorded before
// the finish. A node without one was left out by --force: it trusts the
// new CA at most (learned from the log, or from a member: learnCAs), or
// got a certificate from it too late to record it (the log admits the
// serial it recorded, or the one from before).
func (t *trust) admittedUnder(c rotationState, state cluster.CAState) bool {
	return t.next != nil && t.next.Fingerprint() == state.Fingerprint && t.nodeNext != nil &&
		c.PeerAllowedUnder(c.ID(), pki.Serial(t.nodeNext.Leaf), state.Fingerprint) == nil
}

// pastCurrent tells whether the log applied here (state: a rotation
// finished, to a CA other than this node's current one) is past this
// node's current CA, not behind it (a node that just started applies the
// log from a snapshot taken before a finish it took part in): the new CA
// this node trusts is the log's, or the log retired this node's CA, or
// it still admits this node's certificate from it (a finish admits the
// certificates from the new CA it records, so only one that left this
// node out is followed by its old serial).
func (t *trust) pastCurrent(c rotationState, state cluster.CAState) bool {
	if t.next != nil && t.next.Fingerprint() == state.Fingerprint {
		return true
	}
	for _, retired := range state.Retired {
		if retired.Fingerprint == t.current.Fingerprint() {
			return true
		}
	}
	return t.node.Leaf != nil && c.PeerAllowedUnder(c.ID(), pki.Serial(t.node.Leaf), "") == nil
}

// issueNext gets this node's certificate from the new CA: from its own
// key on the holder, else from the holder (ProtocolSign, which signs a
// node certificate from the new CA only for the node that asks).
func (cr *credentials) issueNext(ctx context.Context, c rotationState, r *cluster.CARotation) error {
	request := signRequest{Kind: "node", NodeID: c.ID(), IPs: []string{cr.ip.String()}, CA: r.Fingerprint}
	var signed signAnswer
	var err error
	if t := cr.now(); t.next != nil && t.next.CanSign() {
		signed, err = cr.signLocally(request)
	} else {
		holder, ok := c.Node(r.Holder)
		if !ok || holder.PeerAddr == "" {
			return fmt.Errorf("the node holding the new CA's key (%s) is not in the log", r.Holder)
		}
		signed, err = cr.askToSign(ctx, []string{holder.PeerAddr}, request)
	}
	if err != nil {
		return err
	}
	t := cr.now()
	if t.next == nil || t.next.Fingerprint() != r.Fingerprint {
		return errors.New("the new CA changed meanwhile")
	}
	certificate, err := pki.NodeTLSCertificate(signed.Cert, signed.Key, t.next.CertPEM)
	if err != nil {
		return fmt.Errorf("the holder sent an unusable certificate: %w", err)
	}
	if err := pki.WriteSecretFile(filepath.Join(cr.dir, nodeNextKeyFile), signed.Key); err != nil {
		return err
	}
	if err := pki.WriteSecretFile(filepath.Join(cr.dir, nodeNextCertFile), signed.Cert); err != nil {
		return err
	}
	cr.setTrust(newTrust(t.current, t.next, t.node, &certificate))
	return nil
}

// promote makes the new CA and this node's certificate from it the
// current ones, on disk and in the trust. The order survives a crash at
// any point (loadRotation and ensureNodeCertificate sort out the rest).
func (cr *credentials) promote(t *trust) error {
	dir := cr.dir
	nodeCert, err := os.ReadFile(filepath.Join(dir, nodeNextCertFile))
	if err != nil {
		return err
	}
	nodeKey, err := pki.ReadSecretFile(filepath.Join(dir, nodeNextKeyFile))
	if err != nil {
		return err
	}
	if err := pki.WriteSecretFile(filepath.Join(dir, nodeKeyFile), nodeKey); err != nil {
		return err
	}
	if err := pki.WriteSecretFile(filepath.Join(dir, nodeCertFile), nodeCert); err != nil {
		return err
	}
	if t.next.CanSign() {
		if err := pki.WriteSecretFile(filepath.Join(dir, caKeyFile), t.next.KeyPEM); err != nil {
			return err
		}
	} else if err := os.Remove(filepath.Join(dir, caKeyFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := pki.WriteSecretFile(filepath.Join(dir, caCertFile), t.next.CertPEM); err != nil {
		return err
	}
	for _, name := range []string{caNextCertFile, caNextKeyFile, nodeNextCertFile, nodeNextKeyFile} {
		os.Remove(filepath.Join(dir, name))
	}
	cr.setTrust(newTrust(t.next, nil, t.nodeNext, nil))
	// The first node's token files carry the CA's fingerprint: same id
	// and secret, the new fingerprint.
	fingerprint := t.next.Fingerprint()
	if token, err := readTokenFile(dir, AdminTokenFile); err == nil && token != nil {
		if parsed, err := pki.ParseAdminToken(strings.TrimSpace(string(token))); err == nil {
			parsed.Fingerprint = fingerprint
			pki.WriteSecretFile(filepath.Join(dir, AdminTokenFile), []byte(parsed.String()+"\n"))
		}
	}
	if token, err := readTokenFile(dir, JoinTokenFile); err == nil && token != nil {
		if parsed, err := pki.ParseJoinToken(strings.TrimSpace(string(token))); err == nil {
			parsed.Fingerprint = fingerprint
			pki.WriteSecretFile(filepath.Join(dir, JoinTokenFile), []byte(parsed.String()+"\n"))
		}
	}
	return nil
}

// setTrust installs t.
func (cr *credentials) setTrust(t *trust) { cr.trust.Store(t) }

// caStarter is what startCARotation needs of the log (*cluster.Cluster).
type caStarter interface {
	CA() cluster.CAState
	ID() string
	StartCARotation(ctx context.Context, cert *x509.Certificate, certPEM []byte) (cluster.CAState, error)
}

// startCARotation makes a new CA on this node, which must hold the
// cluster CA's key, and records it in the log. The new key stays here
// (DATA/ca-next.key).
func (cr *credentials) startCARotation(ctx context.Context, c caStarter) (cluster.CAState, error) {
	t := cr.now()
	if !t.current.CanSign() {
		return cluster.CAState{}, pki.ErrNoCAKey
	}
	if r := c.CA().Rotation; r != nil {
		return cluster.CAState{}, fmt.Errorf("%w: a rotation to CA %s is under way since %s (herd cluster rotate-ca --finish or --cancel)", cluster.ErrBusy, r.Fingerprint, r.Started.UTC().Format(time.RFC3339))
	}
	if !cr.creatingCA.CompareAndSwap(false, true) {
		return cluster.CAState{}, fmt.Errorf("%w: this node is making a new CA already", cluster.ErrBusy)
	}
	defer cr.creatingCA.Store(false)
	// A name of its own: peers pick their certificate by the CA names a
	// server accepts (trustSource.ClientCertificate).
	next, err := pki.NewCA("herd cluster CA " + c.ID() + " " + time.Now().UTC().Format("20060102T150405Z"))
	if err != nil {
		return cluster.CAState{}, err
	}
	if err := pki.WriteSecretFile(filepath.Join(cr.dir, caNextKeyFile), next.KeyPEM); err != nil {
		return cluster.CAState{}, err
	}
	if err := pki.WriteSecretFile(filepath.Join(cr.dir, caNextCertFile), next.CertPEM); err != nil {
		return cluster.CAState{}, err
	}
	cr.setTrust(newTrust(t.current, next, t.node, nil))
	return c.StartCARotation(ctx, next.Cert, next.CertPEM)
}

// caCertificates are the CA certificates a client should trust (PEM):
// during a rotation both, so that it verifies a node whichever
// certificate the node shows it.
func (t *trust) caCertificates() []byte {
	out := append([]byte(nil), t.current.CertPEM...)
	if t.next != nil {
		out = append(out, t.next.CertPEM...)
	}
	return out
}

// StartCARotation implements api.CARotator: here if this node holds the
// cluster CA's key, else on a node that does (which keeps the new key).
func (cr *credentials) StartCARotation(ctx context.Context) (cluster.CAState, error) {
	c := cr.cluster.Load()
	if c == nil {
		return cluster.CAState{}, errors.New("this node is starting")
	}
	if err := c.Requires(cluster.FeatureCARotation); err != nil {
		return cluster.CAState{}, err
	}
	if cr.now().current.CanSign() {
		return cr.startCARotation(ctx, c)
	}
	request, _ := json.Marshal(signRequest{Kind: "rotate-ca"})
	var errs []string
	for _, holder := range c.Signers() {
		body, err := peer.Call(ctx, holder, cr.peer, peer.ProtocolSign, request)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		var state cluster.CAState
		if err := json.Unmarshal(body, &state); err != nil {
			return cluster.CAState{}, err
		}
		return state, nil
	}
	if len(errs) == 0 {
		return cluster.CAState{}, fmt.Errorf("%w, and no node that holds it is up to make the new CA (herd node list --json: holds_ca_key)", pki.ErrNoCAKey)
	}
	return cluster.CAState{}, fmt.Errorf("no node holding the CA key made the new CA: %s", strings.Join(errs, "; "))
}

// finishWait bounds how long FinishCARotation waits for the alive nodes
// to apply the finish (each does within trustInterval of applying the
// entry): less than the CLI's default --timeout.
const finishWait = 10 * time.Second

// FinishCARotation implements api.CARotator: it commits the finish, then
// waits until every node the log has alive trusts the new CA alone, so
// that the old CA is refused everywhere when it returns (a node left out
// by --force that starts meanwhile is refused by every member it asks,
// at once); at most finishWait. It returns the nodes that had not by
// then.
func (cr *credentials) FinishCARotation(ctx context.Context, force bool) (cluster.CAState, []string, error) {
	c := cr.cluster.Load()
	if c == nil {
		return cluster.CAState{}, nil, errors.New("this node is starting")
	}
	state, err := c.FinishCARotation(ctx, force)
	if err != nil {
		return state, nil, err
	}
	wait, cancel := context.WithTimeout(ctx, finishWait)
	defer cancel()
	return state, cr.waitFinished(wait, c, state.Fingerprint), nil
}

// nodeLister is what waitFinished reads of the log (*cluster.Cluster).
type nodeLister interface {
	ID() string
	Nodes() []cluster.NodeInfo
}

// waitFinished waits until every node c has alive trusts the CA of
// fingerprint alone, or ctx ends; it returns the nodes that do not.
func (cr *credentials) waitFinished(ctx context.Context, c nodeLister, fingerprint string) []string {
	done := map[string]bool{}
	for {
		var pending []string
		for _, n := range c.Nodes() {
			if n.State != cluster.NodeAlive || done[n.ID] {
				continue
			}
			if cr.trustsOnly(ctx, c, n.Node, fingerprint) {
				done[n.ID] = true
			} else {
				pending = append(pending, n.ID)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return pending
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// trustsOnly tells whether node n trusts the CA of fingerprint alone: this
// node by its trust, another by the CAs it answers (ProtocolSecrets).
func (cr *credentials) trustsOnly(ctx context.Context, c nodeLister, n cluster.Node, fingerprint string) bool {
	if n.ID == c.ID() {
		t := cr.now()
		return t.next == nil && t.current.Fingerprint() == fingerprint
	}
	if n.PeerAddr == "" {
		return false
	}
	call, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	body, err := peer.Call(call, n.PeerAddr, cr.peer, peer.ProtocolSecrets, []byte("{}"))
	if err != nil {
		return false
	}
	var s secrets
	if json.Unmarshal(body, &s) != nil || len(s.CACerts) != 1 {
		return false
	}
	ca, err := pki.ParseCACertificate(s.CACerts[0])
	return err == nil && ca.Fingerprint() == fingerprint
}

// NodeCertificateExpires implements api.Trust.
func (cr *credentials) NodeCertificateExpires() time.Time {
	return cr.now().node.Leaf.NotAfter
}

// gauges are the metrics of the CA and the certificates: the CA's age and
// expiry, the node's certificate's expiry, the earliest expiry of the NBD
// clients' certificates, and whether a CA rotation is under way
// (deploy/prometheus/herd-alerts.yml warns 30 days before an expiry).
func (cr *credentials) gauges(c *cluster.Cluster) []metrics.Gauge {
	one := func(v float64) []metrics.Sample { return []metrics.Sample{{Value: v}} }
	return []metrics.Gauge{
		{Name: "herd_ca_age_seconds", Help: "Age of the cluster CA this node trusts as the cluster's (since its certificate's start): herd cluster rotate-ca makes a new one.", Read: func() []metrics.Sample {
			return one(time.Since(cr.now().current.Cert.NotBefore).Seconds())
		}},
		{Name: "herd_ca_rotation_in_progress", Help: "1 while a CA rotation is under way (herd cluster rotate-ca until --finish or --cancel).", Read: func() []metrics.Sample {
			if c.CA().Rotation != nil {
				return one(1)
			}
			return one(0)
		}},
		{Name: "herd_certificate_earliest_expiry_timestamp_seconds", Help: "Unix time at which the earliest certificate of each kind expires: the cluster CA, this node's certificate, the NBD clients' (not revoked).", Labels: []string{"kind"}, Read: func() []metrics.Sample {
			t := cr.now()
			out := []metrics.Sample{
				{Labels: []string{"ca"}, Value: float64(t.current.Cert.NotAfter.Unix())},
				{Labels: []string{"node"}, Value: float64(t.node.Leaf.NotAfter.Unix())},
			}
			var earliest time.Time
			for _, client := range c.Clients() {
				if client.Revoked {
					continue
				}
				if expires := client.CertificateExpires(t.current.Cert.NotAfter); earliest.IsZero() || expires.Before(earliest) {
					earliest = expires
				}
			}
			if !earliest.IsZero() {
				out = append(out, metrics.Sample{Labels: []string{"client"}, Value: float64(earliest.Unix())})
			}
			return out
		}},
	}
}
