package config

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// Limits checked by Validate. The bounds of the retry budget, the
// breaker, the retry schedule and the concurrency caps are policy's
// (policy.BudgetConfig.Validate and the like), not repeated here.
const (
	maxMaxBodyBytes  = 64 << 20
	minMaxDiskBytes  = 64 << 20
	minDedupWindow   = time.Minute
	minTimeout       = time.Millisecond
	maxTimeout       = 5 * time.Minute
	maxRatePerSecond = 1e6 // keeps the default burst, ceil(per_second), a sane int
	// minRatePerSecond is one delivery every 1000 s (about 17 minutes):
	// slower is a paused subscription, which paused says, and far slower
	// overflowed the lane's wake-up (1s/1e-300) into a busy loop.
	minRatePerSecond = 0.001
	// maxRateBurst is the burst of the fastest rate's default.
	maxRateBurst     = 1_000_000
	minBacklogMaxAge = time.Second
	// maxBacklogMaxAge and maxBacklogEvents bound the backlog quota far
	// above any real one, so a value is a limit and not a typo that
	// overflows (a count) or that no event ever reaches.
	maxBacklogMaxAge = 30 * 24 * time.Hour
	maxBacklogEvents = 1_000_000_000
	maxUnixPathLen   = 107 // sun_path is 108 bytes including the NUL on Linux
	// The sizes of a subscription's lists and strings. Each lane keeps
	// its subscription in memory and matches its types on every event,
	// and a tenant's token may write them through the admin API, so
	// none may grow without bound; these are far past what any receiver
	// needs. A type or pattern is at most 128 bytes (typePattern).
	maxTypes           = 64
	maxTypeBytes       = 128
	maxURLBytes        = 2048
	maxHeaders         = 32
	maxHeaderNameBytes = 256
	maxHeaderValBytes  = 8192
	maxSecrets         = 16
	// maxTenantConcurrency bounds a tenant's bulkhead: ten subscriptions at
	// the largest cap each (policy.ValidateCap's 10,000).
	maxTenantConcurrency = 100_000
)

var (
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	typePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// Validate checks every value and returns the first problem as a
// *ValidationError. It does not fill in defaults. As a side effect it
// resolves secrets into SubscriptionConfig.Resolved (reading secret files and
// secret_env variables), the admin token into Admin.ResolvedToken and the
// classify overrides into SubscriptionConfig.ClassifyOverrides, so callers
// never read or parse them again.
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
	if err := c.Admin.resolveTenantTokens(); err != nil {
		return err
	}
	if c.Admin.ResolvedToken == "" && !c.Admin.InsecureNoToken && !loopbackListen(c.Admin.Listen) {
		return fieldErr("admin.listen", c.Admin.Listen, newReason(ErrMissingValue,
			"is not a loopback address and no operator token is set: set admin.token_file (or admin.token), or admin.insecure_no_token: true to let anyone who can reach it, a browser page too, run the admin API"))
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
	if c.MemoryBytes != 0 && c.MemoryBytes < proxy.MinMemoryBytes {
		return fieldErr("memory_bytes", c.MemoryBytes, invalidf("must be 0 (from the container's limit) or at least %d (16 MiB: the log's memtables and the runtime)", proxy.MinMemoryBytes))
	}
	if c.MinFreeDiskBytes < 0 {
		return fieldErr("min_free_disk_bytes", c.MinFreeDiskBytes, invalidf("must not be negative (0 disables the floor)"))
	}
	if err := c.RetryBudget.validate(); err != nil {
		return err
	}
	if err := c.Egress.validate("egress", false, false); err != nil {
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
	if err := c.validateFleet(); err != nil {
		return err
	}
	if err := c.CloudEvents.validate(); err != nil {
		return err
	}

	lookup := c.lookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if err := c.OTel.validate(lookup); err != nil {
		return err
	}
	if err := c.Admin.OperationalWebhook.validate("admin.operational_webhook", lookup, c.AllowPrivateTargets); err != nil {
		return err
	}
	if err := c.validateTenants(); err != nil {
		return err
	}
	own, target := c.checkEachSubscription(lookup)
	seen := make(map[string]int, len(c.Subscriptions))
	perTenant := map[string]int{}
	for i := range c.Subscriptions {
		s := &c.Subscriptions[i]
		if own[i] != nil {
			return own[i]
		}
		if j, dup := seen[s.ID]; dup {
			return fieldErr(subscriptionPath(i)+".id", s.ID, newReason(ErrDuplicate, "duplicate id: subscriptions[%d] and subscriptions[%d] both use it", j, i))
		}
		if target[i] != nil {
			return target[i]
		}
		seen[s.ID] = i
		if s.Tenant != "" {
			perTenant[s.Tenant]++
		}
	}
	listed := make(map[string]bool, len(c.Tenants))
	for i, t := range c.Tenants {
		listed[t.ID] = true
		field, limit := fmt.Sprintf("tenants[%d].max_subscriptions", i), t.MaxSubscriptions
		if t.SubscriptionsLimit() == 0 {
			field, limit = "tenant_defaults.max_subscriptions", c.TenantDefaults.MaxSubscriptions
		}
		if n := perTenant[t.ID]; limit > 0 && n > limit {
			return fieldErr(field, limit, invalidf("tenant %q has %d subscriptions in the file, more than it allows", t.ID, n))
		}
	}
	for _, tenant := range slices.Sorted(maps.Keys(perTenant)) {
		if n, limit := perTenant[tenant], c.TenantDefaults.MaxSubscriptions; !listed[tenant] && limit > 0 && n > limit {
			return fieldErr("tenant_defaults.max_subscriptions", limit,
				invalidf("tenant %q (not listed in tenants) has %d subscriptions in the file, more than it allows", tenant, n))
		}
	}
	return nil
}

// checkEachSubscription runs the checks of each subscription alone, its
// own (validate) and, without allow_private_targets, its target's, and
// returns their errors by index. A long list is checked on every core (a
// 50,000-subscription file spent 70 ms here on one). Validate
// reports the first error in list order, with the duplicate-id check
// between the two, so each worker stops at its first error: Validate
// never looks past it. lookup is called from every worker at once, so it
// must be safe for concurrent use (os.LookupEnv and envLookup's are), as
// must any check added to SubscriptionConfig.validate.
func (c *Config) checkEachSubscription(lookup func(string) (string, bool)) (own, target []error) {
	subs := c.Subscriptions
	own, target = make([]error, len(subs)), make([]error, len(subs))
	check := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p := subscriptionPath(i)
			if own[i] = subs[i].validate(p, lookup); own[i] != nil {
				return
			}
			if !c.AllowPrivateTargets {
				if target[i] = checkTarget(p+".url", subs[i].URL); target[i] != nil {
					return
				}
			}
		}
	}
	n := runtime.GOMAXPROCS(0)
	if n < 2 || len(subs) < 4096 {
		check(0, len(subs))
		return own, target
	}
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() { check(len(subs)*w/n, len(subs)*(w+1)/n) })
	}
	wg.Wait()
	return own, target
}

func subscriptionPath(i int) string { return "subscriptions[" + strconv.Itoa(i) + "]" }

// checkTarget refuses a URL the SSRF guard would refuse when that is
// known without DNS (privateHost).
func checkTarget(field, raw string) error {
	if why := privateHost(raw); why != "" {
		return fieldErr(field, safeURL(raw), invalidf("is %s; set allow_private_targets: true to deliver there", why))
	}
	return nil
}

// validateTenants checks the tenants' ids and limits; Validate checks
// max_subscriptions against the file's subscriptions.
func (c *Config) validateTenants() error {
	d := c.TenantDefaults
	if d.MaxSubscriptions < 0 {
		return fieldErr("tenant_defaults.max_subscriptions", d.MaxSubscriptions, invalidf("must not be negative (0 means no limit)"))
	}
	if m := d.Concurrency.Max; m < 1 || m > maxTenantConcurrency {
		return fieldErr("tenant_defaults.concurrency.max", m, invalidf("must be between 1 and %d", maxTenantConcurrency))
	}
	if m := d.MaxSubscriptionConcurrency; m < 1 || m > policy.MaxConcurrency {
		return fieldErr("tenant_defaults.max_subscription_concurrency", m, invalidf("must be between 1 and %d", policy.MaxConcurrency))
	}
	ids := make(map[string]int, len(c.Tenants))
	for i, t := range c.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		if err := validateID(p+".id", t.ID); err != nil {
			return err
		}
		if j, dup := ids[t.ID]; dup {
			return fieldErr(p+".id", t.ID, newReason(ErrDuplicate, "duplicate id: tenants[%d] and tenants[%d] both use it", j, i))
		}
		ids[t.ID] = i
		if t.MaxSubscriptions < 0 {
			return fieldErr(p+".max_subscriptions", t.MaxSubscriptions, invalidf("must not be negative (0 means no limit)"))
		}
		if m := t.Concurrency.Max; m != 0 || t.Concurrency.maxSet {
			if m < 1 || m > maxTenantConcurrency {
				return fieldErr(p+".concurrency.max", m, invalidf("must be between 1 and %d; omit it for tenant_defaults'", maxTenantConcurrency))
			}
		}
		if m := t.MaxSubscriptionConcurrency; m != 0 || t.maxSubscriptionConcurrencySet {
			if m < 1 || m > policy.MaxConcurrency {
				return fieldErr(p+".max_subscription_concurrency", m, invalidf("must be between 1 and %d; omit it for tenant_defaults'", policy.MaxConcurrency))
			}
		}
		if err := validateTypeList(p+".shared_types", t.SharedTypes); err != nil {
			return err
		}
		if err := validateBacklog(p, t.Backlog); err != nil {
			return err
		}
		if t.MaxDeadLetters < 0 || t.MaxDeadLetters > maxBacklogEvents {
			return fieldErr(p+".max_dead_letters", t.MaxDeadLetters, invalidf("must be between 0 (the default, 100000) and %d", maxBacklogEvents))
		}
	}
	return nil
}

// validateTypeList checks a list of event types and patterns (a
// subscription's types, a tenant's shared_types) named field.
func validateTypeList(field string, list []string) error {
	if len(list) > maxTypes {
		return fieldErr(field, nil, invalidf("lists %d types, more than %d; use a pattern like \"geofence.*\" or \"*\"", len(list), maxTypes))
	}
	types := make(map[string]bool, len(list))
	for i, t := range list {
		f := fmt.Sprintf("%s[%d]", field, i)
		if len(t) > maxTypeBytes {
			return fieldErr(f, nil, invalidf("is %d bytes, more than %d", len(t), maxTypeBytes))
		}
		if t != "*" && policy.IsTypePattern(t) {
			if err := policy.ValidTypePattern(t); err != nil {
				return fieldErr(f, t, &reason{kind: ErrInvalidValue, msg: err.Error(), cause: err})
			}
		} else if t != "*" && !typePattern.MatchString(t) {
			return fieldErr(f, t, invalidf(`must be "*" or an event type matching %s, or a pattern like "geofence.*"`, typePattern))
		}
		if types[t] {
			return fieldErr(f, t, newReason(ErrDuplicate, "listed twice"))
		}
		types[t] = true
	}
	if types["*"] && len(list) > 1 {
		return fieldErr(field, list, newReason(ErrConflict, `"*" already matches every type; list it alone`))
	}
	return nil
}

// validateID checks a required id: a subscription's, a tenant's.
func validateID(field, id string) error {
	if id == "" {
		return fieldErr(field, nil, newReason(ErrMissingValue, "required"))
	}
	if !idPattern.MatchString(id) {
		return fieldErr(field, id, invalidf("must match %s", idPattern))
	}
	return nil
}

// validate checks a webhook of sluice's own (p is its key) and resolves
// its secrets, by a subscription's rules; the zero WebhookConfig is none.
func (w *WebhookConfig) validate(p string, lookup func(string) (string, bool), allowPrivate bool) error {
	w.Resolved = nil
	if w.URL == "" && w.Secret == "" && w.Secrets == nil && w.SecretFile == "" && w.SecretEnv == "" {
		return nil
	}
	if err := validateURL(p+".url", w.URL); err != nil {
		return err
	}
	if !allowPrivate {
		if err := checkTarget(p+".url", w.URL); err != nil {
			return err
		}
	}
	s := SubscriptionConfig{Secret: w.Secret, Secrets: w.Secrets, SecretFile: w.SecretFile, SecretEnv: w.SecretEnv}
	if err := s.resolveSecrets(p, lookup); err != nil {
		return err
	}
	w.Resolved = s.Resolved
	return nil
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
	if ic.MaxBatchEvents < 1 || ic.MaxBatchEvents > 100_000 {
		return fieldErr("ingest.max_batch_events", ic.MaxBatchEvents, invalidf("must be between 1 and 100000"))
	}
	if ic.MaxBatchBytes < 1<<10 || ic.MaxBatchBytes > maxMaxBodyBytes {
		return fieldErr("ingest.max_batch_bytes", ic.MaxBatchBytes, invalidf("must be between 1024 and %d (64 MiB)", maxMaxBodyBytes))
	}
	return nil
}

// validate checks the retry budget against policy's bounds.
func (rb RetryBudgetConfig) validate() error {
	return policyErr("", rb.Policy().Validate())
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

// loopbackListen reports whether a valid listen address is reachable only
// from this host: a unix socket, or a loopback IP or "localhost". A host
// name may resolve to anything, and an empty host or 0.0.0.0 binds every
// interface.
func loopbackListen(v string) bool {
	if strings.HasPrefix(v, "unix://") {
		return true
	}
	host, _, err := net.SplitHostPort(v)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// validate checks one subscription, p being its key, and resolves its
// secrets; with lookup nil only inline secrets (secret, secrets) are
// accepted (ParseSubscription).
func (s *SubscriptionConfig) validate(p string, lookup func(string) (string, bool)) error {
	if err := validateID(p+".id", s.ID); err != nil {
		return err
	}
	if s.ID == delivery.OperationalID {
		return fieldErr(p+".id", s.ID, invalidf("is the operational webhook's lane (admin.operational_webhook)"))
	}
	if err := validateURL(p+".url", s.URL); err != nil {
		return err
	}
	if err := s.resolveSecrets(p, lookup); err != nil {
		return err
	}
	if s.Tenant != "" && !idPattern.MatchString(s.Tenant) {
		return fieldErr(p+".tenant", s.Tenant, invalidf("must match %s", idPattern))
	}

	if len(s.Types) == 0 {
		return fieldErr(p+".types", nil, newReason(ErrMissingValue, `must list event types or "*"`))
	}
	if err := validateTypeList(p+".types", s.Types); err != nil {
		return err
	}
	if err := s.parseFilter(p); err != nil {
		return err
	}
	if err := s.parseBody(p); err != nil {
		return err
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
	if err := policyErr(p, s.Retry.Policy().Validate()); err != nil {
		return err
	}
	if err := s.validateBacklog(p); err != nil {
		return err
	}
	switch s.Ordering {
	case "", delivery.OrderingNone, delivery.OrderingKey, delivery.OrderingFIFO:
	default:
		return fieldErr(p+".ordering", s.Ordering, invalidf("must be none, key or fifo"))
	}
	switch s.Format {
	case "", delivery.FormatStandardWebhooks, delivery.FormatCloudEventsBinary, delivery.FormatCloudEventsStructured:
	default:
		return fieldErr(p+".format", s.Format, invalidf("must be %s, %s or %s",
			delivery.FormatStandardWebhooks, delivery.FormatCloudEventsBinary, delivery.FormatCloudEventsStructured))
	}
	if err := policyErr(p, s.Breaker.Policy().Validate()); err != nil {
		return err
	}

	if len(s.Headers) > maxHeaders {
		return fieldErr(p+".headers", nil, invalidf("has %d headers, more than %d", len(s.Headers), maxHeaders))
	}
	lower := make(map[string]string, len(s.Headers))
	for _, name := range slices.Sorted(maps.Keys(s.Headers)) {
		if len(name) > maxHeaderNameBytes {
			return fieldErr(p+".headers", nil, invalidf("a header name is %d bytes, more than %d", len(name), maxHeaderNameBytes))
		}
		f := p + ".headers[" + name + "]"
		value := s.Headers[name]
		if !validHeaderName(name) {
			return fieldErr(p+".headers", name, invalidf("not a valid header name"))
		}
		if len(value) > maxHeaderValBytes {
			return fieldErr(f, nil, invalidf("value is %d bytes, more than %d", len(value), maxHeaderValBytes))
		}
		if reservedHeader(name) {
			return fieldErr(f, nil, invalidf("sluice sets this header itself; it cannot be overridden"))
		}
		if s.cloudEvents() && len(name) >= 3 && strings.EqualFold(name[:3], "ce-") {
			return fieldErr(f, nil, invalidf("a CloudEvents attribute's header: sluice sets the ce- headers of a subscription with format %s", s.Format))
		}
		if prev, ok := lower[strings.ToLower(name)]; ok {
			return fieldErr(f, nil, newReason(ErrDuplicate, "same header as %q (header names ignore case)", prev))
		}
		lower[strings.ToLower(name)] = name
		if !validHeaderValue(value) {
			return fieldErr(f, value, invalidf("header value must not contain control characters"))
		}
	}
	if err := s.validateEndpoint(p); err != nil { // egress.go
		return err
	}

	return s.parseClassify(p)
}

// parseFilter checks the body filter with policy's parser and keeps the
// result in ParsedFilter; policy's message names the operator and path.
func (s *SubscriptionConfig) parseFilter(p string) error {
	s.ParsedFilter = nil
	if len(s.Filter) == 0 {
		return nil
	}
	f, err := policy.ParseFilter(s.Filter)
	if err != nil {
		// policy's message starts "filter: ", which the key already says.
		msg := strings.TrimPrefix(err.Error(), "filter: ")
		return fieldErr(p+".filter", nil, &reason{kind: ErrInvalidValue, msg: msg, cause: err})
	}
	s.ParsedFilter = f
	return nil
}

// parseBody checks the body variant with policy's parser and keeps the
// result in ParsedVariant. A key the source spells out counts even when
// empty: body: {} and fields: [] are refused, not read as "no variant".
func (s *SubscriptionConfig) parseBody(p string) error {
	s.ParsedVariant = nil
	b, set := s.Body, s.explicit
	if b.Envelope == "" && b.Fields == nil && !set.has(keyBody|keyBodyEnvelope|keyBodyFields) {
		return nil // body left out: the stored bytes
	}
	if b.Envelope == "" && set.has(keyBodyEnvelope) {
		return fieldErr(p+".body.envelope", "", invalidf("must be %q; leave envelope out for none", policy.EnvelopeStandardWebhooks))
	}
	spec := policy.VariantSpec{Envelope: b.Envelope, Fields: b.Fields}
	if spec.Fields == nil && set.has(keyBodyFields) {
		spec.Fields = []string{}
	}
	v, err := policy.ParseVariant(spec)
	if err != nil {
		return policyErr(p, err)
	}
	s.ParsedVariant = v
	return nil
}

// parseClassify checks the classify overrides and keeps them parsed in
// ClassifyOverrides, the one parse the wiring uses. Keys are reported in
// sorted order, like policy.ParseClassify.
func (s *SubscriptionConfig) parseClassify(p string) error {
	s.ClassifyOverrides = nil
	if len(s.Classify) == 0 {
		return nil
	}
	out := make(map[int]policy.Outcome, len(s.Classify))
	for _, code := range slices.Sorted(maps.Keys(s.Classify)) {
		n, err := strconv.Atoi(code)
		if err != nil || len(code) != 3 || n < 100 || n > 599 {
			return fieldErr(p+".classify", code, invalidf("keys must be HTTP status codes from 100 to 599"))
		}
		o, err := policy.ParseOutcome(s.Classify[code])
		if err != nil {
			return fieldErr(p+".classify["+code+"]", s.Classify[code], &reason{kind: ErrInvalidValue, msg: "must be ack, retry or dead_letter", cause: err})
		}
		out[n] = o
	}
	s.ClassifyOverrides = out
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
	if r.PerSecond < minRatePerSecond {
		return fieldErr(p+".rate.per_second", r.PerSecond, invalidf("must be at least %g (one delivery every %v); pause the subscription to stop it", minRatePerSecond, time.Duration(float64(time.Second)/minRatePerSecond)))
	}
	if r.Burst < 1 {
		return fieldErr(p+".rate.burst", r.Burst, invalidf("must be at least 1"))
	}
	if r.Burst > maxRateBurst {
		return fieldErr(p+".rate.burst", r.Burst, invalidf("must be at most %d", maxRateBurst))
	}
	return nil
}

// validateConcurrency checks the static cap, or the bounds of the
// automatic one, against policy's bounds; the keys that only mean
// something with auto are this package's to refuse.
func (s *SubscriptionConfig) validateConcurrency(p string) error {
	c := s.Concurrency
	if !c.Auto {
		if err := policyErr(p, policy.ValidateCap(c.Max)); err != nil {
			return err
		}
		if c.Min != 0 || s.explicit.has(keyConcurrencyMin) {
			return fieldErr(p+".concurrency.min", c.Min, newReason(ErrConflict, "only with auto: true"))
		}
		if c.Headroom != 0 || s.explicit.has(keyConcurrencyHeadroom) {
			return fieldErr(p+".concurrency.headroom", c.Headroom, newReason(ErrConflict, "only with auto: true"))
		}
		return nil
	}
	// Interval has no key; it is checked at the default the lane runs with.
	auto := *c.AutoCap()
	auto.Interval = policy.DefaultAutoCapInterval
	return policyErr(p, auto.Validate())
}

// validateBacklog checks the backlog quota; zero fields mean no limit.
func (s *SubscriptionConfig) validateBacklog(p string) error { return validateBacklog(p, s.Backlog) }

// validateBacklog checks a backlog quota under p (a subscription's, a
// tenant's bound); zero fields mean no limit, or the default.
func validateBacklog(p string, b BacklogConfig) error {
	if b.MaxEvents < 0 {
		return fieldErr(p+".backlog.max_events", b.MaxEvents, invalidf("must not be negative (0 means no limit)"))
	}
	if b.MaxEvents > maxBacklogEvents {
		return fieldErr(p+".backlog.max_events", b.MaxEvents, invalidf("must be at most %d (0 means no limit)", maxBacklogEvents))
	}
	if b.MaxAge != 0 && b.MaxAge < minBacklogMaxAge {
		return fieldErr(p+".backlog.max_age", b.MaxAge, invalidf("must be at least %v, or 0s for no limit", minBacklogMaxAge))
	}
	if b.MaxAge > maxBacklogMaxAge {
		return fieldErr(p+".backlog.max_age", b.MaxAge, invalidf("must be at most %v, or 0s for no limit", maxBacklogMaxAge))
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
	if len(raw) > maxURLBytes {
		return fieldErr(field, nil, invalidf("is %d bytes, more than %d", len(raw), maxURLBytes))
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
	if why := oddIPHost(u.Hostname()); why != "" {
		return fieldErr(field, safeURL(raw), invalidf("%s", why))
	}
	return nil
}

// oddIPHost says why host, a URL's, is refused as an IP address spelt
// other than canonically, or returns "". The C resolver (getaddrinfo,
// inet_aton) reads "2130706433", "0x7f000001", "127.1", "0" and
// "0177.0.0.1" as IPv4 addresses (the last as 127.0.0.1, octal), and
// browsers' URL parsers do too, while Go's netip reads none of them: the
// load-time SSRF check and whoever reads the URL would judge different
// addresses. What the WHATWG URL standard treats as an IPv4 address (a
// host whose last label is a decimal or 0x number) must therefore be a
// dotted quad as netip writes it.
func oddIPHost(host string) string {
	if strings.Contains(host, ":") {
		return "" // an IPv6 literal, which url.Parse has checked with netip
	}
	labels := strings.Split(strings.TrimSuffix(host, "."), ".")
	last := strings.ToLower(labels[len(labels)-1])
	hex, isHex := strings.CutPrefix(last, "0x")
	if last == "" || !allIn(last, "0123456789") && !(isHex && allIn(hex, "0123456789abcdef")) {
		return "" // a name: its last label is not a number
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() && ip.String() == host {
		return ""
	}
	return "host " + strconv.Quote(host) + " is an IPv4 address in another spelling (decimal, hex, octal, leading zeros or fewer than four parts), which resolvers read differently; write it as four decimal numbers, like 192.0.2.1"
}

// allIn reports whether s is made only of bytes in set; "" is.
func allIn(s, set string) bool {
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(set, s[i]) < 0 {
			return false
		}
	}
	return true
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
// (the webhook-* signature headers, the event's own headers, the trace
// context and the ordering and replay headers below) and the hop-by-hop headers that would break the
// HTTP exchange itself.
func reservedHeader(name string) bool {
	n := strings.ToLower(name)
	if strings.HasPrefix(n, "webhook-") {
		return true
	}
	switch n {
	case "idempotency-key", "x-event-type", "x-attempt", "content-type", "content-length", "host",
		"traceparent", "tracestate", // the event's trace context: a fixed one would be every attempt's parent
		"ordering-key", "x-sluice-replay", // set on ordered subscriptions' and replays' deliveries
		"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade":
		return true
	}
	return false
}
