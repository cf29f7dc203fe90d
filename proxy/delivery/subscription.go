package delivery

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/egress"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

// ErrManagedByAPI: the admin API owns the subscription; the file may
// not name it (a reload naming one is refused).
var ErrManagedByAPI = errors.New("managed by the admin API")

// Defaults for a subscription's delivery settings, documented as the
// defaults of its configuration keys.
const (
	DefaultTimeout        = 10 * time.Second
	DefaultMaxConcurrency = 16
)

// Subscription is one endpoint and how to deliver to it. The proxy treats a
// Subscription as immutable once handed over; a reload replaces it whole.
type Subscription struct {
	ID             string
	URL            string
	Secrets        []signing.Secret // all active secrets sign every delivery (rotation)
	Types          []string         // event types, or "*" for all
	Timeout        time.Duration    // one HTTP exchange; DefaultTimeout if 0
	MaxConcurrency int              // in-flight cap; DefaultMaxConcurrency if 0
	Retry          policy.RetryPolicy
	Headers        map[string]string
	Classify       map[int]policy.Outcome // status overrides; nil for the defaults
	Paused         bool
	// Rate is a token bucket applied before a slot is taken; a zero
	// PerSecond means unlimited.
	Rate RateLimit
	// Auto, when set, replaces the static MaxConcurrency with a cap derived
	// from Little's law (policy.AutoCap).
	Auto *policy.AutoCapConfig
	// Backlog bounds what may wait: past it the oldest waiting events are
	// dead-lettered with reason backlog_quota. Zero fields mean no limit.
	Backlog BacklogQuota
	// Breaker configures the circuit breaker; zero fields take policy's
	// defaults.
	Breaker policy.BreakerConfig
	// Tenant, when set, scopes the subscription to one tenant: its tokens
	// see and manage it, and the tenant's limits bound it.
	Tenant string
	// Filter, when set, passes only the events whose JSON body matches;
	// the others count as resolved for this subscription.
	Filter *policy.Filter
	// Variant, when set, is the body variant the subscription is sent
	// instead of the stored bytes (variant.go): rendered once
	// per event for every subscription with an equal variant, signed as
	// sent, Content-Type application/json. Nil sends the stored bytes.
	Variant *policy.Variant
	// Ordering is OrderingNone (the zero value means it too),
	// OrderingKey (events sharing an Ordering-Key go in acceptance order,
	// one at a time) or OrderingFIFO (one key for all): see ordering.go.
	Ordering string
	// Format is FormatStandardWebhooks (the zero value means it too),
	// FormatCloudEventsBinary or FormatCloudEventsStructured: how the
	// event travels (format.go). Every format is signed the same way.
	Format string
	// ManagedBy is ManagedByFile (the zero value means it too) or
	// ManagedByAPI.
	ManagedBy string
	// Spec is the subscription as the config file or the API wrote it
	// (JSON in the config file's keys). For ManagedByAPI it holds the
	// secrets and is what a PATCH merges into; for a file subscription it
	// is already redacted.
	Spec []byte
	// SecretExpiry, when set, runs parallel to Secrets: a secret stops
	// signing at its time (zero: never). Secrets are kept newest first and
	// the expiring ones last, latest expiry first, so the secrets that
	// still sign are always a prefix (LiveSecrets slices, never copies).
	SecretExpiry []time.Time

	// Egress, when set, replaces Options.Egress for this subscription
	// whole (a Proxy of "" goes direct); TLS sets the client certificate,
	// CAs and name of its https connections; Auth adds an OAuth2 bearer
	// token to its requests. Nil: the defaults. See package egress.
	Egress *egress.Egress
	TLS    *egress.ClientTLS
	Auth   *egress.OAuth2

	// bulkhead is the tenant's concurrency cap; nil for none. Set when the
	// subscription joins.
	bulkhead *bulkhead
	// binding is the route and token source of Egress, TLS and Auth; the
	// zero Binding when the defaults serve. Set when the subscription
	// joins (Routes.Attach).
	binding egress.Binding
}

// LiveSecrets are the secrets that sign a delivery made at now: all of
// them, or, during a rotation's grace, those not yet expired.
func (s *Subscription) LiveSecrets(now time.Time) []signing.Secret {
	if s.SecretExpiry == nil {
		return s.Secrets
	}
	n := len(s.Secrets)
	for n > 1 && !s.SecretExpiry[n-1].IsZero() && !now.Before(s.SecretExpiry[n-1]) {
		n--
	}
	return s.Secrets[:n]
}

// ManagedByAPI reports whether the API, not the config file, owns s.
func (s *Subscription) ManagedByAPI() bool { return s.ManagedBy == api.ManagedByAPI }

// RateLimit is a token bucket: PerSecond tokens a second, at most Burst at once.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// BacklogQuota bounds a subscription's backlog by count and by age.
type BacklogQuota struct {
	MaxEvents int64
	MaxAge    time.Duration
}

// WithDefaults fills zero fields with the defaults, in place: a
// Subscription belongs to the proxy once handed over, and copying 50,000 of
// them would double their memory. The retry policy's defaults are
// policy's (RetryPolicy.WithDefaults); Breaker and Auto stay as given,
// since NewBreaker and NewAutoCap fill their zero fields when the lane
// builds them.
func (s *Subscription) WithDefaults() *Subscription {
	if s.Timeout <= 0 {
		s.Timeout = DefaultTimeout
	}
	if s.MaxConcurrency <= 0 {
		s.MaxConcurrency = DefaultMaxConcurrency
	}
	// Written only when a default is missing: a Subscription handed over
	// again by Reload is being read by its lane meanwhile.
	if r := s.Retry.WithDefaults(); r.MaxAttempts != s.Retry.MaxAttempts || r.MaxAge != s.Retry.MaxAge ||
		r.Backoff.Base != s.Retry.Backoff.Base || r.Backoff.Cap != s.Retry.Backoff.Cap {
		s.Retry = r
	}
	if len(s.Types) == 0 {
		s.Types = []string{"*"}
	}
	return s
}

// matcher returns the type filter of a subscription: nil matches all.
func (s *Subscription) matcher() func(typ []byte) bool { return policy.MatchTypes(s.Types) }

// typePatterns reports whether s's types hold a wildcard segment
// ("geofence.*"). Such a lane cannot be woken by exact type like the
// others: it wakes on every commit and lets its matcher decide.
func (s *Subscription) typePatterns() bool { return slices.ContainsFunc(s.Types, policy.IsTypePattern) }

// exactTypes reports whether s lists exact types only (no "*", no
// pattern): its lane can be woken by the types committed.
func (s *Subscription) exactTypes() bool {
	return !slices.Contains(s.Types, "*") && !s.typePatterns()
}

// passes reports whether ev's body passes s's filter (true without one).
// The body is decoded by the first filtering lane that looks at the event
// and kept on it for the others (the ring shares one *Event between
// lanes): at most once per event, bar two lanes racing for the first
// decode. Decoding here, not at commit, keeps it off the committer (a
// 202 never waits for it) and away from events no filtering lane takes.
func (s *Subscription) passes(ev *queue.Event) bool {
	if s.Filter == nil {
		return true
	}
	d := ev.Decoded()
	if d == nil {
		doc, ok := policy.DecodeDocument(ev.Body)
		d = ev.CacheDecoded(&queue.Decoded{Doc: doc, JSON: ok})
	}
	return d.JSON && s.Filter.Match(d.Doc)
}

// snapshot is what the log keeps of a subscription's config so that one
// removed from the config can still deliver what it was entitled to. It
// holds the secrets: the data dir is as private as the config file.
type snapshot struct {
	URL         string                `json:"url"`
	Secrets     []string              `json:"secrets"`
	Types       []string              `json:"types"`
	Timeout     time.Duration         `json:"timeout"`
	Concurrency int                   `json:"concurrency"`
	MaxAttempts int                   `json:"max_attempts"`
	MaxAge      time.Duration         `json:"max_age"`
	Base        time.Duration         `json:"base"`
	Cap         time.Duration         `json:"cap"`
	Headers     map[string]string     `json:"headers,omitempty"`
	Classify    map[string]string     `json:"classify,omitempty"`
	Rate        RateLimit             `json:"rate"`
	Auto        *policy.AutoCapConfig `json:"auto,omitempty"`
	Backlog     BacklogQuota          `json:"backlog"`
	Breaker     policy.BreakerConfig  `json:"breaker"`
	// Added with the subscription API; absent in older
	// snapshots, which are all file subscriptions.
	Tenant  string          `json:"tenant,omitempty"`
	Filter  json.RawMessage `json:"filter,omitempty"` // the filter as written
	Managed string          `json:"managed,omitempty"`
	Paused  bool            `json:"paused,omitempty"`
	// Spec is an API subscription's document (a file subscription's is
	// in the file), and Expiry its secrets' rotation deadlines.
	Spec   json.RawMessage `json:"spec,omitempty"`
	Expiry []time.Time     `json:"secret_expiry,omitempty"`
	// Body is the body variant in canonical form (Variant.Key; issue
	// 13): a subscription removed from the config drains with its
	// variant, and an API subscription keeps it across restarts.
	Body json.RawMessage `json:"body,omitempty"`
	// Added with egress and endpoint authentication: file
	// names and settings, no secret.
	Egress *egress.Egress    `json:"egress,omitempty"`
	TLS    *egress.ClientTLS `json:"tls,omitempty"`
	Auth   *egress.OAuth2    `json:"auth,omitempty"`

	// Ordering is the ordering mode; absent for none.
	Ordering string `json:"ordering,omitempty"`
	// Format is the delivery format; absent for standard-webhooks, so
	// older snapshots read as what they were.
	Format string `json:"format,omitempty"`
}

func encodeSnapshot(s *Subscription) []byte {
	sn := snapshot{
		URL: s.URL, Types: s.Types, Timeout: s.Timeout, Concurrency: s.MaxConcurrency,
		MaxAttempts: s.Retry.MaxAttempts, MaxAge: s.Retry.MaxAge, Base: s.Retry.Backoff.Base, Cap: s.Retry.Backoff.Cap,
		Headers: s.Headers, Rate: s.Rate, Auto: s.Auto, Backlog: s.Backlog, Breaker: s.Breaker,
		Tenant: s.Tenant, Expiry: s.SecretExpiry, Egress: s.Egress, TLS: s.TLS, Auth: s.Auth, Ordering: s.orderingMode(),
		Format: s.formatName(),
	}
	if s.ManagedByAPI() {
		sn.Managed, sn.Spec, sn.Paused = s.ManagedBy, s.Spec, s.Paused
	}
	if s.Filter != nil {
		sn.Filter = json.RawMessage(s.Filter.String()) // canonical: equal filters, equal snapshots
	}
	if s.Variant != nil {
		sn.Body = json.RawMessage(s.Variant.Key()) // canonical too
	}
	for _, k := range s.Secrets {
		sn.Secrets = append(sn.Secrets, k.Encode())
	}
	if len(s.Classify) > 0 {
		sn.Classify = map[string]string{}
		for _, code := range slices.Sorted(maps.Keys(s.Classify)) {
			sn.Classify[fmt.Sprint(code)] = s.Classify[code].String()
		}
	}
	b, _ := json.Marshal(sn) // only plain types: cannot fail
	return b
}

func decodeSnapshot(id string, b []byte) (*Subscription, error) {
	var sn snapshot
	if err := json.Unmarshal(b, &sn); err != nil {
		return nil, fmt.Errorf("subscription %s: snapshot: %w", id, err)
	}
	s := &Subscription{
		ID: id, URL: sn.URL, Types: sn.Types, Timeout: sn.Timeout, MaxConcurrency: sn.Concurrency,
		Retry:   policy.RetryPolicy{MaxAttempts: sn.MaxAttempts, MaxAge: sn.MaxAge, Backoff: policy.Backoff{Base: sn.Base, Cap: sn.Cap}},
		Headers: sn.Headers, Rate: sn.Rate, Auto: sn.Auto, Backlog: sn.Backlog, Breaker: sn.Breaker,
		Tenant: sn.Tenant, ManagedBy: sn.Managed, Spec: sn.Spec, SecretExpiry: sn.Expiry, Paused: sn.Paused,
		Egress: sn.Egress, TLS: sn.TLS, Auth: sn.Auth, Ordering: sn.Ordering, Format: sn.Format,
	}
	if len(sn.Filter) > 0 {
		var spec map[string]any
		if err := json.Unmarshal(sn.Filter, &spec); err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: filter: %w", id, err)
		}
		f, err := policy.ParseFilter(spec)
		if err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: %w", id, err)
		}
		s.Filter = f
	}
	if len(sn.Body) > 0 {
		var spec policy.VariantSpec
		if err := json.Unmarshal(sn.Body, &spec); err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: body: %w", id, err)
		}
		v, err := policy.ParseVariant(spec)
		if err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: %w", id, err)
		}
		s.Variant = v
	}
	for _, enc := range sn.Secrets {
		k, err := signing.ParseSecret(enc)
		if err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: %w", id, err)
		}
		s.Secrets = append(s.Secrets, k)
	}
	if len(s.SecretExpiry) != len(s.Secrets) {
		s.SecretExpiry = nil
	}
	if len(sn.Classify) > 0 {
		c, err := policy.ParseClassify(sn.Classify)
		if err != nil {
			return nil, fmt.Errorf("subscription %s: snapshot: %w", id, err)
		}
		s.Classify = c
	}
	return s.WithDefaults(), nil
}
