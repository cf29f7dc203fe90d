package inject

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/filestamp"
)

// CertLookInterval is how often, at most, a CertReloader looks at its
// files: often enough that a rotation is in use a second after it lands,
// rarely enough that a burst of handshakes costs two stats a second.
const CertLookInterval = time.Second

// CertReloader serves a TLS server's certificate from a PEM pair of files
// that are replaced while it runs (cert-manager renewing the Certificate
// behind a Secret volume, which swaps the volume's ..data symlink). Use
// GetCertificate as tls.Config.GetCertificate. It is safe for concurrent
// use.
//
// It looks at the files (their stamps: what stat says of the files the
// symlinks lead to, no reads) on a handshake, at most once per
// CertLookInterval, rather than from a ticker: nothing to start or stop,
// an idle injector does nothing, and the API server keeps its connections
// alive, so handshakes are rare and the one that looks pays two stats (and
// the reload itself, once per rotation). Handshakes that arrive while one
// looks do not wait: they get the pair in use.
//
// A change that does not load (a rotation caught half-written, a key that
// does not match) keeps the pair in use and is logged once, with the file
// names; the next change, the rotation completing, is loaded then.
type CertReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	now               func() time.Time // tests move it

	cert     atomic.Pointer[tls.Certificate]
	lastLook atomic.Int64 // unix nanoseconds

	mu     sync.Mutex // held by the handshake that looks
	stamps []filestamp.Stamp
}

// NewCertReloader loads the pair in certFile and keyFile; an error names
// the file that does not load. A nil log discards.
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	r.stamps = filestamp.Take(certFile, keyFile)
	c, err := loadPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	r.cert.Store(c)
	r.lastLook.Store(r.now().UnixNano())
	return r, nil
}

// Certificate is the pair in use.
func (r *CertReloader) Certificate() *tls.Certificate { return r.cert.Load() }

// GetCertificate returns the pair in use, after looking at the files if
// CertLookInterval has passed since the last look. It never fails: a
// server that has started has a good pair.
func (r *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := r.now().UnixNano()
	if now-r.lastLook.Load() >= int64(CertLookInterval) && r.mu.TryLock() {
		if now-r.lastLook.Load() >= int64(CertLookInterval) {
			r.lastLook.Store(now)
			r.look()
		}
		r.mu.Unlock()
	}
	return r.cert.Load(), nil
}

// look reloads the pair if its files changed since the last look; under mu.
// The stamps are taken before the files are read: a change made after
// they were taken shows at the next look.
func (r *CertReloader) look() {
	now := filestamp.Take(r.certFile, r.keyFile)
	if filestamp.Same(now, r.stamps) {
		return
	}
	r.stamps = now
	c, err := loadPair(r.certFile, r.keyFile)
	if err != nil {
		r.log.Error("TLS certificate files changed but do not load; keeping the pair in use until they do",
			"cert_file", r.certFile, "key_file", r.keyFile, "err", err)
		return
	}
	r.cert.Store(c)
	r.log.Info("TLS certificate files changed; new connections use the new pair",
		"cert_file", r.certFile, "key_file", r.keyFile, "serial", c.Leaf.SerialNumber.String(), "not_after", c.Leaf.NotAfter)
}

// loadPair reads and parses a PEM pair. Its errors name the files; they
// never carry the key's bytes (crypto/tls's do not).
func loadPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return &c, nil
}
