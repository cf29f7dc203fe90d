package main

import (
	"slices"
	"strings"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/signing"
)

// The conversion of validated config onto the proxy's plain values: the
// file's subscriptions and the API's go through the one function,
// newSubscription.

// subscriptions copies the config file's validated subscriptions onto the
// proxy's. Identical secrets and type lists are shared between
// subscriptions (one HMAC state, one slice), which keeps a lane small when
// thousands of subscriptions repeat them. Each one's Spec is the document
// the file wrote, redacted (config.SubscriptionConfig.Spec), encoded once
// while the file was decoded: no work here, and the bytes of that
// document kept per lane (117 for the lanes-50k bench's subscriptions,
// 128 of heap; BenchmarkStartupSubscriptions50k).
func subscriptions(cfg *config.Config) []*delivery.Subscription {
	out := make([]*delivery.Subscription, 0, len(cfg.Subscriptions))
	in := newInterner()
	for i := range cfg.Subscriptions {
		sc := &cfg.Subscriptions[i]
		out = append(out, newSubscription(sc, api.ManagedByFile, sc.Spec(), in))
	}
	return out
}

// newSubscription copies one validated subscription onto the proxy's;
// in, if not nil, shares secrets and type lists with the others it saw.
func newSubscription(sc *config.SubscriptionConfig, managedBy string, spec []byte, in *interner) *delivery.Subscription {
	secrets, types := sc.Resolved, sc.Types
	if in != nil {
		secrets, types = in.secrets(secrets), in.types(types)
	}
	return &delivery.Subscription{
		ID:             sc.ID,
		URL:            sc.URL,
		Secrets:        secrets,
		Types:          types,
		Timeout:        sc.Timeout,
		MaxConcurrency: sc.Concurrency.Max,
		Retry:          sc.Retry.Policy(),
		Headers:        sc.Headers,
		Classify:       sc.ClassifyOverrides,
		Paused:         sc.Paused,
		Rate:           delivery.RateLimit{PerSecond: sc.Rate.PerSecond, Burst: sc.Rate.Burst},
		Auto:           sc.Concurrency.AutoCap(),
		Backlog:        delivery.BacklogQuota{MaxEvents: sc.Backlog.MaxEvents, MaxAge: sc.Backlog.MaxAge},
		Breaker:        sc.Breaker.Policy(),
		Tenant:         sc.Tenant,
		Filter:         sc.ParsedFilter,
		Variant:        sc.ParsedVariant,
		Ordering:       sc.Ordering,
		Format:         sc.Format,
		ManagedBy:      managedBy,
		Spec:           spec,
		Egress:         sc.ProxyEgress(),
		TLS:            sc.ClientTLS(),
		Auth:           sc.OAuth2(),
	}
}

// interner shares identical secrets and type lists between subscriptions.
type interner struct {
	secretsByKey map[string]signing.Secret
	typeLists    map[string][]string
}

func newInterner() *interner {
	return &interner{secretsByKey: map[string]signing.Secret{}, typeLists: map[string][]string{}}
}

// secrets replaces each secret seen before by the first copy, in place.
func (in *interner) secrets(ss []signing.Secret) []signing.Secret {
	for j, k := range ss {
		enc := k.Encode()
		if prev, ok := in.secretsByKey[enc]; ok {
			ss[j] = prev
		} else {
			in.secretsByKey[enc] = k
		}
	}
	return ss
}

// types returns the first list seen equal to ts.
func (in *interner) types(ts []string) []string {
	key := strings.Join(ts, "\x00")
	if prev, ok := in.typeLists[key]; ok {
		return prev
	}
	in.typeLists[key] = ts
	return ts
}

// specParser is admin.SpecParser over config's parser: the API's
// subscription documents are checked exactly as the file's subscriptions
// are, and converted by newSubscription.
type specParser struct {
	// allowPrivate is allow_private_targets: without it a document whose
	// URL is known to be private is refused, as in the file.
	allowPrivate bool
}

var _ admin.SpecParser = specParser{}

// Parse validates doc (config.ParseSubscription); the subscription's Spec
// is doc as given, secrets included: it is what a PATCH merges into.
func (p specParser) Parse(doc []byte) (*delivery.Subscription, error) {
	sc, err := config.ParseSubscription(doc)
	if err != nil {
		return nil, err
	}
	if !p.allowPrivate {
		if err := sc.CheckPrivateTarget(); err != nil {
			return nil, err
		}
	}
	return newSubscription(sc, api.ManagedByAPI, slices.Clone(doc), nil), nil
}

// Check reads body as the config file's JSON is read
// (config.CheckDocument).
func (specParser) Check(body []byte) error { return config.CheckDocument(body) }

// Redact returns doc as API clients are shown it
// (config.RedactSubscriptionDoc).
func (specParser) Redact(doc []byte) map[string]any { return config.RedactSubscriptionDoc(doc) }

// tenants copies the tenants' limits; a key left out stays 0, which the
// proxy fills from tenantDefaults.
func tenants(cfg *config.Config) []delivery.Tenant {
	var out []delivery.Tenant
	for _, t := range cfg.Tenants {
		out = append(out, delivery.Tenant{ID: t.ID, MaxSubscriptions: t.SubscriptionsLimit(), MaxConcurrency: t.Concurrency.Max,
			MaxSubscriptionConcurrency: t.MaxSubscriptionConcurrency, SharedTypes: t.SharedTypes,
			Backlog: delivery.BacklogQuota{MaxEvents: t.Backlog.MaxEvents, MaxAge: t.Backlog.MaxAge}, MaxDeadLetters: t.MaxDeadLetters})
	}
	return out
}

// tenantDefaults copies tenant_defaults; its max_subscriptions 0 (no
// limit) is the proxy's -1, since the proxy reads 0 as its default.
func tenantDefaults(cfg *config.Config) delivery.Tenant {
	d := cfg.TenantDefaults
	maxSubs := d.MaxSubscriptions
	if maxSubs == 0 {
		maxSubs = -1
	}
	return delivery.Tenant{MaxSubscriptions: maxSubs, MaxConcurrency: d.Concurrency.Max, MaxSubscriptionConcurrency: d.MaxSubscriptionConcurrency}
}

// tenantTokens copies admin.tokens as config resolved them.
func tenantTokens(cfg *config.Config) []admin.TenantToken {
	var out []admin.TenantToken
	for _, t := range cfg.Admin.ResolvedTenantTokens {
		out = append(out, admin.TenantToken{Token: t.Token, Tenant: t.Tenant})
	}
	return out
}

// operationalWebhook is admin.operational_webhook as a subscription, or
// nil when none is configured. Its types match every event: the proxy
// decides which of its own events go there; its delivery settings are the
// proxy's defaults.
func operationalWebhook(cfg *config.Config) *delivery.Subscription {
	w := cfg.Admin.OperationalWebhook
	if w.URL == "" {
		return nil
	}
	return &delivery.Subscription{ID: delivery.OperationalID, URL: w.URL, Secrets: w.Resolved, Types: []string{"*"}, ManagedBy: api.ManagedByFile}
}
