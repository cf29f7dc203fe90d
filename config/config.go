// Package config turns sluice's configuration sources into one validated
// Config. It is the only package of sluice that imports koanf, so that the
// libraries take plain fields and never a configuration library's types;
// cmd/sluice copies the result onto the components as plain fields.
//
// Sources, later ones winning:
//
//  1. the embedded defaults (Default);
//  2. a YAML file, or JSON when its name ends in .json;
//  3. the environment: SLUICE_<KEY>, lowercased, "__" for nesting
//     (SLUICE_ADMIN__LISTEN sets admin.listen), a list comma-separated
//     (SLUICE_JETSTREAM__URLS=nats://a:4222,nats://b:4222); the lists of
//     mappings (subscriptions, tenants, admin.tokens) cannot be set there;
//  4. overrides, usually from flags ("listen", "admin.listen").
//
// Guarantees of Load:
//
//   - Unknown keys are errors in every source (a typo is never ignored), and
//     so are values of the wrong type; durations need a unit. Errors are
//     *ValidationError naming the key and the source it came from. The one
//     exception: SLUICE_* variables that name no key are listed in
//     Config.IgnoredEnv, because Kubernetes injects SLUICE_PORT and friends.
//   - A key left out takes its default; a key that is set is checked as
//     written (rate: {per_second: 0} is an error, not "no limit").
//   - The bounds of the retry budget, breakers, retry schedules and
//     concurrency caps are policy's (policy.BreakerConfig.Validate and the
//     like), and so are their defaults; this package adds the key's path and
//     source.
//   - The result has passed Validate: secrets and the admin tokens are read
//     and parsed (SubscriptionConfig.Resolved, AdminConfig.ResolvedToken,
//     AdminConfig.ResolvedTenantTokens, WebhookConfig.Resolved), and
//     classify overrides, body filters and body variants parsed
//     (SubscriptionConfig.ClassifyOverrides, SubscriptionConfig.ParsedFilter,
//     the filter by policy.ParseFilter, SubscriptionConfig.ParsedVariant,
//     the variant by policy.ParseVariant), so callers never read files or
//     the environment again.
//   - Fleet mode (log.backend: jetstream: the log, the delivery state and
//     the subscriptions in NATS JetStream, shared by every sidecar) is all
//     or nothing:
//     its jetstream.* keys are refused with the default badger backend, and
//     with jetstream the servers are required and the credentials and TLS
//     files are read and parsed once here (RestartRequired lists what a
//     reload cannot change).
//   - No secret, token or credential-like header value is ever printed: not
//     by String, %v, %#v, log/slog or encoding/json, and not in an error.
//
// Load does no I/O beyond reading the file and the secret and token files
// it names, and in fleet mode (log.backend: jetstream) the NATS
// credentials and TLS files and the host name; it never dials NATS. A
// Config is a plain value: not safe for concurrent mutation.
package config

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/cloudevents"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/proxy/ingest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/jetstream"
	"github.com/sluicehq/sluice/signing"
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

// Defaults of the settings no component owns; the others are the owning
// package's (proxy.DefaultListen, policy.DefaultBreakerWindow, ...), and
// Default and Load take them from there.
const (
	// defaultDataDir holds the Badger log, relative to the working
	// directory, the documented default.
	defaultDataDir = "./sluice-data"
	// defaultLogLevel and defaultLogFormat are log/slog's usual defaults.
	defaultLogLevel  = "info"
	defaultLogFormat = "text"
	// defaultSocketMode lets the sidecar's user and group use a unix socket
	// on a volume shared with the producer's container.
	defaultSocketMode = "0660"
)

// Config is the whole configuration of the sidecar. The koanf
// tags are the YAML keys; environment variables use the same names with the
// SLUICE_ prefix and "__" for nesting. Build one with Load; a Config
// built by hand must start from Default and pass Validate.
//
// Printing a Config (String, %v, %#v, log/slog, encoding/json) never shows a
// secret or the admin token.
type Config struct {
	// Listen is the ingest address: "host:port" or "unix:///abs/path.sock".
	// Default proxy.DefaultListen.
	Listen string `koanf:"listen"`
	// Admin configures the admin API listener.
	Admin AdminConfig `koanf:"admin"`
	// DataDir holds the queue. Default "./sluice-data".
	DataDir string `koanf:"data_dir"`
	// Durability is DurabilityFsync (default) or DurabilityAsync.
	Durability string `koanf:"durability"`
	// MaxBodyBytes is the largest accepted event body in bytes, 1 to 64 MiB.
	// Default proxy.DefaultMaxBodyBytes.
	MaxBodyBytes int `koanf:"max_body_bytes"`
	// Ingest bounds what producers may hold of the ingest listener.
	Ingest IngestConfig `koanf:"ingest"`
	// DedupWindow is how long an event id is remembered for idempotent
	// ingest; at least one minute. Default queue.DefaultDedupWindow.
	DedupWindow time.Duration `koanf:"dedup_window"`
	// ShutdownGrace is how long in-flight deliveries may finish after the
	// first SIGTERM. Default proxy.DefaultShutdownGrace.
	ShutdownGrace time.Duration `koanf:"shutdown_grace"`
	// MaxConnsPerHost caps outbound connections per endpoint host. Default
	// egress.DefaultMaxConnsPerHost.
	MaxConnsPerHost int `koanf:"max_conns_per_host"`
	// MaxInFlight caps concurrent outbound requests of the whole process.
	// Default proxy.DefaultMaxInFlight.
	MaxInFlight int `koanf:"max_in_flight"`
	// MaxDiskBytes is the disk quota of the log in data_dir; past it ingest
	// answers 507. 0 (default) means no quota.
	MaxDiskBytes int64 `koanf:"max_disk_bytes"`
	// MemoryBytes is the sidecar's memory budget: the log's memtables and
	// caches, the ring of recent events and the ingest gate are sized
	// from it (proxy.SplitMemory), and it is the Go runtime's soft memory
	// limit. 0 (default): 85% of the container's memory limit when there
	// is one, else proxy.DefaultMemoryBytes (64 MiB). At least
	// proxy.MinMemoryBytes.
	MemoryBytes int64 `koanf:"memory_bytes"`
	// MinFreeDiskBytes is the free space ingest leaves on data_dir's file
	// system (507 below it). Default queue.DefaultMinFreeBytes; 0 disables
	// the floor, which risks a crash on a full disk (see docs/reliability.md).
	MinFreeDiskBytes int64 `koanf:"min_free_disk_bytes"`
	// AllowPrivateTargets lets subscriptions deliver to loopback, private,
	// link-local (cloud metadata) and other non-public addresses. Off by
	// default: the check runs when each connection is made, so DNS cannot
	// route around it. Turn it on for receivers on the same host or network.
	AllowPrivateTargets bool `koanf:"allow_private_targets"`
	// Egress routes deliveries through a forward proxy; the
	// zero EgressConfig delivers directly. A subscription may set its own.
	Egress EgressConfig `koanf:"egress"`
	// LogLevel is debug, info (default), warn or error.
	LogLevel string `koanf:"log_level"`
	// LogFormat is text (default) or json.
	LogFormat string `koanf:"log_format"`
	// SocketMode is the file mode of unix-socket listeners, in octal
	// ("0660" by default: the owner and a group shared with the producer).
	SocketMode string `koanf:"socket_mode"`
	// RetryBudget bounds the retries of all subscriptions together.
	RetryBudget RetryBudgetConfig `koanf:"retry_budget"`
	// Log chooses where the event log and the delivery state live.
	Log LogConfig `koanf:"log"`
	// JetStream configures fleet mode's shared log: the NATS servers, the
	// stream and its replicas, and the lane leases. Its
	// keys may only be set with Log.Backend BackendJetStream.
	JetStream JetStreamConfig `koanf:"jetstream"`
	// NodeID names this sidecar in the fleet: lane ownership, leases and
	// the admin API's owner column. It matches ^[A-Za-z0-9_-]{1,64}$: it
	// becomes part of NATS subjects and KV keys, which allow no ".", "*",
	// ">" or whitespace. With BackendJetStream Load defaults it to the
	// host name (the pod name in Kubernetes), each "." replaced by "_".
	// Unused with BackendBadger.
	NodeID string `koanf:"node_id"`
	// Subscriptions are the endpoints events are delivered to. They can be
	// set in the file or the overrides, not in the environment.
	Subscriptions []SubscriptionConfig `koanf:"subscriptions"`
	// Tenants are the limits of tenants, above those of their
	// subscriptions. A subscription or a tenant token may name a tenant
	// that is not listed: TenantDefaults bound it. File or overrides only.
	Tenants []TenantConfig `koanf:"tenants"`
	// TenantDefaults are the limits of every tenant Tenants does not
	// list, and of a listed one where it leaves a key out.
	TenantDefaults TenantDefaultsConfig `koanf:"tenant_defaults"`
	// OTel configures OpenTelemetry tracing (otel.go). Off unless a
	// collector is named.
	OTel OTelConfig `koanf:"otel"`
	// CloudEvents is the sidecar-wide part of the CloudEvents delivery
	// formats (cloudevents.go).
	CloudEvents CloudEventsConfig `koanf:"cloudevents"`

	// IgnoredEnv names SLUICE_* variables that are no config key. They are
	// not errors: Kubernetes injects SLUICE_PORT and friends for a Service
	// named sluice, and a sidecar must not refuse to start over that. The
	// caller logs them.
	IgnoredEnv []string `koanf:"-" json:"-"`

	// lookupEnv resolves secret_env references; Load points it at its
	// environ argument, nil means os.LookupEnv.
	lookupEnv func(string) (string, bool)
	// jetstreamKeys are the jetstream.* keys the sources set, sorted, as
	// Load found them; Validate refuses them with BackendBadger even where
	// a value equals its default. Nil for a Config built by hand: there
	// only values that differ from Default count.
	jetstreamKeys []string
}

// Values of LogConfig.Backend.
const (
	// BackendBadger keeps the log in an embedded Badger database in
	// data_dir: one sidecar, its own events. The default.
	BackendBadger = "badger"
	// BackendJetStream is fleet mode: the log, the delivery state and the
	// registry of subscriptions live in NATS JetStream, shared by every
	// sidecar of the fleet, and each lane is delivered by one sidecar at a
	// time, so its cap, rate and breaker hold fleet-wide.
	BackendJetStream = "jetstream"
)

// LogConfig chooses the log's backend.
type LogConfig struct {
	// Backend is BackendBadger (default) or BackendJetStream. Changing it
	// needs a restart.
	Backend string `koanf:"backend"`
}

// JetStreamConfig is fleet mode's connection to NATS JetStream and the
// shape of what sluice creates there (jetstream.Options). Changing any of
// it needs a restart.
type JetStreamConfig struct {
	// URLs are NATS servers of the cluster (any of them; the client learns
	// the others): nats://, tls://, ws:// or wss:// with a host, no
	// credentials (use CredentialsFile). Required with BackendJetStream;
	// from the environment a comma-separated list.
	URLs []string `koanf:"urls"`
	// Stream names the event stream and prefixes the KV buckets
	// (<stream>_STATE, ...): ^[A-Za-z0-9_-]{1,64}$. Every sidecar of one
	// fleet uses the same. Default jetstream.DefaultStream.
	Stream string `koanf:"stream"`
	// Replicas of the stream and the buckets, 1 to 5: 3 keeps a quorum
	// through the loss of one server; 1 is for development. Default
	// jetstream.DefaultReplicas.
	Replicas int `koanf:"replicas"`
	// LeaseTTL is how long a crashed sidecar's lanes wait before another
	// one takes them, 1s to 5m: shorter moves them sooner, but a pause of
	// the owner (GC, network, a NATS leader election) longer than it moves
	// them needlessly. Default jetstream.DefaultLeaseTTL.
	LeaseTTL time.Duration `koanf:"lease_ttl"`
	// CredentialsFile names a NATS .creds file (user JWT and seed); it
	// must exist and be readable. Its path may be printed, its content
	// never is. Optional.
	CredentialsFile string `koanf:"credentials_file"`
	// TLS configures the client side of TLS to the servers. Optional.
	TLS JetStreamTLSConfig `koanf:"tls"`
}

// JetStreamTLSConfig names PEM files for TLS to the NATS servers. Each
// must exist and parse; CertFile and KeyFile go together.
type JetStreamTLSConfig struct {
	// CAFile holds the certificates that verify the servers; without it
	// the system's roots do.
	CAFile string `koanf:"ca_file"`
	// CertFile and KeyFile are the client certificate and its key, for
	// servers that verify clients.
	CertFile string `koanf:"cert_file"`
	KeyFile  string `koanf:"key_file"`
}

// RetryBudgetConfig is the retry budget shared by every subscription
// (sized so that a fleet-wide outage adds about a tenth to the offered
// load, where "retry 3 times" would quadruple it): retries within the last Window may reach Ratio times the
// successes within it (a 4xx counts: the endpoint answered), plus
// MinPerSecond per second. A retry over budget is deferred, not dropped.
type RetryBudgetConfig struct {
	// Ratio is how many retries each success earns, above 0 and at most 1.
	// Default policy.DefaultBudgetRatio.
	Ratio float64 `koanf:"ratio"`
	// MinPerSecond is the floor, in retries per second, above 0 and at most
	// 1,000,000.
	// Default policy.DefaultBudgetMinPerSecond.
	MinPerSecond float64 `koanf:"min_per_second"`
	// Window is how far back successes and retries count, 1s..10m. Default
	// policy.DefaultBudgetWindow.
	Window time.Duration `koanf:"window"`
}

// IngestConfig protects the ingest listener from slow, stuck or flooding
// producers (ingest.Limits).
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
	// MaxBatchEvents bounds the events of one batch (POST /v1/events,
	// NDJSON or a CloudEvents batch); 413 past it. 1..100,000.
	MaxBatchEvents int `koanf:"max_batch_events"`
	// MaxBatchBytes bounds a batch's body; 413 past it. Each event's body
	// is still bound by MaxBodyBytes. 1 KiB..64 MiB.
	MaxBatchBytes int `koanf:"max_batch_bytes"`
}

// AdminConfig configures the admin API listener.
type AdminConfig struct {
	// Listen is "host:port" or "unix:///abs/path.sock". Default
	// proxy.DefaultAdminListen.
	Listen string `koanf:"listen"`
	// Token, when set, is the bearer token the admin API requires. Set
	// Token or TokenFile, not both; neither means no authentication, which
	// Validate allows only on a loopback address or a unix socket (see
	// InsecureNoToken). At least admin.MinTokenBytes long.
	Token string `koanf:"token" json:"-"`
	// TokenFile names a file holding the token; surrounding whitespace is
	// ignored.
	TokenFile string `koanf:"token_file"`
	// InsecureNoToken lets the admin API listen beyond loopback without an
	// operator token. Dangerous: anyone who can reach the address, or a
	// page in a browser that can, pauses, replays and re-points
	// deliveries. Only for a network nothing untrusted can reach.
	InsecureNoToken bool `koanf:"insecure_no_token"`

	// Tokens are admin tokens scoped to one tenant each, beside the
	// operator's (Token or TokenFile), which they need: without an
	// operator token the admin API asks no request for a token. File or
	// overrides only.
	Tokens []TenantTokenConfig `koanf:"tokens"`
	// OperationalWebhook, when its URL is set, receives sluice's own
	// events (a subscription paused, a breaker opening, dead letters).
	OperationalWebhook WebhookConfig `koanf:"operational_webhook"`

	// ResolvedToken is the token from Token or TokenFile, filled in by
	// Validate so callers never read the file again. Empty means no token.
	ResolvedToken string `koanf:"-" json:"-"`
	// ResolvedTenantTokens are Tokens read (TokenFile) and checked, in
	// their order, filled in by Validate.
	ResolvedTenantTokens []TenantToken `koanf:"-" json:"-"`
}

// TenantTokenConfig is one admin token scoped to a tenant: a request
// bearing it acts for Tenant and sees only its subscriptions. Set Token or
// TokenFile, not both. A tenant may have several (rotation).
type TenantTokenConfig struct {
	// Token is the token itself: printable ASCII without spaces.
	Token string `koanf:"token" json:"-"`
	// TokenFile names a file holding the token; surrounding whitespace is
	// ignored.
	TokenFile string `koanf:"token_file"`
	// Tenant is the tenant the token acts for; required, an id like a
	// subscription's.
	Tenant string `koanf:"tenant"`
}

// TenantToken is a resolved tenant token. Printing one (String, %v, %#v,
// log/slog, encoding/json) never shows the token.
type TenantToken struct {
	Token  string
	Tenant string
}

// WebhookConfig is an endpoint of sluice's own: a URL and its secrets,
// the keys and rules of a subscription's. The zero value means none.
type WebhookConfig struct {
	// URL is an absolute http or https URL, as a subscription's url.
	URL string `koanf:"url"`
	// Exactly one of Secret, Secrets, SecretFile and SecretEnv must be
	// set, as for a subscription.
	Secret     string   `koanf:"secret" json:"-"`
	Secrets    []string `koanf:"secrets" json:"-"`
	SecretFile string   `koanf:"secret_file"`
	SecretEnv  string   `koanf:"secret_env"`

	// Resolved holds the parsed secrets, filled in by Validate.
	Resolved []signing.Secret `koanf:"-" json:"-"`
}

// TenantConfig is one tenant's limits; a key left out takes
// TenantDefaults' value.
type TenantConfig struct {
	// ID is the tenant, as subscriptions and tenant tokens name it: it
	// matches ^[a-z0-9][a-z0-9._-]{0,63}$ and is unique.
	ID string `koanf:"id"`
	// MaxSubscriptions bounds how many subscriptions name the tenant, those
	// of the file and those made through the API together; 0 means no
	// limit.
	MaxSubscriptions int `koanf:"max_subscriptions"`
	// Concurrency bounds the deliveries in flight of all the tenant's
	// subscriptions together.
	Concurrency TenantConcurrencyConfig `koanf:"concurrency"`
	// MaxSubscriptionConcurrency bounds the concurrency cap
	// (concurrency.max, or auto's max) the tenant's token may give one
	// subscription, 1..10000.
	MaxSubscriptionConcurrency int `koanf:"max_subscription_concurrency"`
	// SharedTypes are the platform event types (events posted with no
	// Sluice-Tenant) that the tenant's subscriptions may receive, exact
	// types or patterns ("status.*", "*"). A tenant's subscriptions
	// always receive the tenant's own events and never another tenant's;
	// without shared_types they receive no platform event. Changing it
	// takes a restart.
	SharedTypes []string `koanf:"shared_types"`
	// Backlog bounds what may wait for each of the tenant's
	// subscriptions, whatever they set themselves (they may only be
	// tighter), counting while they are paused; max_age also bounds their
	// retries' max_age. A field left 0 takes the default for tenants
	// (1,000,000 events, 72h), so no tenant's subscription goes unbounded
	// and a stalled endpoint cannot fill the disk for everyone.
	Backlog BacklogConfig `koanf:"backlog"`
	// MaxDeadLetters bounds the dead letters kept for each of the
	// tenant's subscriptions: past it the oldest are deleted (a letter a
	// replay in flight needs is kept). 0 takes the default, 100,000; at
	// most 1,000,000,000. Enforced by each subscription's owner, in both
	// backends.
	MaxDeadLetters int `koanf:"max_dead_letters"`

	// maxSubscriptionsSet and maxSubscriptionConcurrencySet record that
	// the source spelled the key out (markTenants): a 0 left out takes
	// the default, a 0 written means no limit (max_subscriptions) or is
	// refused.
	maxSubscriptionsSet, maxSubscriptionConcurrencySet bool
}

// SubscriptionsLimit is MaxSubscriptions as delivery.Tenant takes it: 0
// when the source left it out (TenantDefaults' applies), -1 for a 0 it
// wrote (no limit), else the limit.
func (t TenantConfig) SubscriptionsLimit() int {
	switch {
	case !t.maxSubscriptionsSet && t.MaxSubscriptions == 0:
		return 0
	case t.MaxSubscriptions == 0:
		return -1
	}
	return t.MaxSubscriptions
}

// TenantDefaultsConfig are the limits of a tenant that tenants does not
// list (a subscription or a token may name any tenant), and of a listed
// one where it leaves a key out. Each default is proxy's.
type TenantDefaultsConfig struct {
	// MaxSubscriptions bounds each such tenant's subscriptions; 0 means
	// no limit. Default delivery.DefaultTenantMaxSubscriptions.
	MaxSubscriptions int `koanf:"max_subscriptions"`
	// Concurrency is each such tenant's bulkhead, 1..100000. Default
	// delivery.DefaultTenantMaxConcurrency.
	Concurrency TenantConcurrencyConfig `koanf:"concurrency"`
	// MaxSubscriptionConcurrency bounds the cap a tenant's token may give
	// one subscription, 1..10000. Default
	// delivery.DefaultTenantMaxSubscriptionConcurrency.
	MaxSubscriptionConcurrency int `koanf:"max_subscription_concurrency"`
}

// TenantConcurrencyConfig is a tenant's bulkhead.
type TenantConcurrencyConfig struct {
	// Max is the cap, 1..100000; left out, tenant_defaults'. An explicit
	// 0 is an error.
	Max int `koanf:"max"`

	// maxSet records that the source spelled max out (see keySet).
	maxSet bool
}

// SubscriptionConfig is one endpoint and its delivery policy. Load fills
// the keys a subscription leaves out with the owners' defaults (proxy's
// timeout and cap, policy's retry, breaker and auto-cap defaults).
type SubscriptionConfig struct {
	// ID names the subscription in metrics, logs and the admin API; it
	// matches ^[a-z0-9][a-z0-9._-]{0,63}$ and is unique.
	ID string `koanf:"id"`
	// URL is the absolute http or https endpoint, at most 2048 bytes; no
	// userinfo, no fragment.
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
	// ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$, patterns whose dot-separated
	// segments may be "*" ("geofence.*", policy.ValidTypePattern), or "*"
	// alone for all; at most 64 entries of at most 128 bytes. Default ["*"].
	Types []string `koanf:"types"`
	// Filter passes only the events whose JSON body matches it
	// (policy.ParseFilter): a map of dotted paths or operators ($and,
	// $or, $not) to values or operator maps ($eq, $in, $gt, ...). Empty
	// means every event of Types.
	Filter map[string]any `koanf:"filter"`
	// Body asks for a variant of the stored body instead of its exact
	// bytes (policy.ParseVariant). Omitted: the stored bytes.
	Body BodyConfig `koanf:"body"`
	// Tenant, when set, scopes the subscription to one tenant: that
	// tenant's tokens see and manage it, and its limits (Config.Tenants)
	// bound it. An id like ID.
	Tenant string `koanf:"tenant"`
	// Timeout bounds one HTTP exchange, 1ms to 5m. Default delivery.DefaultTimeout.
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
	// Headers are added to every delivery: at most 32, names at most 256
	// bytes, values at most 8192. They may not replace the headers
	// sluice sets itself (webhook-*, Idempotency-Key, X-Event-Type,
	// X-Attempt, Content-Type, Content-Length, Host, Ordering-Key,
	// X-Sluice-Replay) nor hop-by-hop headers.
	Headers map[string]string `koanf:"headers"`
	// Classify overrides the default response classification: status code
	// ("100".."599") → "ack", "retry" or "dead_letter".
	Classify map[string]string `koanf:"classify"`
	// Paused starts the subscription paused; events are kept for it.
	Paused bool `koanf:"paused"`
	// Egress, when set, replaces the top-level egress for this
	// subscription whole; TLS sets the client certificate, CAs and name
	// of its https connections; Auth adds OAuth2 bearer tokens
	// (package proxy/egress). The files they name are read and checked by Validate.
	Egress EgressConfig      `koanf:"egress"`
	TLS    EndpointTLSConfig `koanf:"tls"`
	Auth   AuthConfig        `koanf:"auth"`
	// Ordering is "none" (default: deliveries run in parallel, in no
	// order), "key" (events sharing an Ordering-Key header reach the
	// endpoint in acceptance order, the next one not sent before the
	// previous is acknowledged or dead-lettered; events without a key are
	// not ordered) or "fifo" (one key for the whole subscription). See
	// docs/configuration.md, "Per-key ordering".
	Ordering string `koanf:"ordering"`
	// Format is how deliveries carry the event: "standard-webhooks"
	// (default: the body alone, signed), "cloudevents-binary" (its
	// CloudEvents attributes in ce- headers too) or
	// "cloudevents-structured" (one application/cloudevents+json object
	// of attributes and data). Every format is signed with the Standard
	// Webhooks headers. See docs/cloudevents.md.
	Format string `koanf:"format"`

	// Resolved holds the parsed secrets from whichever source is set, filled
	// in by Validate so callers never read files or the environment again.
	Resolved []signing.Secret `koanf:"-" json:"-"`
	// ClassifyOverrides is Classify parsed for policy.Classify, filled in
	// by Validate; nil when Classify is empty.
	ClassifyOverrides map[int]policy.Outcome `koanf:"-" json:"-"`
	// ParsedFilter is Filter parsed, filled in by Validate; nil when
	// Filter is empty.
	ParsedFilter *policy.Filter `koanf:"-" json:"-"`
	// ParsedVariant is Body parsed, filled in by Validate; nil when body
	// is omitted.
	ParsedVariant *policy.Variant `koanf:"-" json:"-"`

	// explicit records which keys the source spelled out where leaving a
	// key out differs from setting it to zero; see keySet.
	explicit keySet
	// spec is the subscription as its source wrote it, redacted, as JSON
	// (see Spec); nil for a SubscriptionConfig built by hand.
	spec []byte
}

// BodyConfig is a subscription's body variant: what it is sent
// instead of the stored bytes. Fields apply first, then the envelope, and
// the paths name the stored body (as a filter's do), never the envelope.
// Each variant is rendered once per event, however many subscriptions ask
// for it; a body it cannot render (not JSON) is dead-lettered with reason
// variant_failed.
type BodyConfig struct {
	// Envelope wraps the payload: "standard-webhooks" sends {"type":
	// <event type>, "timestamp": <accepted-at, RFC 3339>, "data": <the
	// payload>}. Omitted: no envelope.
	Envelope string `koanf:"envelope"`
	// Fields keeps only these dotted paths of the stored body ("data.id",
	// "data.items.0.sku"), nested as in the body; missing ones are left
	// out. Omitted: the whole payload. An empty list is an error.
	Fields []string `koanf:"fields"`
}

// RateConfig is a subscription's token bucket: deliveries start at most
// PerSecond per second on average, and up to Burst at once after a pause.
type RateConfig struct {
	// PerSecond is the rate, 0.001 to 1,000,000. Zero, with Burst zero,
	// means no limit; an explicit 0 is an error.
	PerSecond float64 `koanf:"per_second"`
	// Burst is the bucket size, 1 to 1,000,000. Default ceil(PerSecond),
	// at least 1.
	Burst int `koanf:"burst"`
}

// ConcurrencyConfig caps a subscription's in-flight deliveries: at Max, or,
// with Auto, at a cap derived from Little's law (rate · P99 latency +
// Headroom) and kept within Min..Max.
type ConcurrencyConfig struct {
	// Auto derives the cap from the measured rate and latency.
	Auto bool `koanf:"auto"`
	// Min is the lowest cap Auto may set, 1..10000 and at most Max. Only
	// with Auto. Default policy.DefaultAutoCapMin.
	Min int `koanf:"min"`
	// Max is the cap, or with Auto the highest cap, 1..10000. Default
	// delivery.DefaultMaxConcurrency, or policy.DefaultAutoCapMax with Auto.
	Max int `koanf:"max"`
	// Headroom is the slots Auto adds to λ·P99, 0..1000. Only with Auto.
	// Default policy.DefaultAutoCapHeadroom.
	Headroom int `koanf:"headroom"`
}

// BacklogConfig is a subscription's backlog quota. Zero fields mean no
// limit.
type BacklogConfig struct {
	// MaxEvents is the most events waiting for the subscription, 0 to
	// 1,000,000,000.
	MaxEvents int64 `koanf:"max_events"`
	// MaxAge is how long an event may wait, 0 or 1s to 720h.
	MaxAge time.Duration `koanf:"max_age"`
}

// BreakerConfig is a subscription's circuit breaker: closed → open on a
// failure threshold → half-open single probe → closed. While open, the
// lane holds no slots and its backlog waits on disk.
type BreakerConfig struct {
	// FailureRatio opens the breaker when this share of the requests in
	// Window failed, greater than 0 and at most 1. Default
	// policy.DefaultBreakerFailureRatio.
	FailureRatio float64 `koanf:"failure_ratio"`
	// MinRequests is how many requests Window must hold before FailureRatio
	// applies, at least 1. Default policy.DefaultBreakerMinRequests.
	MinRequests int `koanf:"min_requests"`
	// Window is how far back requests are counted, 1s..10m. Default
	// policy.DefaultBreakerWindow.
	Window time.Duration `koanf:"window"`
	// ConsecutiveTimeouts opens the breaker after this many timeouts in a
	// row, at least 1. Default
	// policy.DefaultBreakerConsecutiveTimeouts.
	ConsecutiveTimeouts int `koanf:"consecutive_timeouts"`
	// CoolDown is how long the breaker stays open before a probe, positive
	// and at most MaxCoolDown. Default policy.DefaultBreakerCoolDown.
	CoolDown time.Duration `koanf:"cool_down"`
	// MaxCoolDown bounds CoolDown as it grows while probes fail, positive.
	// Default policy.DefaultBreakerMaxCoolDown.
	MaxCoolDown time.Duration `koanf:"max_cool_down"`
}

// RetryConfig is a subscription's retry schedule: full-jitter backoff
// uniform(0, min(Cap, Base·2^(attempt-1))) until MaxAttempts or MaxAge.
type RetryConfig struct {
	// MaxAttempts counts every attempt including the first, 1..100.
	// Default policy.DefaultMaxAttempts.
	MaxAttempts int `koanf:"max_attempts"`
	// MaxAge is how long after the first attempt retries may continue,
	// 1s to 720h. Default policy.DefaultMaxAge.
	MaxAge time.Duration `koanf:"max_age"`
	// Base is the first backoff step, 1ms to 24h. Default
	// policy.DefaultBase.
	Base time.Duration `koanf:"base"`
	// Cap is the largest backoff, 1ms to 24h; Base <= Cap. Default
	// policy.DefaultCap.
	Cap time.Duration `koanf:"cap"`
}

// Default returns the configuration sluice runs with when no file,
// environment variable or flag says otherwise. It has no subscriptions.
// Each default is the owning package's: the listeners, limits and grace
// are proxy's, the dedup window and the free-space floor queue's, the
// retry budget policy's, fleet mode's stream,
// replicas and lease jetstream's.
func Default() *Config {
	budget := policy.BudgetConfig{}.WithDefaults()
	return &Config{
		Listen:       proxy.DefaultListen,
		Admin:        AdminConfig{Listen: proxy.DefaultAdminListen},
		DataDir:      defaultDataDir,
		Durability:   DurabilityFsync, // 202 only once the append is synced (one sync per group commit)
		MaxBodyBytes: proxy.DefaultMaxBodyBytes,
		Ingest: IngestConfig{
			HeaderTimeout:  ingest.DefaultHeaderTimeout,
			BodyTimeout:    ingest.DefaultBodyTimeout,
			IdleTimeout:    ingest.DefaultIdleTimeout,
			MaxHeaderBytes: ingest.DefaultMaxHeaderBytes,
			MaxConnections: ingest.DefaultMaxConnections,
			MaxBatchEvents: ingest.DefaultMaxBatchEvents,
			MaxBatchBytes:  ingest.DefaultMaxBatchBytes,
		},
		DedupWindow:      queue.DefaultDedupWindow,
		ShutdownGrace:    proxy.DefaultShutdownGrace,
		MaxConnsPerHost:  egress.DefaultMaxConnsPerHost,
		MaxInFlight:      proxy.DefaultMaxInFlight,
		MinFreeDiskBytes: queue.DefaultMinFreeBytes,
		LogLevel:         defaultLogLevel,
		LogFormat:        defaultLogFormat,
		SocketMode:       defaultSocketMode,
		RetryBudget:      RetryBudgetConfig{Ratio: budget.Ratio, MinPerSecond: budget.MinPerSecond, Window: budget.Window},
		Log:              LogConfig{Backend: BackendBadger}, // one sidecar, its own log: unchanged unless fleet mode is asked for
		JetStream:        defaultJetStream(),
		OTel:             defaultOTel(),
		CloudEvents:      CloudEventsConfig{Source: cloudevents.DefaultSource},
		TenantDefaults: TenantDefaultsConfig{
			MaxSubscriptions:           delivery.DefaultTenantMaxSubscriptions,
			Concurrency:                TenantConcurrencyConfig{Max: delivery.DefaultTenantMaxConcurrency},
			MaxSubscriptionConcurrency: delivery.DefaultTenantMaxSubscriptionConcurrency,
		},
	}
}

// defaultJetStream is jetstream's defaults; NodeID's default, the host
// name, is filled in by Load.
func defaultJetStream() JetStreamConfig {
	return JetStreamConfig{Stream: jetstream.DefaultStream, Replicas: jetstream.DefaultReplicas, LeaseTTL: jetstream.DefaultLeaseTTL}
}

// applyDefaults fills each subscription's zero fields. It runs after
// decoding because defaults cannot be layered into list elements. The
// values are the owners': policy's WithDefaults for the retry schedule, the
// breaker and the auto cap, proxy's constants for the rest. Where a zero
// can be meant (concurrency.headroom: 0) or must be reported
// (breaker.failure_ratio: 0), only keys the source left out are filled;
// see keySet.
func (c *Config) applyDefaults() {
	retry := policy.DefaultRetryPolicy()
	breaker := policy.BreakerConfig{}.WithDefaults()
	auto := policy.AutoCapConfig{}.WithDefaults()
	for i := range c.Subscriptions {
		s := &c.Subscriptions[i]
		set := s.explicit
		if len(s.Types) == 0 {
			s.Types = []string{"*"}
		}
		fill(&s.Timeout, delivery.DefaultTimeout, set.has(keyTimeout))
		if r := &s.Rate; r.PerSecond > 0 && r.Burst == 0 && !set.has(keyRateBurst) {
			r.Burst = max(1, int(math.Ceil(min(r.PerSecond, maxRatePerSecond))))
		}
		if cc := &s.Concurrency; cc.Auto {
			fill(&cc.Max, auto.Max, set.has(keyConcurrencyMax))
			fill(&cc.Min, auto.Min, set.has(keyConcurrencyMin))
			fill(&cc.Headroom, auto.Headroom, set.has(keyConcurrencyHeadroom))
		} else {
			fill(&cc.Max, delivery.DefaultMaxConcurrency, set.has(keyConcurrencyMax))
		}
		r := &s.Retry
		fill(&r.MaxAttempts, retry.MaxAttempts, set.has(keyRetryMaxAttempts))
		fill(&r.MaxAge, retry.MaxAge, set.has(keyRetryMaxAge))
		fill(&r.Base, retry.Backoff.Base, set.has(keyRetryBase))
		fill(&r.Cap, retry.Backoff.Cap, set.has(keyRetryCap))
		b := &s.Breaker
		fill(&b.FailureRatio, breaker.FailureRatio, set.has(keyBreakerFailureRatio))
		fill(&b.MinRequests, breaker.MinRequests, set.has(keyBreakerMinRequests))
		fill(&b.Window, breaker.Window, set.has(keyBreakerWindow))
		fill(&b.ConsecutiveTimeouts, breaker.ConsecutiveTimeouts, set.has(keyBreakerConsecutiveTimeouts))
		fill(&b.CoolDown, breaker.CoolDown, set.has(keyBreakerCoolDown))
		fill(&b.MaxCoolDown, breaker.MaxCoolDown, set.has(keyBreakerMaxCoolDown))
	}
}

// fill sets a zero field to its default unless the source spelled the zero
// out, in which case it stays for Validate to judge.
func fill[T comparable](field *T, def T, explicit bool) {
	var zero T
	if *field == zero && !explicit {
		*field = def
	}
}

// Policy returns the retry budget as policy takes it.
func (rb RetryBudgetConfig) Policy() policy.BudgetConfig {
	return policy.BudgetConfig{Ratio: rb.Ratio, MinPerSecond: rb.MinPerSecond, Window: rb.Window}
}

// Policy returns the retry schedule as policy takes it (Backoff.Rand nil:
// math/rand/v2).
func (r RetryConfig) Policy() policy.RetryPolicy {
	return policy.RetryPolicy{MaxAttempts: r.MaxAttempts, MaxAge: r.MaxAge, Backoff: policy.Backoff{Base: r.Base, Cap: r.Cap}}
}

// Policy returns the breaker settings as policy takes them.
func (b BreakerConfig) Policy() policy.BreakerConfig {
	return policy.BreakerConfig{
		Window: b.Window, MinRequests: b.MinRequests, FailureRatio: b.FailureRatio,
		ConsecutiveTimeouts: b.ConsecutiveTimeouts, CoolDown: b.CoolDown, MaxCoolDown: b.MaxCoolDown,
	}
}

// AutoCap returns the Little's-law cap settings as policy takes them, or
// nil for a static cap (Max). Interval is left zero: policy's default.
func (c ConcurrencyConfig) AutoCap() *policy.AutoCapConfig {
	if !c.Auto {
		return nil
	}
	return &policy.AutoCapConfig{Min: c.Min, Max: c.Max, Headroom: c.Headroom}
}
