package main

// This file is the only place in sluice that imports koanf (STYLE.md §4). It
// turns embedded defaults, a YAML file, SLUICE_* environment variables and
// command-line overrides into one validated Config; Main.Run copies the
// result onto the components as plain fields.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

// Defaults of the process-wide settings. DefaultConfig returns them as a
// Config; LoadConfig layers the file, the environment and the overrides on
// top of it.
const (
	// DefaultListen is the ingest address: loopback, because the producer is
	// the service in the same pod (DESIGN.md §4).
	DefaultListen = proxy.DefaultListen
	// DefaultAdminListen is the admin API address: loopback, next to ingest
	// (DESIGN.md §4).
	DefaultAdminListen = proxy.DefaultAdminListen
	// DefaultDataDir holds the Badger log, relative to the working directory
	// (DESIGN.md §4).
	DefaultDataDir = "./sluice-data"
	// DefaultDurability answers 202 only after the append is synced to disk
	// (DESIGN.md §3, "Group commit").
	DefaultDurability = DurabilityFsync
	// DefaultMaxBodyBytes is the largest accepted event body, 1 MiB
	// (DESIGN.md §4).
	DefaultMaxBodyBytes = proxy.DefaultMaxBodyBytes
	// DefaultDedupWindow is how long an Idempotency-Key is remembered
	// (DESIGN.md §4 example config).
	DefaultDedupWindow = queue.DefaultDedupWindow
	// DefaultShutdownGrace is how long in-flight deliveries may finish after
	// SIGTERM; it leaves room inside Kubernetes' default 30 s
	// terminationGracePeriodSeconds for closing the queue.
	DefaultShutdownGrace = proxy.DefaultShutdownGrace
	// DefaultMaxConnsPerHost caps connections of the one shared outbound
	// client per endpoint host (DESIGN.md §1: one shared pool with a per-host
	// cap, not one pool per tenant).
	DefaultMaxConnsPerHost = proxy.DefaultMaxConnsPerHost
	// DefaultMaxInFlight caps concurrent outbound requests of the whole
	// process, so the sum of the subscriptions' caps cannot exhaust file
	// descriptors (DESIGN.md §1: slots are the scarce resource).
	DefaultMaxInFlight = proxy.DefaultMaxInFlight
	// DefaultMinFreeDiskBytes keeps room on the data dir's file system for
	// what the log writes besides appends (queue.DefaultMinFreeBytes).
	DefaultMinFreeDiskBytes = queue.DefaultMinFreeBytes
	// DefaultLogLevel and DefaultLogFormat are log/slog's usual defaults.
	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
	// DefaultSocketMode lets the sidecar's user and group use a unix socket
	// on a volume shared with the producer's container.
	DefaultSocketMode = "0660"
	// DefaultRetryBudgetRatio, DefaultRetryBudgetMinPerSecond and
	// DefaultRetryBudgetWindow are the shared retry budget of the DESIGN.md
	// §4 example config: retries within the last 10 s may reach 10% of the
	// successes in them, plus a floor of 10 retries/s (DESIGN.md §1).
	DefaultRetryBudgetRatio        = policy.DefaultBudgetRatio
	DefaultRetryBudgetMinPerSecond = policy.DefaultBudgetMinPerSecond
	DefaultRetryBudgetWindow       = policy.DefaultBudgetWindow
)

// Defaults of a subscription, applied by LoadConfig to the fields a
// subscription leaves at zero.
const (
	// DefaultTimeout bounds one HTTP exchange. With 10 s a black-hole
	// endpoint at 100 events/s holds 1,000 slots, the figure DESIGN.md §1
	// works with; the per-subscription cap stops it from holding more.
	DefaultTimeout = proxy.DefaultTimeout
	// DefaultConcurrency is a subscription's cap on in-flight deliveries
	// (DESIGN.md §4 example config).
	DefaultConcurrency = proxy.DefaultMaxConcurrency
	// DefaultAutoConcurrencyMin, DefaultAutoConcurrencyMax and
	// DefaultAutoConcurrencyHeadroom bound the cap that concurrency: auto
	// derives from Little's law, λ·P99 + headroom (DESIGN.md §5 item 5;
	// values from issue 4, max and headroom as in the DESIGN.md §4 example).
	DefaultAutoConcurrencyMin      = policy.DefaultAutoCapMin
	DefaultAutoConcurrencyMax      = policy.DefaultAutoCapMax
	DefaultAutoConcurrencyHeadroom = policy.DefaultAutoCapHeadroom
	// DefaultBreaker* configure a subscription's breaker (DESIGN.md §3,
	// "Breaker per subscription"; values from issue 4): it opens when at
	// least half of 20 or more requests in the last 10 s failed, or after 5
	// timeouts in a row, and stays open 5 s, doubling up to 5 min while the
	// probes keep failing.
	DefaultBreakerFailureRatio        = policy.DefaultBreakerFailureRatio
	DefaultBreakerMinRequests         = policy.DefaultBreakerMinRequests
	DefaultBreakerWindow              = policy.DefaultBreakerWindow
	DefaultBreakerConsecutiveTimeouts = policy.DefaultBreakerConsecutiveTimeouts
	DefaultBreakerCoolDown            = policy.DefaultBreakerCoolDown
	DefaultBreakerMaxCoolDown         = policy.DefaultBreakerMaxCoolDown
	// DefaultRetryMaxAttempts, DefaultRetryMaxAge, DefaultRetryBase and
	// DefaultRetryCap are the retry schedule of the DESIGN.md §4 example
	// config: 8 attempts within a day, full-jitter backoff from 1 s up to 1 h.
	DefaultRetryMaxAttempts = policy.DefaultMaxAttempts
	DefaultRetryMaxAge      = policy.DefaultMaxAge
	DefaultRetryBase        = policy.DefaultBase
	DefaultRetryCap         = policy.DefaultCap
)

// Values of Config.Durability.
const (
	// DurabilityFsync replies 202 after the append is synced: an accepted
	// event survives power loss.
	DurabilityFsync = "fsync"
	// DurabilityAsync replies 202 before the sync: an accepted event survives
	// a process crash but the last few milliseconds may be lost with power.
	DurabilityAsync = "async"
)

// Limits checked by Validate.
const (
	maxMaxBodyBytes   = 64 << 20
	minMaxDiskBytes   = 64 << 20
	minDedupWindow    = time.Minute
	minTimeout        = time.Millisecond
	maxTimeout        = 5 * time.Minute
	maxConcurrency    = 10000
	maxHeadroom       = 1000
	maxRatePerSecond  = 1e6 // keeps the default burst, ceil(per_second), a sane int
	maxBudgetFloor    = 1e6 // policy.Budget's own bound on min_per_second
	minWindow         = time.Second
	maxWindow         = 10 * time.Minute
	minBacklogMaxAge  = time.Second
	maxRetryAttempts  = 100
	maxSecretFileSize = 1 << 20
	maxUnixPathLen    = 107 // sun_path is 108 bytes including the NUL on Linux
)

// Sentinel errors wrapped by ConfigValidationError.Err; test with errors.Is.
var (
	// ErrUnknownKey means a key in the file, the environment or the overrides
	// does not exist in Config (typos must not be ignored silently).
	ErrUnknownKey = errors.New("unknown key")
	// ErrInvalidValue means a value has the wrong type, format or range.
	ErrInvalidValue = errors.New("invalid value")
	// ErrMissingValue means a required value is absent or empty.
	ErrMissingValue = errors.New("missing value")
	// ErrDuplicate means a value that must be unique appears twice.
	ErrDuplicate = errors.New("duplicate value")
	// ErrConflict means keys that exclude each other are set together.
	ErrConflict = errors.New("conflicting keys")
)

// envPrefix marks the environment variables LoadConfig reads.
const envPrefix = "SLUICE_"

// envConfigFile names the config file when --config is not given, so that
// `sluice healthcheck` in a container finds the same file as `serve`.
const envConfigFile = "SLUICE_CONFIG"

// redactedText replaces secrets, tokens and sensitive header values wherever
// a Config or an error is printed.
const redactedText = "[redacted]"

var (
	idPattern        = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	typePattern      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
	envNamePattern   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	classifyOutcomes = []string{"ack", "retry", "dead_letter"}
	durationType     = reflect.TypeFor[time.Duration]()
)

// Config is the whole configuration of the sidecar (DESIGN.md §4). The koanf
// tags are the YAML keys; environment variables use the same names with the
// SLUICE_ prefix and "__" for nesting. Build one with LoadConfig; a Config
// built by hand must start from DefaultConfig and pass Validate.
//
// Printing a Config (String, %v, %#v, log/slog, encoding/json) never shows a
// secret or the admin token.
type Config struct {
	// Listen is the ingest address: "host:port" or "unix:///abs/path.sock".
	// Default DefaultListen.
	Listen string `koanf:"listen"`
	// Admin configures the admin API listener.
	Admin AdminConfig `koanf:"admin"`
	// DataDir holds the queue. Default DefaultDataDir.
	DataDir string `koanf:"data_dir"`
	// Durability is DurabilityFsync (default) or DurabilityAsync.
	Durability string `koanf:"durability"`
	// MaxBodyBytes is the largest accepted event body in bytes, 1 to 64 MiB.
	// Default DefaultMaxBodyBytes.
	MaxBodyBytes int `koanf:"max_body_bytes"`
	// Ingest bounds what producers may hold of the ingest listener.
	Ingest IngestConfig `koanf:"ingest"`
	// DedupWindow is how long an event id is remembered for idempotent
	// ingest; at least one minute. Default DefaultDedupWindow.
	DedupWindow time.Duration `koanf:"dedup_window"`
	// ShutdownGrace is how long in-flight deliveries may finish after the
	// first SIGTERM. Default DefaultShutdownGrace.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
	// MaxConnsPerHost caps outbound connections per endpoint host. Default
	// DefaultMaxConnsPerHost.
	MaxConnsPerHost int `koanf:"max_conns_per_host"`
	// MaxInFlight caps concurrent outbound requests of the whole process.
	// Default DefaultMaxInFlight.
	MaxInFlight int `koanf:"max_in_flight"`
	// MaxDiskBytes is the disk quota of the log in data_dir; past it ingest
	// answers 507. 0 (default) means no quota.
	MaxDiskBytes int64 `koanf:"max_disk_bytes"`
	// MinFreeDiskBytes is the free space ingest leaves on data_dir's file
	// system (507 below it). Default DefaultMinFreeDiskBytes; 0 disables
	// the floor, which risks a crash on a full disk (see RELIABILITY.md).
	MinFreeDiskBytes int64 `koanf:"min_free_disk_bytes"`
	// AllowPrivateTargets lets subscriptions deliver to loopback, private,
	// link-local (cloud metadata) and other non-public addresses. Off by
	// default: the check runs when each connection is made, so DNS cannot
	// route around it. Turn it on for receivers on the same host or network.
	AllowPrivateTargets bool `koanf:"allow_private_targets"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `koanf:"log_level"`
	// LogFormat is text (default) or json.
	LogFormat string `koanf:"log_format"`
	// SocketMode is the file mode of unix-socket listeners, in octal
	// ("0660" by default: the owner and a group shared with the producer).
	SocketMode string `koanf:"socket_mode"`
	// RetryBudget bounds the retries of all subscriptions together.
	RetryBudget RetryBudgetConfig `koanf:"retry_budget"`
	// Subscriptions are the endpoints events are delivered to. They can be
	// set in the file or the overrides, not in the environment.
	Subscriptions []SubscriptionConfig `koanf:"subscriptions"`

	// IgnoredEnv names SLUICE_* variables that are no config key. They are
	// not errors: Kubernetes injects SLUICE_PORT and friends for a Service
	// named sluice, and a sidecar must not refuse to start over that. The
	// caller logs them.
	IgnoredEnv []string `koanf:"-" json:"-"`

	// lookupEnv resolves secret_env references; LoadConfig points it at its
	// environ argument, nil means os.LookupEnv.
	lookupEnv func(string) (string, bool)
}

// envKeys is every config key the environment may set.
var envKeys = func() map[string]bool {
	keys := map[string]bool{}
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("koanf")
			if tag == "" || tag == "-" || tag == "subscriptions" {
				continue
			}
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
				walk(f.Type, prefix+tag+".")
				continue
			}
			keys[prefix+tag] = true
		}
	}
	walk(reflect.TypeFor[Config](), "")
	return keys
}()

// RetryBudgetConfig is the retry budget shared by every subscription
// (DESIGN.md §1): retries within the last Window may reach Ratio times the
// successes within it (a 4xx counts: the endpoint answered), plus
// MinPerSecond per second. A retry over budget is deferred, not dropped.
type RetryBudgetConfig struct {
	// Ratio is how many retries each success earns, 0..1; 0 leaves only the
	// MinPerSecond floor. Default DefaultRetryBudgetRatio.
	Ratio float64 `koanf:"ratio"`
	// MinPerSecond is the floor, in retries per second, 0..1,000,000.
	// Default DefaultRetryBudgetMinPerSecond.
	MinPerSecond float64 `koanf:"min_per_second"`
	// Window is how far back successes and retries count, 1s..10m. Default
	// DefaultRetryBudgetWindow.
	Window time.Duration `koanf:"window"`
}

// IngestConfig protects the ingest listener from slow, stuck or flooding
// producers (proxy.IngestLimits).
type IngestConfig struct {
	// HeaderTimeout: the request line and headers must arrive within it,
	// from their first byte (a slowloris gets 408); 100ms..10m.
	HeaderTimeout time.Duration `koanf:"header_timeout"`
	// BodyTimeout: the body must arrive within it once the headers are in;
	// 1s..1h.
	BodyTimeout time.Duration `koanf:"body_timeout"`
	// IdleTimeout closes keep-alive connections idle this long; 1s..1h.
	IdleTimeout time.Duration `koanf:"idle_timeout"`
	// MaxHeaderBytes bounds the request line plus headers (431 past it);
	// 1 KiB..1 MiB. Each connection keeps a buffer this size.
	MaxHeaderBytes int `koanf:"max_header_bytes"`
	// MaxConnections caps open connections, idle ones included; past it a
	// new connection is answered 503 and closed. 16..1,000,000.
	MaxConnections int `koanf:"max_connections"`
}

func (ic IngestConfig) validate() error {
	for _, c := range []struct {
		key       string
		v, lo, hi time.Duration
	}{
		{"ingest.header_timeout", ic.HeaderTimeout, 100 * time.Millisecond, 10 * time.Minute},
		{"ingest.body_timeout", ic.BodyTimeout, time.Second, time.Hour},
		{"ingest.idle_timeout", ic.IdleTimeout, time.Second, time.Hour},
	} {
		if c.v < c.lo || c.v > c.hi {
			return fieldErr(c.key, c.v, invalidf("must be between %v and %v", c.lo, c.hi))
		}
	}
	if ic.MaxHeaderBytes < 1<<10 || ic.MaxHeaderBytes > 1<<20 {
		return fieldErr("ingest.max_header_bytes", ic.MaxHeaderBytes, invalidf("must be between 1024 and 1048576"))
	}
	if ic.MaxConnections < 16 || ic.MaxConnections > 1_000_000 {
		return fieldErr("ingest.max_connections", ic.MaxConnections, invalidf("must be between 16 and 1000000"))
	}
	return nil
}

// AdminConfig configures the admin API listener.
type AdminConfig struct {
	// Listen is "host:port" or "unix:///abs/path.sock". Default
	// DefaultAdminListen.
	Listen string `koanf:"listen"`
	// Token, when set, is the bearer token the admin API requires. Set
	// Token or TokenFile, not both; neither means no authentication (the
	// listener is on loopback by default).
	Token string `koanf:"token" json:"-"`
	// TokenFile names a file holding the token; surrounding whitespace is
	// ignored.
	TokenFile string `koanf:"token_file"`

	// ResolvedToken is the token from Token or TokenFile, filled in by
	// Validate so callers never read the file again. Empty means no token.
	ResolvedToken string `koanf:"-" json:"-"`
}

// SubscriptionConfig is one endpoint and its delivery policy. LoadConfig
// fills fields left at zero with the Default* subscription constants.
type SubscriptionConfig struct {
	// ID names the subscription in metrics, logs and the admin API; it
	// matches ^[a-z0-9][a-z0-9._-]{0,63}$ and is unique.
	ID string `koanf:"id"`
	// URL is the absolute http or https endpoint; no userinfo, no fragment.
	URL string `koanf:"url"`

	// Exactly one of Secret, Secrets, SecretFile and SecretEnv must be set.
	// Every secret is a Standard Webhooks "whsec_<base64>" key; all of them
	// sign every delivery, which is how secrets are rotated.

	// Secret is one secret.
	Secret string `koanf:"secret" json:"-"`
	// Secrets are several secrets, all active.
	Secrets []string `koanf:"secrets" json:"-"`
	// SecretFile names a file with one secret per line; blank lines and
	// lines starting with # are ignored. Relative paths are relative to the
	// working directory, like DataDir.
	SecretFile string `koanf:"secret_file"`
	// SecretEnv names an environment variable holding one or more secrets
	// separated by whitespace.
	SecretEnv string `koanf:"secret_env"`

	// Types are the event types delivered: names matching
	// ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$, or "*" alone for all. Default
	// ["*"].
	Types []string `koanf:"types"`
	// Timeout bounds one HTTP exchange, 1ms to 5m. Default DefaultTimeout.
	Timeout time.Duration `koanf:"timeout"`
	// Rate limits how fast deliveries start. The zero RateConfig (rate
	// omitted) means no limit.
	Rate RateConfig `koanf:"rate"`
	// Concurrency caps in-flight deliveries.
	Concurrency ConcurrencyConfig `koanf:"concurrency"`
	// Retry is the retry schedule.
	Retry RetryConfig `koanf:"retry"`
	// Backlog bounds the events waiting for this subscription; past it the
	// oldest are dead-lettered. The zero BacklogConfig means no bound.
	Backlog BacklogConfig `koanf:"backlog"`
	// Breaker stops deliveries to an endpoint that keeps failing.
	Breaker BreakerConfig `koanf:"breaker"`
	// Headers are added to every delivery. They may not replace the headers
	// sluice sets itself (webhook-*, Idempotency-Key, X-Event-Type,
	// X-Attempt, Content-Type, Content-Length, Host) nor hop-by-hop headers.
	Headers map[string]string `koanf:"headers"`
	// Classify overrides the default response classification: status code
	// ("100".."599") → "ack", "retry" or "dead_letter".
	Classify map[string]string `koanf:"classify"`
	// Paused starts the subscription paused; events are kept for it.
	Paused bool `koanf:"paused"`

	// Resolved holds the parsed secrets from whichever source is set, filled
	// in by Validate so callers never read files or the environment again.
	Resolved []signing.Secret `koanf:"-" json:"-"`

	// explicit records which keys the source spelled out where leaving a
	// key out differs from setting it to zero; see keySet.
	explicit keySet
}

// RateConfig is a subscription's token bucket: deliveries start at most
// PerSecond per second on average, and up to Burst at once after a pause.
type RateConfig struct {
	// PerSecond is the rate, greater than 0 and at most 1,000,000. Zero,
	// with Burst zero, means no limit; an explicit 0 is an error.
	PerSecond float64 `koanf:"per_second"`
	// Burst is the bucket size, at least 1. Default ceil(PerSecond), at
	// least 1.
	Burst int `koanf:"burst"`
}

// ConcurrencyConfig caps a subscription's in-flight deliveries: at Max, or,
// with Auto, at a cap derived from Little's law (rate · P99 latency +
// Headroom) and kept within Min..Max.
type ConcurrencyConfig struct {
	// Auto derives the cap from the measured rate and latency.
	Auto bool `koanf:"auto"`
	// Min is the lowest cap Auto may set, 1..10000 and at most Max. Only
	// with Auto. Default DefaultAutoConcurrencyMin.
	Min int `koanf:"min"`
	// Max is the cap, or with Auto the highest cap, 1..10000. Default
	// DefaultConcurrency, or DefaultAutoConcurrencyMax with Auto.
	Max int `koanf:"max"`
	// Headroom is the slots Auto adds to λ·P99, 0..1000. Only with Auto.
	// Default DefaultAutoConcurrencyHeadroom.
	Headroom int `koanf:"headroom"`
}

// BacklogConfig is a subscription's backlog quota. Zero fields mean no
// limit.
type BacklogConfig struct {
	// MaxEvents is the most events waiting for the subscription, 0 or more.
	MaxEvents int64 `koanf:"max_events"`
	// MaxAge is how long an event may wait, 0 or at least 1s.
	MaxAge time.Duration `koanf:"max_age"`
}

// BreakerConfig is a subscription's circuit breaker: closed → open on a
// failure threshold → half-open single probe → closed (DESIGN.md §3).
type BreakerConfig struct {
	// FailureRatio opens the breaker when this share of the requests in
	// Window failed, greater than 0 and at most 1. Default
	// DefaultBreakerFailureRatio.
	FailureRatio float64 `koanf:"failure_ratio"`
	// MinRequests is how many requests Window must hold before FailureRatio
	// applies, at least 1. Default DefaultBreakerMinRequests.
	MinRequests int `koanf:"min_requests"`
	// Window is how far back requests are counted, 1s..10m. Default
	// DefaultBreakerWindow.
	Window time.Duration `koanf:"window"`
	// ConsecutiveTimeouts opens the breaker after this many timeouts in a
	// row, at least 1. Default DefaultBreakerConsecutiveTimeouts.
	ConsecutiveTimeouts int `koanf:"consecutive_timeouts"`
	// CoolDown is how long the breaker stays open before a probe, positive
	// and at most MaxCoolDown. Default DefaultBreakerCoolDown.
	CoolDown time.Duration `koanf:"cool_down"`
	// MaxCoolDown bounds CoolDown as it grows while probes fail, positive.
	// Default DefaultBreakerMaxCoolDown.
	MaxCoolDown time.Duration `koanf:"max_cool_down"`
}

// keySet records which keys of a subscription its source spelled out, for
// the keys where leaving the key out (take the default, or no limit) and
// setting it to zero (an error, or a zero that stands) must differ. The
// zero value of the field alone cannot tell. decodeSubs and LoadConfig fill
// it from the parsed source; applyDefaults and Validate read it. A Config
// built by hand has none, so there only the values count.
type keySet uint16

const (
	keyRatePerSecond keySet = 1 << iota
	keyRateBurst
	keyConcurrencyMin
	keyConcurrencyHeadroom
	keyBreakerFailureRatio
	keyBreakerMinRequests
	keyBreakerWindow
	keyBreakerConsecutiveTimeouts
	keyBreakerCoolDown
	keyBreakerMaxCoolDown
)

// trackedKeys maps a subscription's sections to the keys in them that
// keySet records.
var trackedKeys = []struct {
	section string
	keys    map[string]keySet
}{
	{"rate", map[string]keySet{"per_second": keyRatePerSecond, "burst": keyRateBurst}},
	{"concurrency", map[string]keySet{"min": keyConcurrencyMin, "headroom": keyConcurrencyHeadroom}},
	{"breaker", map[string]keySet{
		"failure_ratio":        keyBreakerFailureRatio,
		"min_requests":         keyBreakerMinRequests,
		"window":               keyBreakerWindow,
		"consecutive_timeouts": keyBreakerConsecutiveTimeouts,
		"cool_down":            keyBreakerCoolDown,
		"max_cool_down":        keyBreakerMaxCoolDown,
	}},
}

func (k keySet) has(key keySet) bool { return k&key != 0 }

// explicitKeys returns the tracked keys that one parsed subscription sets
// to a value; a key set to null (burst: ~) counts as left out, as it
// decodes to nothing.
func explicitKeys(raw any) keySet {
	m, ok := raw.(map[string]any)
	if !ok {
		return 0
	}
	var set keySet
	for _, t := range trackedKeys {
		sec, ok := m[t.section].(map[string]any)
		if !ok {
			continue
		}
		for key, v := range sec {
			if bit, ok := t.keys[key]; ok && v != nil {
				set |= bit
			}
		}
	}
	return set
}

// markExplicit records explicitKeys for subs decoded from raw, the parsed
// list (a []any of maps, or any other slice of maps from the overrides).
func markExplicit(subs []SubscriptionConfig, raw any) {
	v := reflect.ValueOf(raw)
	if v.Kind() != reflect.Slice {
		return
	}
	for i := range min(v.Len(), len(subs)) {
		subs[i].explicit = explicitKeys(v.Index(i).Interface())
	}
}

// RetryConfig is a subscription's retry schedule: full-jitter backoff
// uniform(0, min(Cap, Base·2^(attempt-1))) until MaxAttempts or MaxAge.
type RetryConfig struct {
	// MaxAttempts counts every attempt including the first, 1..100.
	// Default DefaultRetryMaxAttempts.
	MaxAttempts int `koanf:"max_attempts"`
	// MaxAge is how long after the first attempt retries may continue.
	// Default DefaultRetryMaxAge.
	MaxAge time.Duration `koanf:"max_age"`
	// Base is the first backoff step. Default DefaultRetryBase.
	Base time.Duration `koanf:"base"`
	// Cap is the largest backoff; Base <= Cap. Default DefaultRetryCap.
	Cap time.Duration `koanf:"cap"`
}

// DefaultConfig returns the configuration sluice runs with when no file,
// environment variable or flag says otherwise. It has no subscriptions.
func DefaultConfig() *Config {
	return &Config{
		Listen:       DefaultListen,
		Admin:        AdminConfig{Listen: DefaultAdminListen},
		DataDir:      DefaultDataDir,
		Durability:   DefaultDurability,
		MaxBodyBytes: DefaultMaxBodyBytes,
		Ingest: IngestConfig{
			HeaderTimeout:  proxy.DefaultIngestHeaderTimeout,
			BodyTimeout:    proxy.DefaultIngestBodyTimeout,
			IdleTimeout:    proxy.DefaultIngestIdleTimeout,
			MaxHeaderBytes: proxy.DefaultIngestMaxHeaderBytes,
			MaxConnections: proxy.DefaultIngestMaxConnections,
		},
		DedupWindow:      DefaultDedupWindow,
		ShutdownGrace:    DefaultShutdownGrace,
		MaxConnsPerHost:  DefaultMaxConnsPerHost,
		MaxInFlight:      DefaultMaxInFlight,
		MinFreeDiskBytes: DefaultMinFreeDiskBytes,
		LogLevel:         DefaultLogLevel,
		LogFormat:        DefaultLogFormat,
		SocketMode:       DefaultSocketMode,
		RetryBudget: RetryBudgetConfig{
			Ratio:        DefaultRetryBudgetRatio,
			MinPerSecond: DefaultRetryBudgetMinPerSecond,
			Window:       DefaultRetryBudgetWindow,
		},
	}
}

// ConfigValidationError reports one bad configuration value. Err wraps one of
// ErrUnknownKey, ErrInvalidValue, ErrMissingValue, ErrDuplicate or
// ErrConflict, and sometimes a cause such as signing.ErrBadSecret.
type ConfigValidationError struct {
	// Field is the key path, e.g. "durability", "admin.listen",
	// "subscriptions[2].url" or "subscriptions[0].classify[409]".
	Field string
	// Value is the offending value, or nil when there is none to show. It is
	// never a secret or token: those are replaced by "[redacted]", and URLs
	// lose their userinfo and query values.
	Value any
	// Err says what is wrong.
	Err error
	// Source says where the value came from when LoadConfig knows it:
	// `file "sluice.yaml"`, "environment variable SLUICE_LISTEN" or "flags".
	// Empty for defaults and for Validate called directly.
	Source string
}

// Error reads like
//
//	config: subscriptions[2].url: "ftp://x": must be http or https
//	config: unknown key "subscriptions[0].colour" (in file "sluice.yaml")
func (e *ConfigValidationError) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if errors.Is(e.Err, ErrUnknownKey) {
		fmt.Fprintf(&b, "unknown key %q", e.Field)
	} else {
		if e.Field != "" {
			b.WriteString(e.Field)
			b.WriteString(": ")
		}
		if e.Value != nil {
			b.WriteString(formatValue(e.Field, e.Value))
			b.WriteString(": ")
		}
		if e.Err != nil {
			b.WriteString(e.Err.Error())
		} else {
			b.WriteString("invalid")
		}
	}
	if e.Source != "" {
		switch {
		case strings.HasPrefix(e.Source, "file "):
			b.WriteString(" (in ")
		default:
			b.WriteString(" (from ")
		}
		b.WriteString(e.Source)
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns Err.
func (e *ConfigValidationError) Unwrap() error { return e.Err }

// reason is the Err of a ConfigValidationError built here: its text is the
// plain explanation ("must be http or https") while errors.Is still finds the
// sentinel kind and the cause.
type reason struct {
	kind  error
	msg   string
	cause error
	value any // offending value, for errors raised inside the decode hook
}

func (r *reason) Error() string { return r.msg }

func (r *reason) Unwrap() []error {
	if r.cause != nil {
		return []error{r.kind, r.cause}
	}
	return []error{r.kind}
}

func newReason(kind error, format string, args ...any) *reason {
	return &reason{kind: kind, msg: fmt.Sprintf(format, args...)}
}

func invalidf(format string, args ...any) *reason {
	return newReason(ErrInvalidValue, format, args...)
}

func fieldErr(field string, value any, err error) *ConfigValidationError {
	if value != nil && isSensitiveField(field) {
		value = redactedText
	}
	return &ConfigValidationError{Field: field, Value: value, Err: err}
}

// LoadConfig builds a Config from, later sources winning:
//
//  1. DefaultConfig;
//  2. the file at path, unless path is "": YAML, or JSON when its name
//     ends in .json;
//  3. environ (pass os.Environ()): variables named SLUICE_<KEY>, lowercased,
//     with "__" for nesting: SLUICE_DATA_DIR sets data_dir,
//     SLUICE_ADMIN__LISTEN sets admin.listen. Subscriptions cannot be set
//     from the environment;
//  4. overrides, usually from flags: keys are paths like "listen" or
//     "admin.listen" (or nested maps), values strings or typed values.
//
// Unknown keys are errors in every source, durations must be strings with a
// unit ("10s"), and each subscription's zero fields get the subscription
// defaults. secret_env references are looked up in environ. The result has
// passed Validate. Errors are *ConfigValidationError, except that a missing
// or unreadable file and malformed YAML return an error naming the file (and
// the line).
func LoadConfig(path string, environ []string, overrides map[string]any) (*Config, error) {
	var ls []layer
	var subs *rawSubs

	if path != "" {
		b, err := file.Provider(path).ReadBytes()
		if err != nil {
			return nil, fmt.Errorf("config: read file: %w", err)
		}
		var m map[string]any
		if isJSONConfig(path) {
			m, err = parseJSONConfig(b)
		} else if m, err = yaml.Parser().Unmarshal(b); err != nil {
			err = errors.New(redactYAMLError(err))
		}
		if err != nil {
			return nil, fmt.Errorf("config: parse file %q: %w", path, err)
		}
		src := fmt.Sprintf("file %q", path)
		// Subscriptions bypass koanf's layers: only the file (or an
		// override) sets them, and koanf deep-copies a map on every merge
		// and read, which made 50,000 subscriptions take seconds to load.
		if raw, ok := m["subscriptions"]; ok {
			subs = &rawSubs{raw: raw, source: src}
			delete(m, "subscriptions")
		}
		k := koanf.New(".")
		if err := k.Load(confmap.Provider(m, ""), nil); err != nil {
			return nil, fmt.Errorf("config: load file %q: %w", path, err)
		}
		ls = append(ls, layer{k: k, source: func(string) string { return src }})
	}

	envLayer, err := loadEnv(environ)
	if err != nil {
		return nil, err
	}
	ls = append(ls, envLayer)

	if len(overrides) > 0 {
		clean := make(map[string]any, len(overrides))
		for key, v := range overrides {
			if v != nil { // an unset flag must not erase a lower layer
				clean[key] = v
			}
		}
		k := koanf.New(".")
		if err := k.Load(confmap.Provider(clean, "."), nil); err != nil {
			return nil, fmt.Errorf("config: load overrides: %w", err)
		}
		ls = append(ls, layer{k: k, source: func(string) string { return "flags" }})
	}

	// Check each source alone first so an unknown key or a badly typed value
	// is reported with the file or variable it came from.
	merged := koanf.New(".")
	for _, l := range ls {
		if err := l.check(); err != nil {
			return nil, err
		}
		if err := merged.Merge(l.k); err != nil {
			return nil, fmt.Errorf("config: merge: %w", err)
		}
	}

	cfg := DefaultConfig()
	if err := decode(merged, cfg); err != nil {
		return nil, err
	}
	if subs != nil && !merged.Exists("subscriptions") {
		if err := subs.decode(cfg); err != nil {
			return nil, err
		}
	} else {
		subs = nil
		if len(cfg.Subscriptions) > 0 { // from the overrides
			markExplicit(cfg.Subscriptions, merged.Get("subscriptions"))
		}
	}
	cfg.applyDefaults()
	cfg.lookupEnv = envLookup(environ)
	cfg.IgnoredEnv = envLayer.ignored

	if err := cfg.Validate(); err != nil {
		var ve *ConfigValidationError
		if errors.As(err, &ve) && ve.Source == "" {
			ve.Source = sourceOf(ls, ve.Field)
			if subs != nil && koanfKey(ve.Field) == "subscriptions" {
				ve.Source = subs.source
			}
		}
		return nil, err
	}
	return cfg, nil
}

// rawSubs is the file's subscriptions list as YAML parsed it.
type rawSubs struct {
	raw    any
	source string
}

// decode checks the list for unknown keys and decodes it into cfg, both
// straight from the parsed YAML, without copies. A long list is decoded in
// chunks on every core; on any error the whole list is decoded again in one
// piece, so the message names the right index.
func (r *rawSubs) decode(cfg *Config) error {
	list, ok := r.raw.([]any)
	if n := runtime.GOMAXPROCS(0); ok && n > 1 && len(list) >= 4096 {
		chunks := make([][]SubscriptionConfig, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			part := list[len(list)*i/n : len(list)*(i+1)/n]
			wg.Go(func() { chunks[i], errs[i] = decodeSubs(part, r.source) })
		}
		wg.Wait()
		if errors.Join(errs...) == nil {
			cfg.Subscriptions = slices.Concat(chunks...)
			return nil
		}
	}
	subs, err := decodeSubs(r.raw, r.source)
	if err != nil {
		return err
	}
	cfg.Subscriptions = subs
	return nil
}

func decodeSubs(raw any, source string) ([]SubscriptionConfig, error) {
	in := map[string]any{"subscriptions": raw}
	if key := unknownKey("", in, reflect.TypeFor[Config]()); key != "" {
		return nil, &ConfigValidationError{Field: key, Err: ErrUnknownKey, Source: source}
	}
	var out struct {
		Subscriptions []SubscriptionConfig `koanf:"subscriptions"`
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
		ErrorUnused: true,
		TagName:     "koanf",
		MatchName:   func(key, field string) bool { return key == field },
		Result:      &out,
	})
	if err != nil {
		return nil, err
	}
	if err := dec.Decode(in); err != nil {
		err = translateDecodeError(err)
		var ve *ConfigValidationError
		if errors.As(err, &ve) {
			ve.Source = source
		}
		return nil, err
	}
	markExplicit(out.Subscriptions, raw)
	return out.Subscriptions, nil
}

// layer is one configuration source and a way to name where a key came from.
type layer struct {
	k       *koanf.Koanf
	source  func(key string) string
	ignored []string // environment variables that name no key
}

// check reports the first unknown key of the layer, then the first value
// that does not decode into Config.
func (l layer) check() error {
	if key := unknownKey("", l.k.Raw(), reflect.TypeFor[Config]()); key != "" {
		return &ConfigValidationError{Field: key, Err: ErrUnknownKey, Source: l.source(koanfKey(key))}
	}
	if err := decode(l.k, DefaultConfig()); err != nil {
		var ve *ConfigValidationError
		if errors.As(err, &ve) {
			ve.Source = l.source(koanfKey(ve.Field))
		}
		return err
	}
	return nil
}

// sourceOf names the highest layer that sets field, or "" for defaults.
func sourceOf(ls []layer, field string) string {
	key := koanfKey(field)
	for i := len(ls) - 1; i >= 0; i-- {
		if key != "" && ls[i].k.Exists(key) {
			return ls[i].source(key)
		}
	}
	return ""
}

// koanfKey turns a field path into the koanf key that holds it: list
// elements and map entries belong to the key of their list or map.
func koanfKey(field string) string {
	if i := strings.IndexByte(field, '['); i >= 0 {
		return field[:i]
	}
	return field
}

// loadEnv reads the SLUICE_* variables of environ into a layer.
func loadEnv(environ []string) (layer, error) {
	names := map[string]string{} // koanf key → variable name
	var bad []*ConfigValidationError
	var ignored []string
	transform := func(name, value string) (string, any) {
		rest := strings.TrimPrefix(name, envPrefix)
		if rest == "" {
			return "", nil
		}
		parts := strings.Split(strings.ToLower(rest), "__")
		for _, p := range parts {
			if p == "" || strings.Contains(p, ".") {
				bad = append(bad, &ConfigValidationError{
					Field:  strings.ToLower(rest),
					Err:    invalidf("cannot be mapped to a key: use letters, digits, _ and __ for nesting"),
					Source: "environment variable " + name,
				})
				return "", nil
			}
		}
		if parts[0] == "subscriptions" {
			bad = append(bad, &ConfigValidationError{
				Field:  "subscriptions",
				Err:    invalidf("cannot be set from the environment; use the config file"),
				Source: "environment variable " + name,
			})
			return "", nil
		}
		key := strings.Join(parts, ".")
		if name == envConfigFile {
			return "", nil // names the file itself, read by main
		}
		if !envKeys[key] {
			ignored = append(ignored, name)
			return "", nil
		}
		names[key] = name
		return key, value
	}

	k := koanf.New(".")
	err := k.Load(env.Provider(".", env.Opt{
		Prefix:        envPrefix,
		TransformFunc: transform,
		EnvironFunc:   func() []string { return environ },
	}), nil)
	if err != nil {
		return layer{}, fmt.Errorf("config: read environment: %w", err)
	}
	if len(bad) > 0 {
		sort.Slice(bad, func(i, j int) bool { return bad[i].Source < bad[j].Source })
		return layer{}, bad[0]
	}
	sort.Strings(ignored)
	return layer{k: k, ignored: ignored, source: func(key string) string {
		for k := key; k != ""; {
			if n, ok := names[k]; ok {
				return "environment variable " + n
			}
			// A variable may set a parent ("admin") of the reported key.
			i := strings.LastIndexByte(k, '.')
			if i < 0 {
				break
			}
			k = k[:i]
		}
		// Or a child: SLUICE_ADMIN__LISTEN for a problem reported at "admin".
		for k, n := range names {
			if strings.HasPrefix(k, key+".") {
				return "environment variable " + n
			}
		}
		return "the environment"
	}}, nil
}

// envLookup returns a lookup over environ; the last definition wins, as in
// os/exec.
func envLookup(environ []string) func(string) (string, bool) {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

// decode unmarshals k onto out (which holds the defaults) strictly: unknown
// keys are errors, keys match tags exactly, durations need a unit.
func decode(k *koanf.Koanf, out *Config) error {
	err := k.UnmarshalWithConf("", out, koanf.UnmarshalConf{
		DecoderConfig: &mapstructure.DecoderConfig{
			DecodeHook:  mapstructure.DecodeHookFuncType(decodeHook),
			ErrorUnused: true,
			TagName:     "koanf",
			MatchName:   func(key, field string) bool { return key == field },
			Result:      out,
		},
	})
	if err != nil {
		return translateDecodeError(err)
	}
	return nil
}

// decodeHook converts the values YAML, the environment and flags produce into
// Config's field types. Durations must be strings with a unit: a bare 10
// would silently mean 10 ns. Strings from the environment become integers,
// floats and booleans; integers and booleans become strings (headers:
// {X-Version: 2}); a fractional number is never truncated into an integer.
// An integer for a float field (ratio: 1) needs no hook: mapstructure
// converts it.
func decodeHook(from, to reflect.Type, data any) (any, error) {
	switch {
	case to == durationType:
		return decodeDuration(from, data)
	case from.Kind() == reflect.String && isIntKind(to.Kind()):
		s := strings.TrimSpace(reflect.ValueOf(data).String())
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be an integer", value: data}
		}
		return n, nil
	case from.Kind() == reflect.String && isFloatKind(to.Kind()):
		f, err := strconv.ParseFloat(strings.TrimSpace(reflect.ValueOf(data).String()), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be a number", value: data}
		}
		return f, nil
	case from.Kind() == reflect.String && to.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(strings.TrimSpace(reflect.ValueOf(data).String()))
		if err != nil {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be true or false", value: data}
		}
		return b, nil
	case isFloatKind(from.Kind()) && isIntKind(to.Kind()):
		f := reflect.ValueOf(data).Float()
		if f != math.Trunc(f) || f > math.MaxInt64 || f < math.MinInt64 {
			return nil, &reason{kind: ErrInvalidValue, msg: "must be a whole number", value: data}
		}
		return int64(f), nil
	case to.Kind() == reflect.String && (isIntKind(from.Kind()) || from.Kind() == reflect.Bool):
		return fmt.Sprint(data), nil
	}
	return data, nil
}

func decodeDuration(from reflect.Type, data any) (any, error) {
	if from == durationType {
		return data, nil // typed overrides
	}
	switch {
	case from.Kind() == reflect.String:
		s := strings.TrimSpace(reflect.ValueOf(data).String())
		d, err := time.ParseDuration(s)
		if err == nil {
			return d, nil
		}
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return nil, &reason{kind: ErrInvalidValue, msg: `duration needs a unit, like "10s" or "1h30m"`, value: data}
		}
		return nil, &reason{kind: ErrInvalidValue, msg: `must be a duration like "10s" or "1h30m"`, value: data}
	case isIntKind(from.Kind()) || isFloatKind(from.Kind()) || isUintKind(from.Kind()):
		return nil, &reason{kind: ErrInvalidValue, msg: `bare number is not a duration: add a unit, like "10s" or "1h30m"`, value: data}
	}
	return data, nil
}

func isIntKind(k reflect.Kind) bool { return k >= reflect.Int && k <= reflect.Int64 }

func isUintKind(k reflect.Kind) bool { return k >= reflect.Uint && k <= reflect.Uintptr }

func isFloatKind(k reflect.Kind) bool { return k == reflect.Float32 || k == reflect.Float64 }

// translateDecodeError turns mapstructure's joined errors into one
// ConfigValidationError for the first failing field (by name).
func translateDecodeError(err error) error {
	var leaves []*mapstructure.DecodeError
	collectDecodeErrors(err, &leaves)
	if len(leaves) == 0 {
		return &ConfigValidationError{Err: invalidf("%v", err)}
	}
	sort.Slice(leaves, func(i, j int) bool { return leaves[i].Name() < leaves[j].Name() })
	de := leaves[0]
	field := de.Name()
	inner := de.Unwrap()

	var r *reason
	if errors.As(inner, &r) {
		return fieldErr(field, scalarValue(r.value), r)
	}
	var ute *mapstructure.UnconvertibleTypeError
	if errors.As(inner, &ute) {
		msg := fmt.Sprintf("expected %s, got %s", describeType(ute.Expected.Type()), describeValue(ute.Value))
		return fieldErr(field, scalarValue(ute.Value), invalidf("%s", msg))
	}
	var pe *mapstructure.ParseError
	if errors.As(inner, &pe) {
		return fieldErr(field, scalarValue(pe.Value), invalidf("expected %s", describeType(pe.Expected.Type())))
	}
	// Two more type errors that mapstructure reports as plain text.
	if inner != nil && strings.HasPrefix(inner.Error(), "source data must be an array or slice") {
		return fieldErr(field, nil, invalidf("expected a list"))
	}
	if inner != nil && strings.HasPrefix(inner.Error(), "expected a map or struct") {
		return fieldErr(field, nil, invalidf("expected a mapping"))
	}
	if inner != nil && strings.HasPrefix(inner.Error(), "has invalid keys: ") {
		// Backstop: unknownKey should have caught this already.
		keys := strings.Split(strings.TrimPrefix(inner.Error(), "has invalid keys: "), ", ")
		return &ConfigValidationError{Field: joinPath(field, keys[0]), Err: ErrUnknownKey}
	}
	msg := "invalid"
	if inner != nil {
		msg = inner.Error()
	}
	return fieldErr(field, nil, invalidf("%s", msg))
}

func collectDecodeErrors(err error, out *[]*mapstructure.DecodeError) {
	switch e := err.(type) {
	case *mapstructure.DecodeError:
		var nested []*mapstructure.DecodeError
		collectDecodeErrors(e.Unwrap(), &nested)
		if len(nested) > 0 {
			*out = append(*out, nested...)
		} else {
			*out = append(*out, e)
		}
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			collectDecodeErrors(x, out)
		}
	case interface{ Unwrap() error }:
		collectDecodeErrors(e.Unwrap(), out)
	}
}

// scalarValue keeps scalars for error messages and drops lists and maps.
func scalarValue(v any) any {
	switch v.(type) {
	case nil, []any, map[string]any, map[any]any:
		return nil
	}
	return v
}

func describeType(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration"
	case t.Kind() == reflect.String:
		return "a string"
	case isIntKind(t.Kind()):
		return "an integer"
	case isFloatKind(t.Kind()):
		return "a number"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.Slice:
		return "a list"
	case t.Kind() == reflect.Map, t.Kind() == reflect.Struct:
		return "a mapping"
	}
	return t.String()
}

func describeValue(v any) string {
	switch v.(type) {
	case nil:
		return "nothing"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	}
	k := reflect.TypeOf(v).Kind()
	if isIntKind(k) || isUintKind(k) || isFloatKind(k) {
		return "a number (quote it to make it a string)"
	}
	return reflect.TypeOf(v).String()
}

// unknownKey returns the path of the first key in v (sorted) that has no
// koanf-tagged field in t, or "".
func unknownKey(path string, v any, t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if m, ok := v.(map[any]any); ok && t.Kind() == reflect.Struct {
		// YAML gives map[any]any when a key is not a string (`0: x`), and
		// mapstructure panics decoding that into a struct (found by
		// FuzzLoadConfig): report the first such key as unknown instead.
		// Maps (classify: {409: ack}) decode such keys fine.
		keys := make([]string, 0, len(m))
		for k := range m {
			if _, isString := k.(string); !isString {
				keys = append(keys, fmt.Sprint(k))
			}
		}
		if len(keys) > 0 {
			return joinPath(path, keyText(slices.Min(keys)))
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return "" // a type error; decode reports it
		}
		for _, key := range slices.Sorted(maps.Keys(m)) {
			f, ok := fieldByKey(t, key)
			if !ok {
				return joinPath(path, keyText(key))
			}
			if bad := unknownKey(joinPath(path, key), m[key], f.Type); bad != "" {
				return bad
			}
		}
	case reflect.Slice:
		s, ok := v.([]any)
		if !ok {
			return ""
		}
		for i, e := range s {
			if bad := unknownKey(fmt.Sprintf("%s[%d]", path, i), e, t.Elem()); bad != "" {
				return bad
			}
		}
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if bad := unknownKey(path+"["+key+"]", m[key], t.Elem()); bad != "" {
				return bad
			}
		}
	}
	return ""
}

// keyText is a key as an error may show it: a secret written where a key
// goes (a misplaced line, "- whsec_...:") is redacted, since the error is
// logged (found by FuzzLoadConfig).
func keyText(key string) string {
	if i := strings.Index(key, "whsec_"); i >= 0 {
		return key[:i] + "whsec_" + redactedText
	}
	return key
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name != "" && name != "-" && name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// applyDefaults fills each subscription's zero fields. It runs after
// decoding because defaults cannot be layered into list elements. Where a
// zero can be meant (concurrency.headroom: 0) or must be reported
// (breaker.failure_ratio: 0), only keys the source left out are filled; see
// keySet.
func (c *Config) applyDefaults() {
	for i := range c.Subscriptions {
		s := &c.Subscriptions[i]
		if len(s.Types) == 0 {
			s.Types = []string{"*"}
		}
		if s.Timeout == 0 {
			s.Timeout = DefaultTimeout
		}
		if r := &s.Rate; r.PerSecond > 0 && r.Burst == 0 && !s.explicit.has(keyRateBurst) {
			r.Burst = max(1, int(math.Ceil(min(r.PerSecond, maxRatePerSecond))))
		}
		if cc := &s.Concurrency; cc.Auto {
			if cc.Max == 0 {
				cc.Max = DefaultAutoConcurrencyMax
			}
			if cc.Min == 0 && !s.explicit.has(keyConcurrencyMin) {
				cc.Min = DefaultAutoConcurrencyMin
			}
			if cc.Headroom == 0 && !s.explicit.has(keyConcurrencyHeadroom) {
				cc.Headroom = DefaultAutoConcurrencyHeadroom
			}
		} else if cc.Max == 0 {
			cc.Max = DefaultConcurrency
		}
		if s.Retry.MaxAttempts == 0 {
			s.Retry.MaxAttempts = DefaultRetryMaxAttempts
		}
		if s.Retry.MaxAge == 0 {
			s.Retry.MaxAge = DefaultRetryMaxAge
		}
		if s.Retry.Base == 0 {
			s.Retry.Base = DefaultRetryBase
		}
		if s.Retry.Cap == 0 {
			s.Retry.Cap = DefaultRetryCap
		}
		b, set := &s.Breaker, s.explicit
		if b.FailureRatio == 0 && !set.has(keyBreakerFailureRatio) {
			b.FailureRatio = DefaultBreakerFailureRatio
		}
		if b.MinRequests == 0 && !set.has(keyBreakerMinRequests) {
			b.MinRequests = DefaultBreakerMinRequests
		}
		if b.Window == 0 && !set.has(keyBreakerWindow) {
			b.Window = DefaultBreakerWindow
		}
		if b.ConsecutiveTimeouts == 0 && !set.has(keyBreakerConsecutiveTimeouts) {
			b.ConsecutiveTimeouts = DefaultBreakerConsecutiveTimeouts
		}
		if b.CoolDown == 0 && !set.has(keyBreakerCoolDown) {
			b.CoolDown = DefaultBreakerCoolDown
		}
		if b.MaxCoolDown == 0 && !set.has(keyBreakerMaxCoolDown) {
			b.MaxCoolDown = DefaultBreakerMaxCoolDown
		}
	}
}

// Validate checks every value and returns the first problem as a
// *ConfigValidationError. It does not fill in defaults. As a side effect it
// resolves secrets into SubscriptionConfig.Resolved (reading secret files and
// secret_env variables) and the admin token into Admin.ResolvedToken, so
// callers never read them again.
func (c *Config) Validate() error {
	if err := validateListen("listen", c.Listen); err != nil {
		return err
	}
	if m, err := strconv.ParseUint(c.SocketMode, 8, 32); err != nil || m > 0o777 || m&0o600 != 0o600 {
		return fieldErr("socket_mode", c.SocketMode, invalidf(`must be an octal file mode like "0660" that lets the owner read and write`))
	}
	if err := validateListen("admin.listen", c.Admin.Listen); err != nil {
		return err
	}
	if c.Admin.Listen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		return fieldErr("admin.listen", c.Admin.Listen, invalidf("must differ from listen"))
	}
	if err := c.Admin.resolveToken(); err != nil {
		return err
	}
	if strings.TrimSpace(c.DataDir) == "" {
		return fieldErr("data_dir", nil, newReason(ErrMissingValue, "must not be empty"))
	}
	if c.Durability != DurabilityFsync && c.Durability != DurabilityAsync {
		return fieldErr("durability", c.Durability, invalidf("must be %q or %q", DurabilityFsync, DurabilityAsync))
	}
	if c.MaxBodyBytes < 1 || c.MaxBodyBytes > maxMaxBodyBytes {
		return fieldErr("max_body_bytes", c.MaxBodyBytes, invalidf("must be between 1 and %d (64 MiB)", maxMaxBodyBytes))
	}
	if err := c.Ingest.validate(); err != nil {
		return err
	}
	if c.DedupWindow < minDedupWindow {
		return fieldErr("dedup_window", c.DedupWindow, invalidf("must be at least %v", minDedupWindow))
	}
	if c.ShutdownGrace < 0 {
		return fieldErr("shutdown_grace", c.ShutdownGrace, invalidf("must not be negative"))
	}
	if c.MaxConnsPerHost < 1 {
		return fieldErr("max_conns_per_host", c.MaxConnsPerHost, invalidf("must be at least 1"))
	}
	if c.MaxInFlight < 1 {
		return fieldErr("max_in_flight", c.MaxInFlight, invalidf("must be at least 1"))
	}
	if c.MaxDiskBytes != 0 && c.MaxDiskBytes < minMaxDiskBytes {
		return fieldErr("max_disk_bytes", c.MaxDiskBytes, invalidf("must be 0 (no quota) or at least %d (64 MiB: the log's own working set)", minMaxDiskBytes))
	}
	if c.MinFreeDiskBytes < 0 {
		return fieldErr("min_free_disk_bytes", c.MinFreeDiskBytes, invalidf("must not be negative (0 disables the floor)"))
	}
	if err := c.RetryBudget.validate(); err != nil {
		return err
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fieldErr("log_level", c.LogLevel, invalidf("must be debug, info, warn or error"))
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fieldErr("log_format", c.LogFormat, invalidf("must be text or json"))
	}

	lookup := c.lookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	seen := make(map[string]int, len(c.Subscriptions))
	for i := range c.Subscriptions {
		s := &c.Subscriptions[i]
		p := fmt.Sprintf("subscriptions[%d]", i)
		if err := s.validate(p, lookup); err != nil {
			return err
		}
		if j, dup := seen[s.ID]; dup {
			return fieldErr(p+".id", s.ID, newReason(ErrDuplicate, "duplicate id: subscriptions[%d] and subscriptions[%d] both use it", j, i))
		}
		if !c.AllowPrivateTargets {
			if why := privateHost(s.URL); why != "" {
				return fieldErr(p+".url", safeURL(s.URL), invalidf("is %s; set allow_private_targets: true to deliver there", why))
			}
		}
		seen[s.ID] = i
	}
	return nil
}

// validate checks the retry budget. The comparisons are written so that NaN
// (YAML .nan) fails them.
func (rb RetryBudgetConfig) validate() error {
	// Zero is refused for both: with no floor a full outage (no successes)
	// would defer every retry until new traffic succeeds, and policy.Budget
	// reads zero as "the default".
	if !(rb.Ratio > 0 && rb.Ratio <= 1) {
		return fieldErr("retry_budget.ratio", rb.Ratio, invalidf("must be above 0 and at most 1"))
	}
	if !(rb.MinPerSecond > 0 && rb.MinPerSecond <= maxBudgetFloor) {
		return fieldErr("retry_budget.min_per_second", rb.MinPerSecond, invalidf("must be above 0 and at most %d", int(maxBudgetFloor)))
	}
	if rb.Window < minWindow || rb.Window > maxWindow {
		return fieldErr("retry_budget.window", rb.Window, invalidf("must be between %v and %v", minWindow, maxWindow))
	}
	return nil
}

// validateListen accepts "host:port" (host may be empty, port 0..65535) and
// "unix:///absolute/path".
func validateListen(field, v string) error {
	if v == "" {
		return fieldErr(field, nil, newReason(ErrMissingValue, "must not be empty"))
	}
	if p, ok := strings.CutPrefix(v, "unix://"); ok {
		switch {
		case !strings.HasPrefix(p, "/"):
			return fieldErr(field, v, invalidf(`unix socket path must be absolute, like "unix:///run/sluice.sock"`))
		case strings.HasSuffix(p, "/"):
			return fieldErr(field, v, invalidf("unix socket path must name a file"))
		case len(p) > maxUnixPathLen:
			return fieldErr(field, v, invalidf("unix socket path is longer than %d bytes", maxUnixPathLen))
		}
		return nil
	}
	host, port, err := net.SplitHostPort(v)
	if err != nil || strings.ContainsAny(host, "/ ") {
		return fieldErr(field, v, invalidf(`must be "host:port" or "unix:///path.sock"`))
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fieldErr(field, v, invalidf("port must be a number from 0 to 65535"))
	}
	return nil
}

func (a *AdminConfig) resolveToken() error {
	a.ResolvedToken = ""
	switch {
	case a.Token != "" && a.TokenFile != "":
		return fieldErr("admin", nil, newReason(ErrConflict, "token and token_file are both set; use one"))
	case a.Token != "":
		if err := checkToken(a.Token); err != nil {
			return fieldErr("admin.token", redactedText, err)
		}
		a.ResolvedToken = a.Token
	case a.TokenFile != "":
		b, err := readSmallFile(a.TokenFile)
		if err != nil {
			return fieldErr("admin.token_file", a.TokenFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" {
			return fieldErr("admin.token_file", a.TokenFile, newReason(ErrMissingValue, "file is empty"))
		}
		if err := checkToken(tok); err != nil {
			return fieldErr("admin.token_file", a.TokenFile, err)
		}
		a.ResolvedToken = tok
	}
	return nil
}

// checkToken requires a token that fits an Authorization header unchanged.
func checkToken(tok string) error {
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			return invalidf("token must be printable ASCII without spaces")
		}
	}
	return nil
}

func (s *SubscriptionConfig) validate(p string, lookup func(string) (string, bool)) error {
	if s.ID == "" {
		return fieldErr(p+".id", nil, newReason(ErrMissingValue, "required"))
	}
	if !idPattern.MatchString(s.ID) {
		return fieldErr(p+".id", s.ID, invalidf("must match %s", idPattern))
	}
	if err := validateURL(p+".url", s.URL); err != nil {
		return err
	}
	if err := s.resolveSecrets(p, lookup); err != nil {
		return err
	}

	if len(s.Types) == 0 {
		return fieldErr(p+".types", nil, newReason(ErrMissingValue, `must list event types or "*"`))
	}
	types := make(map[string]bool, len(s.Types))
	for i, t := range s.Types {
		f := fmt.Sprintf("%s.types[%d]", p, i)
		if t != "*" && !typePattern.MatchString(t) {
			return fieldErr(f, t, invalidf(`must be "*" or an event type matching %s`, typePattern))
		}
		if types[t] {
			return fieldErr(f, t, newReason(ErrDuplicate, "listed twice"))
		}
		types[t] = true
	}
	if types["*"] && len(s.Types) > 1 {
		return fieldErr(p+".types", s.Types, newReason(ErrConflict, `"*" already matches every type; list it alone`))
	}

	if s.Timeout < minTimeout || s.Timeout > maxTimeout {
		return fieldErr(p+".timeout", s.Timeout, invalidf("must be between %v and %v", minTimeout, maxTimeout))
	}
	if err := s.validateRate(p); err != nil {
		return err
	}
	if err := s.validateConcurrency(p); err != nil {
		return err
	}
	r := s.Retry
	if r.MaxAttempts < 1 || r.MaxAttempts > maxRetryAttempts {
		return fieldErr(p+".retry.max_attempts", r.MaxAttempts, invalidf("must be between 1 and %d", maxRetryAttempts))
	}
	if r.MaxAge <= 0 {
		return fieldErr(p+".retry.max_age", r.MaxAge, invalidf("must be positive"))
	}
	if r.Base <= 0 {
		return fieldErr(p+".retry.base", r.Base, invalidf("must be positive"))
	}
	if r.Cap <= 0 {
		return fieldErr(p+".retry.cap", r.Cap, invalidf("must be positive"))
	}
	if r.Base > r.Cap {
		return fieldErr(p+".retry.base", r.Base, invalidf("must not exceed retry.cap (%v)", r.Cap))
	}

	if err := s.validateBacklog(p); err != nil {
		return err
	}
	if err := s.validateBreaker(p); err != nil {
		return err
	}

	lower := make(map[string]string, len(s.Headers))
	for _, name := range slices.Sorted(maps.Keys(s.Headers)) {
		f := p + ".headers[" + name + "]"
		value := s.Headers[name]
		if !validHeaderName(name) {
			return fieldErr(p+".headers", name, invalidf("not a valid header name"))
		}
		if reservedHeader(name) {
			return fieldErr(f, nil, invalidf("sluice sets this header itself; it cannot be overridden"))
		}
		if prev, ok := lower[strings.ToLower(name)]; ok {
			return fieldErr(f, nil, newReason(ErrDuplicate, "same header as %q (header names ignore case)", prev))
		}
		lower[strings.ToLower(name)] = name
		if !validHeaderValue(value) {
			return fieldErr(f, value, invalidf("header value must not contain control characters"))
		}
	}

	for _, code := range slices.Sorted(maps.Keys(s.Classify)) {
		f := p + ".classify[" + code + "]"
		n, err := strconv.Atoi(code)
		if err != nil || len(code) != 3 || n < 100 || n > 599 {
			return fieldErr(p+".classify", code, invalidf("keys must be HTTP status codes from 100 to 599"))
		}
		if !slices.Contains(classifyOutcomes, s.Classify[code]) {
			return fieldErr(f, s.Classify[code], invalidf("must be ack, retry or dead_letter"))
		}
	}
	return nil
}

// validateRate checks the token bucket, if there is one. The comparisons
// in this and the next checks are written so that NaN (YAML .nan) fails
// them.
func (s *SubscriptionConfig) validateRate(p string) error {
	r := s.Rate
	if r == (RateConfig{}) && !s.explicit.has(keyRatePerSecond|keyRateBurst) {
		return nil // no limit
	}
	if r.PerSecond == 0 && !s.explicit.has(keyRatePerSecond) {
		return fieldErr(p+".rate.per_second", nil, newReason(ErrMissingValue, "required when rate is set; omit rate for no limit"))
	}
	if !(r.PerSecond > 0 && r.PerSecond <= maxRatePerSecond) {
		return fieldErr(p+".rate.per_second", r.PerSecond, invalidf("must be greater than 0 and at most %d; omit rate for no limit", int(maxRatePerSecond)))
	}
	if r.Burst < 1 {
		return fieldErr(p+".rate.burst", r.Burst, invalidf("must be at least 1"))
	}
	return nil
}

// validateConcurrency checks the static cap, or the bounds of the automatic
// one.
func (s *SubscriptionConfig) validateConcurrency(p string) error {
	c := s.Concurrency
	if c.Max < 1 || c.Max > maxConcurrency {
		return fieldErr(p+".concurrency.max", c.Max, invalidf("must be between 1 and %d", maxConcurrency))
	}
	if !c.Auto {
		if c.Min != 0 || s.explicit.has(keyConcurrencyMin) {
			return fieldErr(p+".concurrency.min", c.Min, newReason(ErrConflict, "only with auto: true"))
		}
		if c.Headroom != 0 || s.explicit.has(keyConcurrencyHeadroom) {
			return fieldErr(p+".concurrency.headroom", c.Headroom, newReason(ErrConflict, "only with auto: true"))
		}
		return nil
	}
	if c.Min < 1 || c.Min > maxConcurrency {
		return fieldErr(p+".concurrency.min", c.Min, invalidf("must be between 1 and %d", maxConcurrency))
	}
	if c.Min > c.Max {
		return fieldErr(p+".concurrency.min", c.Min, invalidf("must not exceed concurrency.max (%d)", c.Max))
	}
	if c.Headroom < 1 || c.Headroom > maxHeadroom { // policy.AutoCap reads 0 as its default
		return fieldErr(p+".concurrency.headroom", c.Headroom, invalidf("must be between 1 and %d", maxHeadroom))
	}
	return nil
}

// validateBacklog checks the backlog quota; zero fields mean no limit.
func (s *SubscriptionConfig) validateBacklog(p string) error {
	b := s.Backlog
	if b.MaxEvents < 0 {
		return fieldErr(p+".backlog.max_events", b.MaxEvents, invalidf("must not be negative (0 means no limit)"))
	}
	if b.MaxAge != 0 && b.MaxAge < minBacklogMaxAge {
		return fieldErr(p+".backlog.max_age", b.MaxAge, invalidf("must be at least %v, or 0s for no limit", minBacklogMaxAge))
	}
	return nil
}

// validateBreaker checks the breaker's thresholds.
func (s *SubscriptionConfig) validateBreaker(p string) error {
	b := s.Breaker
	if !(b.FailureRatio > 0 && b.FailureRatio <= 1) {
		return fieldErr(p+".breaker.failure_ratio", b.FailureRatio, invalidf("must be greater than 0 and at most 1"))
	}
	if b.MinRequests < 1 {
		return fieldErr(p+".breaker.min_requests", b.MinRequests, invalidf("must be at least 1"))
	}
	if b.Window < minWindow || b.Window > maxWindow {
		return fieldErr(p+".breaker.window", b.Window, invalidf("must be between %v and %v", minWindow, maxWindow))
	}
	if b.ConsecutiveTimeouts < 1 {
		return fieldErr(p+".breaker.consecutive_timeouts", b.ConsecutiveTimeouts, invalidf("must be at least 1"))
	}
	if b.CoolDown <= 0 {
		return fieldErr(p+".breaker.cool_down", b.CoolDown, invalidf("must be positive"))
	}
	if b.MaxCoolDown <= 0 {
		return fieldErr(p+".breaker.max_cool_down", b.MaxCoolDown, invalidf("must be positive"))
	}
	if b.CoolDown > b.MaxCoolDown {
		return fieldErr(p+".breaker.cool_down", b.CoolDown, invalidf("must not exceed breaker.max_cool_down (%v)", b.MaxCoolDown))
	}
	return nil
}

// validateURL requires an absolute http(s) URL with a host, without
// credentials (they would be logged; use headers) and without a fragment
// (never sent to the server).
func validateURL(field, raw string) error {
	if raw == "" {
		return fieldErr(field, nil, newReason(ErrMissingValue, "required"))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fieldErr(field, safeURL(raw), invalidf("not a valid URL"))
	}
	switch {
	case u.Scheme == "":
		return fieldErr(field, safeURL(raw), invalidf("must be an absolute URL starting with https:// or http://"))
	case u.Scheme != "http" && u.Scheme != "https":
		return fieldErr(field, safeURL(raw), invalidf("must be http or https"))
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return fieldErr(field, safeURL(raw), invalidf("must have a host"))
	case u.User != nil:
		return fieldErr(field, safeURL(raw), invalidf("must not contain credentials (user:password@); use headers"))
	case strings.Contains(raw, "#"):
		return fieldErr(field, safeURL(raw), invalidf("must not contain a fragment (#...)"))
	}
	return nil
}

// privateHost says why a URL's host is refused by the SSRF guard when that
// is known without DNS: an IP literal in a forbidden range, or localhost
// (RFC 6761 reserves it and its subdomains for loopback). Names are judged
// again, with their resolved addresses, on every connection.
func privateHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "localhost (a loopback address)"
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if why := policy.ForbiddenTarget(ip); why != "" {
			return why
		}
	}
	return ""
}

// safeURL hides userinfo and query values, which often carry credentials.
// A URL that does not parse is shown only if it cannot hold either.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if strings.ContainsAny(raw, "@?") {
			return redactedText
		}
		return raw
	}
	hadUser := u.User != nil
	u.User = nil
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		u.RawQuery = q.Encode()
	}
	out := u.String()
	if hadUser {
		if scheme, rest, ok := strings.Cut(out, "://"); ok {
			out = scheme + "://" + redactedText + "@" + rest
		}
	}
	return out
}

// resolveSecrets checks that exactly one secret source is set, reads it and
// parses every secret into s.Resolved. Errors never contain secret text.
func (s *SubscriptionConfig) resolveSecrets(p string, lookup func(string) (string, bool)) error {
	s.Resolved = nil
	var sources []string
	if s.Secret != "" {
		sources = append(sources, "secret")
	}
	if len(s.Secrets) > 0 {
		sources = append(sources, "secrets")
	}
	if s.SecretFile != "" {
		sources = append(sources, "secret_file")
	}
	if s.SecretEnv != "" {
		sources = append(sources, "secret_env")
	}
	switch len(sources) {
	case 0:
		return fieldErr(p+".secret", nil, newReason(ErrMissingValue, "no secret: set one of secret, secrets, secret_file or secret_env"))
	case 1:
	default:
		return fieldErr(p, nil, newReason(ErrConflict, "several secret sources (%s): set exactly one", strings.Join(sources, ", ")))
	}

	var out []signing.Secret
	seen := map[string]bool{}
	add := func(field, where, raw string) error {
		sec, err := signing.ParseSecret(raw)
		if err != nil {
			return fieldErr(field, where, secretReason(err, raw))
		}
		if seen[raw] {
			return fieldErr(field, where, newReason(ErrDuplicate, "the same secret is listed twice"))
		}
		seen[raw] = true
		out = append(out, sec)
		return nil
	}

	switch sources[0] {
	case "secret":
		if err := add(p+".secret", redactedText, s.Secret); err != nil {
			return err
		}
	case "secrets":
		for i, raw := range s.Secrets {
			if err := add(fmt.Sprintf("%s.secrets[%d]", p, i), redactedText, raw); err != nil {
				return err
			}
		}
	case "secret_file":
		f := p + ".secret_file"
		b, err := readSmallFile(s.SecretFile)
		if err != nil {
			return fieldErr(f, s.SecretFile, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
		}
		for n, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(f, s.SecretFile, line); err != nil {
				var ve *ConfigValidationError
				if errors.As(err, &ve) {
					ve.Err = &reason{kind: ErrInvalidValue, msg: fmt.Sprintf("line %d: %v", n+1, ve.Err), cause: ve.Err}
				}
				return err
			}
		}
		if len(out) == 0 {
			return fieldErr(f, s.SecretFile, newReason(ErrMissingValue, "file holds no secret"))
		}
	case "secret_env":
		f := p + ".secret_env"
		if !envNamePattern.MatchString(s.SecretEnv) {
			return fieldErr(f, s.SecretEnv, invalidf("not a valid environment variable name"))
		}
		v, ok := lookup(s.SecretEnv)
		if !ok {
			return fieldErr(f, s.SecretEnv, newReason(ErrMissingValue, "environment variable is not set"))
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			return fieldErr(f, s.SecretEnv, newReason(ErrMissingValue, "environment variable is empty"))
		}
		for i, raw := range fields {
			if err := add(f, s.SecretEnv, raw); err != nil {
				var ve *ConfigValidationError
				if errors.As(err, &ve) {
					ve.Err = &reason{kind: ErrInvalidValue, msg: fmt.Sprintf("secret %d: %v", i+1, ve.Err), cause: ve.Err}
				}
				return err
			}
		}
	}
	s.Resolved = out
	return nil
}

// secretReason wraps a signing.ParseSecret error. signing promises not to
// repeat the secret; the text is scrubbed anyway because this message goes
// to logs.
func secretReason(err error, raw string) error {
	msg := err.Error()
	for _, s := range []string{raw, strings.TrimPrefix(raw, "whsec_")} {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, redactedText)
		}
	}
	return &reason{kind: ErrInvalidValue, msg: "invalid secret: " + strings.TrimPrefix(msg, "parse secret: "), cause: err}
}

// readSmallFile reads a secret or token file, refusing anything large enough
// to be a mistake.
func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxSecretFileSize {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxSecretFileSize)
	}
	return b, nil
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue rejects control characters other than tab (CR and LF
// would split the header).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// reservedHeader reports the headers sluice sets on every delivery
// (DESIGN.md §4, "Outbound") and the hop-by-hop headers that would break the
// HTTP exchange itself.
func reservedHeader(name string) bool {
	n := strings.ToLower(name)
	if strings.HasPrefix(n, "webhook-") {
		return true
	}
	switch n {
	case "idempotency-key", "x-event-type", "x-attempt", "content-type", "content-length", "host",
		"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade":
		return true
	}
	return false
}

// sensitiveHeader reports header names whose values are likely credentials.
func sensitiveHeader(name string) bool {
	n := strings.ToLower(name)
	switch n {
	case "authorization", "proxy-authorization", "cookie":
		return true
	}
	for _, w := range []string{"token", "secret", "key", "auth", "signature", "password", "passwd", "session", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// isSensitiveField reports whether the value at field path must never be
// printed: secrets, the admin token and credential-like header values.
func isSensitiveField(field string) bool {
	if i := strings.LastIndex(field, "headers["); i >= 0 && strings.HasSuffix(field, "]") {
		return sensitiveHeader(field[i+len("headers[") : len(field)-1])
	}
	last := field
	if i := strings.LastIndexByte(last, '.'); i >= 0 {
		last = last[i+1:]
	}
	if i := strings.IndexByte(last, '['); i >= 0 {
		last = last[:i]
	}
	switch last {
	case "secret", "secrets", "token":
		return true
	}
	return false
}

// formatValue prints a value for an error message.
func formatValue(field string, v any) string {
	if isSensitiveField(field) {
		return redactedText
	}
	var s string
	switch x := v.(type) {
	case string:
		if x == redactedText {
			return x
		}
		s = strconv.Quote(x)
	case time.Duration:
		s = x.String()
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
		if a := math.Abs(x); a >= 1e-6 && a < 1e21 {
			s = strconv.FormatFloat(x, 'f', -1, 64) // 2000000, not 2e+06
		}
	case []string:
		s = fmt.Sprintf("%q", x)
	default:
		s = fmt.Sprint(x)
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Redacted returns a deep copy of c that is safe to print: secrets, the admin
// token and credential-like header values are "[redacted]", URLs lose
// userinfo and query values, and Resolved and ResolvedToken are empty. The
// copy does not pass Validate.
func (c Config) Redacted() *Config {
	r := c
	r.lookupEnv = nil
	r.Admin = c.Admin.redacted()
	if c.Subscriptions != nil {
		r.Subscriptions = make([]SubscriptionConfig, len(c.Subscriptions))
		for i, s := range c.Subscriptions {
			r.Subscriptions[i] = s.redacted()
		}
	}
	return &r
}

func (a AdminConfig) redacted() AdminConfig {
	if a.Token != "" {
		a.Token = redactedText
	}
	a.ResolvedToken = ""
	return a
}

func (s SubscriptionConfig) redacted() SubscriptionConfig {
	s.URL = safeURL(s.URL)
	if s.Secret != "" {
		s.Secret = redactedText
	}
	if s.Secrets != nil {
		s.Secrets = slices.Repeat([]string{redactedText}, len(s.Secrets))
	}
	s.Types = slices.Clone(s.Types)
	if s.Headers != nil {
		h := make(map[string]string, len(s.Headers))
		for k, v := range s.Headers {
			if sensitiveHeader(k) {
				v = redactedText
			}
			h[k] = v
		}
		s.Headers = h
	}
	if s.Classify != nil {
		s.Classify = maps.Clone(s.Classify)
	}
	s.Resolved = nil
	return s
}

// String returns c as YAML in the config file's shape, redacted as by
// Redacted.
func (c Config) String() string {
	b, err := yaml.Parser().Marshal(c.Redacted().toMap())
	if err != nil {
		return "config: " + err.Error()
	}
	return string(b)
}

// GoString makes %#v print the redacted String form.
func (c Config) GoString() string { return c.String() }

// LogValue makes log/slog print the redacted form on one line.
func (c Config) LogValue() slog.Value { return slog.StringValue(oneLine(c.Redacted().toMap())) }

// MarshalJSON encodes the redacted form, so encoding/json cannot leak a
// secret either.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.Redacted().toMap()) }

// String returns a redacted one-line form.
func (a AdminConfig) String() string { return oneLine(a.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (a AdminConfig) GoString() string { return a.String() }

// LogValue makes log/slog print the redacted form.
func (a AdminConfig) LogValue() slog.Value { return slog.StringValue(a.String()) }

// MarshalJSON encodes the redacted form.
func (a AdminConfig) MarshalJSON() ([]byte, error) { return json.Marshal(a.redacted().toMap()) }

// String returns a redacted one-line form.
func (s SubscriptionConfig) String() string { return oneLine(s.redacted().toMap()) }

// GoString makes %#v print the redacted form.
func (s SubscriptionConfig) GoString() string { return s.String() }

// LogValue makes log/slog print the redacted form.
func (s SubscriptionConfig) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON encodes the redacted form.
func (s SubscriptionConfig) MarshalJSON() ([]byte, error) { return json.Marshal(s.redacted().toMap()) }

// toMap expects a redacted Config.
func (c *Config) toMap() map[string]any {
	subs := make([]any, len(c.Subscriptions))
	for i, s := range c.Subscriptions {
		subs[i] = s.toMap()
	}
	return map[string]any{
		"listen":                c.Listen,
		"admin":                 c.Admin.toMap(),
		"data_dir":              c.DataDir,
		"durability":            c.Durability,
		"max_body_bytes":        c.MaxBodyBytes,
		"dedup_window":          c.DedupWindow.String(),
		"shutdown_grace":        c.ShutdownGrace.String(),
		"max_conns_per_host":    c.MaxConnsPerHost,
		"max_in_flight":         c.MaxInFlight,
		"max_disk_bytes":        c.MaxDiskBytes,
		"min_free_disk_bytes":   c.MinFreeDiskBytes,
		"allow_private_targets": c.AllowPrivateTargets,
		"log_level":             c.LogLevel,
		"log_format":            c.LogFormat,
		"ingest": map[string]any{
			"header_timeout":   c.Ingest.HeaderTimeout.String(),
			"body_timeout":     c.Ingest.BodyTimeout.String(),
			"idle_timeout":     c.Ingest.IdleTimeout.String(),
			"max_header_bytes": c.Ingest.MaxHeaderBytes,
			"max_connections":  c.Ingest.MaxConnections,
		},
		"retry_budget": map[string]any{
			"ratio":          c.RetryBudget.Ratio,
			"min_per_second": c.RetryBudget.MinPerSecond,
			"window":         c.RetryBudget.Window.String(),
		},
		"subscriptions": subs,
	}
}

// toMap expects a redacted AdminConfig.
func (a AdminConfig) toMap() map[string]any {
	m := map[string]any{"listen": a.Listen}
	if a.Token != "" {
		m["token"] = a.Token
	}
	if a.TokenFile != "" {
		m["token_file"] = a.TokenFile
	}
	return m
}

// toMap expects a redacted SubscriptionConfig.
func (s SubscriptionConfig) toMap() map[string]any {
	m := map[string]any{
		"id":          s.ID,
		"url":         s.URL,
		"types":       s.Types,
		"timeout":     s.Timeout.String(),
		"concurrency": map[string]any{"max": s.Concurrency.Max},
		"retry": map[string]any{
			"max_attempts": s.Retry.MaxAttempts,
			"max_age":      s.Retry.MaxAge.String(),
			"base":         s.Retry.Base.String(),
			"cap":          s.Retry.Cap.String(),
		},
		"breaker": map[string]any{
			"failure_ratio":        s.Breaker.FailureRatio,
			"min_requests":         s.Breaker.MinRequests,
			"window":               s.Breaker.Window.String(),
			"consecutive_timeouts": s.Breaker.ConsecutiveTimeouts,
			"cool_down":            s.Breaker.CoolDown.String(),
			"max_cool_down":        s.Breaker.MaxCoolDown.String(),
		},
		"paused": s.Paused,
	}
	if c := s.Concurrency; c.Auto {
		m["concurrency"] = map[string]any{"auto": true, "min": c.Min, "max": c.Max, "headroom": c.Headroom}
	}
	if s.Rate != (RateConfig{}) {
		m["rate"] = map[string]any{"per_second": s.Rate.PerSecond, "burst": s.Rate.Burst}
	}
	if s.Backlog != (BacklogConfig{}) {
		m["backlog"] = map[string]any{"max_events": s.Backlog.MaxEvents, "max_age": s.Backlog.MaxAge.String()}
	}
	if s.Secret != "" {
		m["secret"] = s.Secret
	}
	if s.Secrets != nil {
		m["secrets"] = s.Secrets
	}
	if s.SecretFile != "" {
		m["secret_file"] = s.SecretFile
	}
	if s.SecretEnv != "" {
		m["secret_env"] = s.SecretEnv
	}
	if len(s.Headers) > 0 {
		m["headers"] = s.Headers
	}
	if len(s.Classify) > 0 {
		m["classify"] = s.Classify
	}
	return m
}

func oneLine(m map[string]any) string {
	b, err := json.Marshal(m)
	if err != nil {
		return "config: " + err.Error()
	}
	return string(b)
}

// quotedInYAMLError matches what a YAML parser quotes from the document in
// its messages (anchor names, scalars), which could be a secret.
var quotedInYAMLError = regexp.MustCompile("'[^']*'|`[^`]*`|\"[^\"]*\"")

// redactYAMLError keeps a parse error's position and kind but drops any
// text it quotes from the file: the file holds secrets, and the error is
// logged. Found by FuzzLoadConfig.
func redactYAMLError(err error) string {
	return quotedInYAMLError.ReplaceAllString(err.Error(), "[…]")
}
