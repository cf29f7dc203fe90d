package inject

import (
	"crypto/tls"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/synclog"

	"github.com/sluicehq/sluice/internal/injecttest"
)

// fakeClock is a CertReloader's clock that the test moves.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestCertReloaderRotation: a pair swapped in the way the kubelet updates
// a Secret volume is served to new connections without a restart; a
// change that does not load (a new certificate with the old key) keeps
// the pair in use, is logged once, and completes at the next change.
func TestCertReloaderRotation(t *testing.T) {
	ca, vol := injecttest.Serving(t, 1001)
	var log synclog.Buffer
	r, err := NewCertReloader(vol.CertFile(), vol.KeyFile(), slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{}
	clock.ns.Store(time.Now().UnixNano())
	r.now = clock.now
	r.lastLook.Store(clock.ns.Load())

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	srv.TLS = &tls.Config{GetCertificate: r.GetCertificate, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	// await polls new connections until one presents serial.
	await := func(serial int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := injecttest.ServedSerial(addr, ca.Pool)
			if err == nil && got.Cmp(big.NewInt(serial)) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("new connections present serial %v (err %v), want %d; log:\n%s", got, err, serial, log.String())
			}
			clock.advance(CertLookInterval)
		}
	}
	await(1001)

	second := ca.Leaf(t, 1002)
	vol.Write(t, second.Cert, second.Key)
	// Within the interval, nobody looks.
	if got, err := injecttest.ServedSerial(addr, ca.Pool); err != nil || got.Int64() != 1001 {
		t.Fatalf("before the interval: serial %v (err %v), want 1001", got, err)
	}
	await(1002)
	if !strings.Contains(log.String(), "serial=1002") {
		t.Errorf("the rotation is not logged with its serial:\n%s", log.String())
	}

	// Half-written: the third certificate with the second's key.
	third := ca.Leaf(t, 1003)
	vol.Write(t, third.Cert, second.Key)
	const failed = "TLS certificate files changed but do not load"
	for i := 0; strings.Count(log.String(), failed) == 0; i++ {
		if i == 100 {
			t.Fatalf("the bad change is not logged:\n%s", log.String())
		}
		clock.advance(CertLookInterval)
		if _, err := injecttest.ServedSerial(addr, ca.Pool); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 { // more looks at the same bad files
		clock.advance(CertLookInterval)
		got, err := injecttest.ServedSerial(addr, ca.Pool)
		if err != nil || got.Int64() != 1002 {
			t.Fatalf("with a half-written pair on disk: serial %v (err %v), want 1002 kept", got, err)
		}
	}
	if n := strings.Count(log.String(), failed); n != 1 {
		t.Errorf("the bad change is logged %d times, want once:\n%s", n, log.String())
	}
	for _, f := range []string{vol.CertFile(), vol.KeyFile()} {
		if !strings.Contains(log.String(), f) {
			t.Errorf("the log does not name %s:\n%s", f, log.String())
		}
	}
	if strings.Contains(log.String(), "PRIVATE KEY") {
		t.Errorf("the log shows key material:\n%s", log.String())
	}

	// The rotation completes.
	vol.Write(t, third.Cert, third.Key)
	await(1003)
}

// TestCertReloaderFirstLoadFails: a pair that does not load at start is an
// error naming the file.
func TestCertReloaderFirstLoadFails(t *testing.T) {
	dir := injecttest.BadPairs(t)
	file := func(name string) string { return filepath.Join(dir, name) }
	certA, keyA, keyB := file("a.crt"), file("a.key"), file("b.key")
	garbage := file("garbage.crt")
	for _, c := range []struct {
		name, cert, key string
		want            []string
	}{
		{"missing cert", filepath.Join(dir, "none.crt"), keyA, []string{"none.crt", "no such file"}},
		{"missing key", certA, filepath.Join(dir, "none.key"), []string{"none.key", "no such file"}},
		{"mismatched", certA, keyB, []string{"a.crt", "b.key", "does not match"}},
		{"not PEM", garbage, keyA, []string{"garbage.crt"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewCertReloader(c.cert, c.key, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
