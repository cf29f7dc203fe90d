package config

// Fleet mode's keys (docs/fleet.md): log.backend, jetstream.* and node_id.
// Their defaults are jetstream's (Default). jetstream.Open checks replicas
// and node_id again, with looser rules; the bounds here are stricter where
// NATS needs it (KV keys and bucket names) and add the lease's, so that a
// bad value is refused at start-up with its key and source, before
// anything dials NATS. jetstream exports no bounds yet: when it does, these
// should be taken from there, like policy's.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
)

// Bounds of the fleet keys.
const (
	// maxReplicas is JetStream's own limit on a stream's replicas.
	maxReplicas = 5
	// minLeaseTTL: the owner renews its lease several times per TTL, each
	// a round trip to a JetStream quorum, and JetStream's per-entry TTLs
	// count in whole seconds.
	minLeaseTTL = time.Second
	// maxLeaseTTL: past a few minutes a crashed sidecar's lanes wait so
	// long that fleet mode's point (nothing stalls when a pod goes) is
	// lost; a longer pause is better met by a graceful drain.
	maxLeaseTTL = 5 * time.Minute
)

var (
	// streamPattern: the stream name is also a subject token (<stream>.ev.…)
	// and the prefix of KV bucket names, which allow only these characters.
	streamPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	// nodeIDPattern: the node id is a subject token and part of KV keys
	// (node.<id>), which allow [-/_=.A-Za-z0-9]; "." would split the token,
	// "/" and "=" are refused to keep ids plain.
	nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// ValidateNodeID checks a fleet node id (node_id). The error says what is
// wrong without naming a key, and wraps ErrInvalidValue; the injector
// checks the pod names that become node ids with it.
func ValidateNodeID(id string) error {
	if !nodeIDPattern.MatchString(id) {
		return invalidf(`must be 1 to 64 letters, digits, "_" or "-" (no ".", "*", ">" or spaces: it names this node in NATS subjects and keys)`)
	}
	return nil
}

// hostname is os.Hostname; tests replace it.
var hostname = os.Hostname

// natsSchemes are the URL schemes the NATS client dials.
var natsSchemes = []string{"nats", "tls", "ws", "wss"}

// ValidateJetStreamURL checks one NATS server URL as jetstream.urls takes
// it: nats://, tls://, ws:// or wss://, with a host, a port (if any) from
// 1 to 65535, no credentials (they would be logged; use
// jetstream.credentials_file), and no query or fragment. The error says
// what is wrong without naming a key, and wraps ErrInvalidValue or
// ErrMissingValue; `sluice inject --jetstream-url` shares it.
func ValidateJetStreamURL(raw string) error {
	if raw == "" {
		return newReason(ErrMissingValue, "must not be empty")
	}
	if strings.ContainsAny(raw, " \t\r\n") {
		return invalidf("must not contain spaces; list several servers as separate entries")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return invalidf(`not a valid URL; write it like "nats://nats:4222"`)
	}
	switch {
	case u.Scheme == "" || u.Opaque != "":
		return invalidf(`must start with nats://, tls://, ws:// or wss://, like "nats://nats:4222"`)
	case !slices.Contains(natsSchemes, u.Scheme):
		return invalidf("must be nats://, tls://, ws:// or wss://, not %s://", u.Scheme)
	case u.User != nil:
		return invalidf("must not contain credentials (user:password@): they would show in logs; use jetstream.credentials_file")
	case u.Hostname() == "":
		return invalidf("must have a host")
	case u.RawQuery != "" || u.ForceQuery || strings.Contains(raw, "#"):
		return invalidf("must not have a query or a fragment")
	case (u.Scheme == "nats" || u.Scheme == "tls") && u.Path != "" && u.Path != "/":
		return invalidf("must not have a path (only websocket URLs have one)")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return invalidf("port must be a number from 1 to 65535")
		}
	}
	return nil
}

func isWebsocket(raw string) bool {
	return strings.HasPrefix(raw, "ws://") || strings.HasPrefix(raw, "wss://")
}

// validateFleet checks log.backend, and the fleet keys: in fleet mode
// each of them, with badger that none is set.
func (c *Config) validateFleet() error {
	switch c.Log.Backend {
	case BackendBadger, BackendJetStream:
	default:
		return fieldErr("log.backend", c.Log.Backend, invalidf("must be %q (the default: the log in data_dir) or %q (fleet mode)", BackendBadger, BackendJetStream))
	}
	if c.NodeID != "" {
		if err := ValidateNodeID(c.NodeID); err != nil {
			return fieldErr("node_id", c.NodeID, err)
		}
	}
	if c.Log.Backend == BackendBadger {
		// Refused rather than ignored: a config that names NATS servers
		// but runs on the local log would look like fleet mode while
		// losing the backlog on every rollout and multiplying each
		// subscription's limits by the number of pods.
		if key := c.jetstreamKeySet(); key != "" {
			return fieldErr(key, nil, newReason(ErrConflict,
				`is set but log.backend is "badger": the jetstream keys configure fleet mode; set log.backend: jetstream (SLUICE_LOG__BACKEND=jetstream), or remove them`))
		}
		return nil
	}

	js := &c.JetStream
	if len(js.URLs) == 0 {
		return fieldErr("jetstream.urls", nil, newReason(ErrMissingValue,
			`required with log.backend: jetstream: list the NATS servers, like ["nats://nats:4222"], or set SLUICE_JETSTREAM__URLS=nats://a:4222,nats://b:4222`))
	}
	for i, raw := range js.URLs {
		f := fmt.Sprintf("jetstream.urls[%d]", i)
		var value any
		if raw != "" {
			value = safeURL(raw)
		}
		if err := ValidateJetStreamURL(raw); err != nil {
			return fieldErr(f, value, err)
		}
		if j := slices.Index(js.URLs, raw); j < i {
			return fieldErr(f, value, newReason(ErrDuplicate, "listed twice: jetstream.urls[%d] is the same", j))
		}
		if isWebsocket(raw) != isWebsocket(js.URLs[0]) {
			return fieldErr(f, value, newReason(ErrConflict, "mixes websocket (ws://, wss://) and other URLs; the NATS client dials one kind"))
		}
	}
	if !streamPattern.MatchString(js.Stream) {
		return fieldErr("jetstream.stream", js.Stream, invalidf(`must be 1 to 64 letters, digits, "_" or "-" (it names the stream and prefixes the KV buckets)`))
	}
	if js.Replicas < 1 || js.Replicas > maxReplicas {
		return fieldErr("jetstream.replicas", js.Replicas, invalidf("must be between 1 (development) and %d; 3 keeps a quorum through the loss of one server", maxReplicas))
	}
	if js.LeaseTTL < minLeaseTTL || js.LeaseTTL > maxLeaseTTL {
		return fieldErr("jetstream.lease_ttl", js.LeaseTTL, invalidf("must be between %v and %v", minLeaseTTL, maxLeaseTTL))
	}
	if js.CredentialsFile != "" {
		if err := checkCredentialsFile(js.CredentialsFile); err != nil {
			return err
		}
	}
	if err := js.TLS.validate(); err != nil {
		return err
	}
	if c.NodeID == "" {
		return fieldErr("node_id", nil, newReason(ErrMissingValue, "required with log.backend: jetstream (Load defaults it to the host name)"))
	}
	return nil
}

// jetstreamKeySet names the first jetstream key the sources set (as Load
// recorded them), or for a Config built by hand the first whose value
// differs from Default; "" if none.
func (c *Config) jetstreamKeySet() string {
	if len(c.jetstreamKeys) > 0 {
		return c.jetstreamKeys[0]
	}
	if keys := differences("jetstream", c.JetStream, defaultJetStream()); len(keys) > 0 {
		return keys[0]
	}
	return ""
}

// differences returns the key paths of the fields where a and b differ,
// in declaration order.
func differences(path string, a, b JetStreamConfig) []string {
	var keys []string
	var walk func(path string, a, b reflect.Value)
	walk = func(path string, a, b reflect.Value) {
		for i := range a.NumField() {
			f := a.Type().Field(i)
			key := joinPath(path, f.Tag.Get("koanf"))
			if f.Type.Kind() == reflect.Struct && f.Type != durationType {
				walk(key, a.Field(i), b.Field(i))
			} else if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
				keys = append(keys, key)
			}
		}
	}
	walk(path, reflect.ValueOf(a), reflect.ValueOf(b))
	return keys
}

// checkCredentialsFile requires a readable NATS .creds file: a decorated
// user JWT and a user seed. The content is a credential: no error repeats
// it, and the copy read is wiped.
func checkCredentialsFile(path string) error {
	const field = "jetstream.credentials_file"
	b, err := readSmallFile(path)
	if err != nil {
		return fieldErr(field, path, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
	}
	defer clear(b)
	if !bytes.Contains(b, []byte("-----BEGIN NATS USER JWT-----")) {
		return fieldErr(field, path, invalidf("not a NATS credentials file: no user JWT (-----BEGIN NATS USER JWT-----)"))
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fieldErr(field, path, &reason{kind: ErrInvalidValue, msg: "not a NATS credentials file: no valid user seed", cause: err})
	}
	kp.Wipe()
	return nil
}

// validate checks that each file named exists and parses: the CA file
// holds a PEM certificate, the certificate and key go together and match.
func (t JetStreamTLSConfig) validate() error {
	if t.CAFile != "" {
		b, err := readSmallFile(t.CAFile)
		if err != nil {
			return fieldErr("jetstream.tls.ca_file", t.CAFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fieldErr("jetstream.tls.ca_file", t.CAFile, invalidf("holds no PEM certificate"))
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		return fieldErr("jetstream.tls.key_file", nil, newReason(ErrMissingValue, "required with jetstream.tls.cert_file: the client certificate's private key"))
	case t.KeyFile != "" && t.CertFile == "":
		return fieldErr("jetstream.tls.cert_file", nil, newReason(ErrMissingValue, "required with jetstream.tls.key_file: the client certificate"))
	case t.CertFile == "":
		return nil
	}
	for _, f := range []struct{ key, path string }{{"jetstream.tls.cert_file", t.CertFile}, {"jetstream.tls.key_file", t.KeyFile}} {
		if _, err := readSmallFile(f.path); err != nil {
			return fieldErr(f.key, f.path, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
	}
	if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
		return fieldErr("jetstream.tls.cert_file", t.CertFile, &reason{kind: ErrInvalidValue,
			msg: fmt.Sprintf("with key_file %q: %v", t.KeyFile, strings.TrimPrefix(err.Error(), "tls: ")), cause: err})
	}
	return nil
}

// hostNodeID is node_id's default: the host name, each "." replaced by
// "_" (a host name has no "_", so two host names never map to one id).
func hostNodeID() (string, error) {
	h, err := hostname()
	if err != nil {
		return "", newReason(ErrMissingValue, "required with log.backend: jetstream, and the default, the host name, is unknown (%v); set node_id (SLUICE_NODE_ID)", err)
	}
	id := strings.ReplaceAll(h, ".", "_")
	if !nodeIDPattern.MatchString(id) {
		return "", newReason(ErrInvalidValue, "required with log.backend: jetstream, and the default, the host name %q, is not a valid node id (1 to 64 letters, digits, \"_\" or \"-\"); set node_id (SLUICE_NODE_ID)", h)
	}
	return id, nil
}

// RestartRequired lists the keys whose change between the running config
// and the next one a reload cannot apply, sorted: log.backend, the
// jetstream keys and node_id. Applying the next file's subscriptions while
// those differ would register them in a fleet (a cluster, a stream) the
// running sidecar is not part of, so a reload with any of them changed
// must change nothing.
func RestartRequired(running, next *Config) []string {
	var keys []string
	if running.Log.Backend != next.Log.Backend {
		keys = append(keys, "log.backend")
	}
	keys = append(keys, differences("jetstream", running.JetStream, next.JetStream)...)
	if running.NodeID != next.NodeID {
		keys = append(keys, "node_id")
	}
	slices.Sort(keys)
	return keys
}
