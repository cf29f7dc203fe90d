package admin

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/api"
	"github.com/sluicehq/sluice/proxy/delivery"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/signing"
)

// The registry: subscriptions created, changed and deleted through the
// admin API while the sidecar runs. An API subscription is
// persisted as its membership's snapshot (queue.Membership.Snapshot), the
// record that already keeps a removed subscription draining: the snapshot
// carries the document it was made from, so it survives a restart and a
// SIGKILL with nothing else to write, and in fleet mode the membership is
// in the shared KV, so every node serves it. The membership is written
// (create-only, with its cut-off) before the API answers: an
// event accepted after the 201 is owed to the subscription.

// Errors of the registry; the admin API maps each to a status.
var (
	// ErrInvalid: the request is malformed or a setting is invalid (400).
	ErrInvalid = errors.New("invalid")
	// ErrExists: a subscription with the id exists (409).
	ErrExists = errors.New("already exists")
	// ErrManagedByFile: the config file owns the subscription; the API may
	// not change it (409).
	ErrManagedByFile = errors.New("managed by the config file")
	// ErrLimit: a tenant's limit refuses the request (409).
	ErrLimit = errors.New("over a tenant's limit")
	// ErrVariantLimit: the subscription would add a distinct body
	// variant past policy.MaxTenantVariants or policy.MaxVariants (409).
	ErrVariantLimit = errors.New("too many distinct body variants")
	// ErrNoSpecs: the server was built without a SpecParser (501).
	ErrNoSpecs = errors.New("subscription API not configured")
)

// DefaultRotationGrace is how long rotate-secret keeps the old secrets
// signing beside the new one, when the request does not say: a day lets
// every receiver pick up the new secret in its own deploy cycle.
const DefaultRotationGrace = 24 * time.Hour

// maxRotationGrace bounds the grace: a secret meant to be retired should
// not sign for months by a typo.
const maxRotationGrace = 90 * 24 * time.Hour

// maxSpecBytes bounds a subscription document.
const maxSpecBytes = 64 << 10

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// document decodes a JSON object, keeping numbers as written.
func document(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, invalidf("body: not a JSON object: %v", err)
	}
	if doc == nil {
		return nil, invalidf("body: not a JSON object")
	}
	if dec.More() {
		return nil, invalidf("body: more than one JSON value")
	}
	return doc, nil
}

func encodeDocument(doc map[string]any) []byte {
	b, _ := json.Marshal(doc) // decoded from JSON: cannot fail
	return b
}

// checkBody refuses a request body the config file's JSON reader refuses
// (SpecParser.Check).
func (s *API) checkBody(body []byte) error {
	if s.opts.Specs == nil {
		return ErrNoSpecs
	}
	if err := s.opts.Specs.Check(body); err != nil {
		return invalidf("body: %v", err)
	}
	return nil
}

// parseSpec validates doc through the SpecParser, names the key in its
// error, and marks the result as the API's.
func (s *API) parseSpec(doc []byte) (*delivery.Subscription, error) {
	if s.opts.Specs == nil {
		return nil, ErrNoSpecs
	}
	sub, err := s.opts.Specs.Parse(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if sub.ID == delivery.OperationalID {
		return nil, invalidf("id: %q is the operational webhook's", delivery.OperationalID)
	}
	sub.ManagedBy, sub.Spec = api.ManagedByAPI, doc
	return sub.WithDefaults(), nil
}

// CreateSubscription makes an API subscription from doc (JSON in the
// config file's keys) for p. Without a secret one is generated and
// returned in the answer, once. A tenant's token makes subscriptions of
// its own tenant only.
func (s *API) CreateSubscription(p principal, body []byte) (api.SubscriptionInfo, error) {
	doc, err := document(body)
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := s.checkBody(body); err != nil {
		return api.SubscriptionInfo{}, err
	}
	if !p.operator() {
		if t, ok := doc["tenant"]; ok && t != p.tenant {
			return api.SubscriptionInfo{}, invalidf("tenant: a tenant's token creates subscriptions of its own tenant (%s) only", p.tenant)
		}
		doc["tenant"] = p.tenant
		s.boundConcurrency(p, doc)
	}
	var generated string
	_, hasSecret := doc["secret"]
	_, hasSecrets := doc["secrets"]
	_, hasFile := doc["secret_file"]
	_, hasEnv := doc["secret_env"]
	if !hasSecret && !hasSecrets && !hasFile && !hasEnv {
		k, err := signing.GenerateSecret()
		if err != nil {
			return api.SubscriptionInfo{}, fmt.Errorf("generate a secret: %w", err)
		}
		generated = k.Encode()
		doc["secret"] = generated
	}
	sub, err := s.parseSpec(encodeDocument(doc))
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := s.checkConcurrency(p, sub); err != nil {
		return api.SubscriptionInfo{}, err
	}
	d := s.d
	d.LockSet()
	defer d.UnlockSet()
	// The tenant's room first: at its limit a tenant hears "over the
	// limit" whether or not the id is taken, or the two answers would tell
	// it which of another tenant's ids exist.
	if err := s.checkTenantRoom(sub.Tenant, ""); err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := s.checkVariantRoom(sub, nil); err != nil {
		return api.SubscriptionInfo{}, err
	}
	err = s.checkFree(sub.ID)
	if err == nil {
		err = s.checkReserved(sub.ID, sub.Tenant)
	}
	if err != nil {
		if !p.operator() && errors.Is(err, ErrExists) && !s.canSee(p, sub.ID) {
			// Ids are one namespace (they are metric labels), so another
			// tenant's id is taken; say no more than that, in the words
			// of a duplicate of the tenant's own: not that the file
			// manages it, that it drains, or that another node made it.
			err = fmt.Errorf("subscription %s: %w", sub.ID, ErrExists)
		}
		return api.SubscriptionInfo{}, err
	}
	if err := s.reserve(sub.ID, sub.Tenant); err != nil {
		return api.SubscriptionInfo{}, err
	}
	// Create-only: checkFree saw no membership, but in fleet mode another
	// node's create of the id may land between that read and this write
	// (the set's lock serialises this node's creates only).
	if err := d.Join(sub, true); errors.Is(err, queue.ErrExists) {
		return api.SubscriptionInfo{}, fmt.Errorf("subscription %s: %w (made through another node at the same time)", sub.ID, ErrExists)
	} else if err != nil {
		return api.SubscriptionInfo{}, err
	}
	s.log.Info("subscription created through the API", "subscription", sub.ID, "tenant", sub.Tenant)
	info, err := s.subscriptionInfo(sub.ID)
	info.Secret = generated
	return info, err
}

// checkFree refuses an id that is taken: by a lane here (even one still
// draining after a delete), or in fleet mode by a membership another
// node wrote that this one has not heard of yet. the set is locked (LockSet).
func (s *API) checkFree(id string) error {
	if v, ok := s.d.View(id); ok {
		switch {
		case v.Left:
			return fmt.Errorf("subscription %s: %w: it was deleted and still drains what it was owed; use another id, or wait until it retires", id, ErrExists)
		case !v.Sub.ManagedByAPI():
			return fmt.Errorf("subscription %s: %w in the config file", id, ErrExists)
		default:
			return fmt.Errorf("subscription %s: %w", id, ErrExists)
		}
	}
	if f := s.d.Fleet(); f != nil {
		if _, err := f.Member(id); err == nil {
			return fmt.Errorf("subscription %s: %w (made through another node)", id, ErrExists)
		} else if !errors.Is(err, queue.ErrNotFound) {
			return err
		}
	}
	return nil
}

// An id, once a subscription of the API has used it, stays its tenant's
// for good: a record "owner.<id>" names the tenant ("" for the operator),
// written before the subscription is made and never deleted. Dead letters
// outlive their subscription, and whoever took a retired id would
// otherwise read and replay another tenant's events. Ids used before the
// record existed are guarded by their dead letters (checkReserved).
// The id is hex-encoded: a record key's segments may not hold the dots an
// id may ("a..b").
func ownerKey(id string) string { return "owner." + hex.EncodeToString([]byte(id)) }

type ownerRecord struct {
	Tenant string `json:"tenant"`
}

// checkReserved refuses id to tenant when another tenant (or the
// operator) used it: by its owner record, or, for an id used before owner
// records existed, by dead letters under it owned by someone else. The
// set is locked (LockSet).
func (s *API) checkReserved(id, tenant string) error {
	taken := fmt.Errorf("subscription %s: %w: the id was used before, by another owner, and stays reserved to it", id, ErrExists)
	if recs, ok := s.q.(queue.Records); ok {
		v, err := recs.GetRecord(ownerKey(id))
		switch {
		case err == nil:
			var rec ownerRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("owner record of %s: %v", id, err)
			}
			if rec.Tenant != tenant {
				return taken
			}
			return nil
		case !errors.Is(err, queue.ErrNotFound):
			return err
		}
	}
	letters, err := s.q.DeadLetters(id, "", 0, 1)
	if err != nil {
		return err
	}
	for _, d := range letters {
		if d.Subscription == id && (d.Owner != tenant || !d.Scoped && tenant != "") {
			return taken
		}
	}
	return nil
}

// reserve writes id's owner record (see ownerKey). the set is locked (LockSet).
func (s *API) reserve(id, tenant string) error {
	recs, ok := s.q.(queue.Records)
	if !ok {
		return nil
	}
	v, _ := json.Marshal(ownerRecord{Tenant: tenant})
	if err := recs.PutRecord(ownerKey(id), v); err != nil {
		return fmt.Errorf("reserve the id %s: %w", id, err)
	}
	return nil
}

// checkTenantRoom refuses a subscription of tenant past the tenant's
// max_subscriptions; except is a subscription that moves within the
// tenant (an update), not counted twice. the set is locked (LockSet).
func (s *API) checkTenantRoom(tenant, except string) error {
	t := s.tenantLimits(tenant)
	if t == nil || t.MaxSubscriptions <= 0 {
		return nil
	}
	n := 0
	for v := range s.d.Views() {
		if id := v.Sub.ID; !v.Left && v.Sub.Tenant == tenant && id != except && id != delivery.OperationalID {
			n++
		}
	}
	if n >= t.MaxSubscriptions {
		return fmt.Errorf("tenant %s has %d subscriptions, its max_subscriptions: %w", tenant, n, ErrLimit)
	}
	return nil
}

// checkVariantRoom refuses sub when its body variant would add one more
// distinct variant past policy.MaxTenantVariants among its tenant's
// subscriptions (the operator's, tenant "", have no such bound) or past
// policy.MaxVariants among all. cur is the subscription sub replaces (an
// update), nil for a create. Only growth is refused, counted as what the
// subscriptions ask for before and after the request: a variant equal to
// one in use (by Key: the same renderings) adds nothing, nor does an
// update that keeps its variant or swaps one only it had for a new one,
// so a tenant at its bound can still change a variant, and the file's
// subscriptions putting a count over a bound stall no update. Deleted
// subscriptions still draining do not count: they take no new events.
// the set is locked (LockSet).
//
// Equal variants count once in all, whoever uses them, since an event
// shared with several tenants carries one rendering of each. So a tenant
// refused by the bound in all can learn that a variant it tries is
// another's; that tells it a field list, never an event.
func (s *API) checkVariantRoom(sub, cur *delivery.Subscription) error {
	key := sub.Variant.Key()
	if key == "" {
		return nil
	}
	tenant := sub.Tenant
	// The lane of sub, on an update, still holds cur: left out here,
	// and counted as the state before the request below.
	mine, all := map[string]struct{}{}, map[string]struct{}{}
	for v := range s.d.Views() {
		k, t, skip := v.Sub.Variant.Key(), v.Sub.Tenant, v.Left || (cur != nil && v.Sub.ID == cur.ID)
		if skip || k == "" {
			continue
		}
		all[k] = struct{}{}
		if t == tenant {
			mine[k] = struct{}{}
		}
	}
	curKey := ""
	if cur != nil {
		curKey = cur.Variant.Key()
	}
	// after reports how many distinct variants set holds with sub, and
	// whether that is more than before, with cur (when it counts in set).
	after := func(set map[string]struct{}, curCounts bool) (int, bool) {
		if _, ok := set[key]; ok {
			return len(set), false
		}
		before := len(set)
		if _, ok := set[curKey]; curCounts && curKey != "" && !ok {
			before++
		}
		return len(set) + 1, len(set)+1 > before
	}
	if n, grows := after(mine, cur != nil && cur.Tenant == tenant); tenant != "" && grows && n > policy.MaxTenantVariants {
		return fmt.Errorf("body: %w: tenant %s has %d, at most %d per tenant; use one of them (equal variants count once) or leave body out",
			ErrVariantLimit, tenant, n-1, policy.MaxTenantVariants)
	}
	if n, grows := after(all, cur != nil); grows && n > policy.MaxVariants {
		return fmt.Errorf("body: %w: %d in use, at most %d in all; use one in use (equal variants count once) or leave body out",
			ErrVariantLimit, n-1, policy.MaxVariants)
	}
	return nil
}

// apiSubscription returns subscription id if p may see it and the API
// manages it.
func (s *API) apiSubscription(p principal, id string) (*delivery.Subscription, error) {
	v, ok := s.d.View(id)
	if !ok || !s.canSee(p, id) {
		return nil, fmt.Errorf("subscription %q: %w", id, ErrNotFound)
	}
	switch {
	case !v.Sub.ManagedByAPI():
		return nil, fmt.Errorf("subscription %s: %w: change it in the file and reload (SIGHUP, or save the file)", id, ErrManagedByFile)
	case v.Left:
		return nil, fmt.Errorf("subscription %s: %w: it was deleted and drains what it was owed", id, ErrNotFound)
	}
	return v.Sub, nil
}

// UpdateSubscription applies a JSON merge patch (RFC 7386) to an API
// subscription's document. The new settings apply from the next dispatch;
// the lane keeps its place, so nothing owed is lost.
func (s *API) UpdateSubscription(p principal, id string, patch []byte) (api.SubscriptionInfo, error) {
	pd, err := document(patch)
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := s.checkBody(patch); err != nil {
		return api.SubscriptionInfo{}, err
	}
	d := s.d
	d.LockSet()
	defer d.UnlockSet()
	cur, err := s.apiSubscription(p, id)
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	merged, err := jsonpatch.MergePatch(cur.Spec, patch)
	if err != nil {
		return api.SubscriptionInfo{}, invalidf("body: not a merge patch: %v", err)
	}
	doc, err := document(merged)
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	if doc["id"] != id {
		return api.SubscriptionInfo{}, invalidf("id: cannot be changed (create a subscription with the new id, then delete this one)")
	}
	if !p.operator() {
		if doc["tenant"] != p.tenant {
			return api.SubscriptionInfo{}, invalidf("tenant: a tenant's token cannot move a subscription to another tenant")
		}
		s.boundConcurrency(p, doc)
		merged = encodeDocument(doc)
	}
	// secret and secrets are one setting written two ways: a patch that
	// sets one replaces the other, or a subscription made with a
	// generated secret could never be given a list (docs/ingest-and-delivery.md, "Moving a
	// subscription from HMAC to Ed25519"). A patch naming both is judged
	// as written.
	if other, ok := replacedSecretKey(pd); ok {
		if _, present := doc[other]; present {
			delete(doc, other)
			merged = encodeDocument(doc)
		}
	}
	sub, err := s.parseSpec(merged)
	if err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := s.checkConcurrency(p, sub); err != nil {
		return api.SubscriptionInfo{}, err
	}
	_, touchesSecret := pd["secret"]
	_, touchesSecrets := pd["secrets"]
	if !touchesSecret && !touchesSecrets {
		// The same secrets, so the same rotation deadlines.
		sub.SecretExpiry = cur.SecretExpiry
	}
	if sub.Tenant != cur.Tenant {
		if err := s.checkTenantRoom(sub.Tenant, id); err != nil {
			return api.SubscriptionInfo{}, err
		}
	}
	if err := s.checkVariantRoom(sub, cur); err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := d.Join(sub, false); err != nil {
		return api.SubscriptionInfo{}, err
	}
	s.log.Info("subscription updated through the API", "subscription", id)
	return s.subscriptionInfo(id)
}

// replacedSecretKey is the secret key a merge patch replaces: "secret"
// when it sets "secrets" alone, "secrets" when it sets "secret" alone.
func replacedSecretKey(patch map[string]any) (string, bool) {
	secret, secrets := patch["secret"], patch["secrets"]
	switch {
	case secrets != nil && secret == nil:
		return "secret", true
	case secret != nil && secrets == nil:
		return "secrets", true
	}
	return "", false
}

// DeleteSubscription ends an API subscription's entitlement at the head:
// it takes no new events, drains what it is owed (what was accepted
// while it was a member), then
// retires.
func (s *API) DeleteSubscription(p principal, id string) (api.SubscriptionInfo, error) {
	d := s.d
	d.LockSet()
	defer d.UnlockSet()
	if _, err := s.apiSubscription(p, id); err != nil {
		return api.SubscriptionInfo{}, err
	}
	if err := d.Leave(id); err != nil {
		return api.SubscriptionInfo{}, err
	}
	return s.subscriptionInfo(id)
}

// RotateSecret gives an API subscription a new secret. The old ones keep
// signing beside it until grace ends, so a receiver verifies either while
// it moves to the new one; then only the new one signs.
func (s *API) RotateSecret(p principal, id string, grace time.Duration) (api.RotateAnswer, error) {
	if grace < 0 || grace > maxRotationGrace {
		return api.RotateAnswer{}, invalidf("grace: want 0s to %s, got %s", maxRotationGrace, grace)
	}
	d := s.d
	d.LockSet()
	defer d.UnlockSet()
	cur, err := s.apiSubscription(p, id)
	if err != nil {
		return api.RotateAnswer{}, err
	}
	// The new secret keeps the scheme of the newest one: a receiver that
	// holds only whpk_ keys must not be moved to HMAC by a rotation.
	generate := signing.GenerateSecret
	if len(cur.Secrets) > 0 {
		if _, ed := cur.Secrets[0].PublicKey(); ed {
			generate = signing.GenerateEd25519Secret
		}
	}
	k, err := generate()
	if err != nil {
		return api.RotateAnswer{}, fmt.Errorf("generate a secret: %w", err)
	}
	now := s.opts.Now()
	until := now.Add(grace)
	secrets := []signing.Secret{k}
	expiry := []time.Time{{}}
	if grace > 0 {
		for i, old := range cur.LiveSecrets(now) {
			exp := until
			if cur.SecretExpiry != nil && !cur.SecretExpiry[i].IsZero() && cur.SecretExpiry[i].Before(until) {
				exp = cur.SecretExpiry[i] // an earlier rotation's deadline stands
			}
			secrets = append(secrets, old)
			expiry = append(expiry, exp)
		}
	}
	sortExpiring(secrets, expiry)
	sub, err := s.withSecrets(cur, secrets, expiry)
	if err != nil {
		return api.RotateAnswer{}, err
	}
	if err := d.Join(sub, false); err != nil {
		return api.RotateAnswer{}, err
	}
	s.log.Info("subscription secret rotated", "subscription", id, "old_secrets_until", until)
	ans := api.RotateAnswer{Subscription: id, Secret: k.Encode()}
	if pk, ok := k.PublicKey(); ok {
		ans.PublicKey = pk.Encode()
	}
	if len(secrets) > 1 {
		ans.OldUntil = until
	}
	return ans, nil
}

// withSecrets is cur with these secrets (in Subscription.SecretExpiry's
// order) and their deadlines: its document lists them under "secrets".
func (s *API) withSecrets(cur *delivery.Subscription, secrets []signing.Secret, expiry []time.Time) (*delivery.Subscription, error) {
	doc, err := document(cur.Spec)
	if err != nil {
		return nil, err
	}
	delete(doc, "secret")
	enc := make([]any, len(secrets))
	for i, k := range secrets {
		enc[i] = k.Encode()
	}
	doc["secrets"] = enc
	sub, err := s.parseSpec(encodeDocument(doc))
	if err != nil {
		return nil, err
	}
	if len(secrets) > 1 {
		sub.SecretExpiry = expiry
	}
	return sub, nil
}

// sortExpiring orders secrets as Subscription.SecretExpiry requires: the
// ones that never expire first, then latest expiry first.
func sortExpiring(secrets []signing.Secret, expiry []time.Time) {
	idx := make([]int, len(secrets))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		ea, eb := expiry[a], expiry[b]
		switch {
		case ea.IsZero() && eb.IsZero():
			return 0
		case ea.IsZero():
			return -1
		case eb.IsZero():
			return 1
		}
		return eb.Compare(ea)
	})
	ks, es := slices.Clone(secrets), slices.Clone(expiry)
	for i, j := range idx {
		secrets[i], expiry[i] = ks[j], es[j]
	}
}

// RetireExpiredSecrets rewrites the API subscriptions whose rotation
// grace ended without the old secrets (they stopped signing already:
// liveSecrets); only the lane's owner does it, once.
func (s *API) RetireExpiredSecrets(now time.Time) {
	if !s.d.TakeRotating() {
		return
	}
	pending := false
	for v := range s.d.Views() {
		sub := v.Sub
		if sub.SecretExpiry == nil {
			continue
		}
		if v.Foreign || v.Left || !sub.ManagedByAPI() {
			pending = true // its owner retires them; it may be this node later
			continue
		}
		if live := sub.LiveSecrets(now); len(live) < len(sub.Secrets) {
			s.dropSecrets(sub.ID, now)
		}
		pending = pending || len(sub.LiveSecrets(now)) > 1
	}
	if pending {
		s.d.MarkRotating()
	}
}

func (s *API) dropSecrets(id string, now time.Time) {
	d := s.d
	d.LockSet()
	defer d.UnlockSet()
	v, ok := d.View(id)
	if !ok {
		return
	}
	cur := v.Sub
	live := cur.LiveSecrets(now)
	sub, err := s.withSecrets(cur, live, cur.SecretExpiry[:len(live)])
	if err != nil {
		s.log.Error("retire expired secrets", "subscription", id, "err", err)
		return
	}
	if err := d.Join(sub, false); err != nil {
		s.log.Error("retire expired secrets", "subscription", id, "err", err)
		return
	}
	s.log.Info("rotation grace over: the old secrets no longer sign", "subscription", id)
}

// Recover replays every dead letter of sub whose event was accepted in
// [since, until), each once (a letter already replayed is skipped).
func (s *API) Recover(p principal, sub string, since, until time.Time) (api.RecoverAnswer, error) {
	ans := api.RecoverAnswer{Subscription: sub}
	if _, ok := s.d.View(sub); !ok || !s.canSee(p, sub) {
		return ans, fmt.Errorf("subscription %q: %w", sub, ErrNotFound)
	}
	if until.IsZero() {
		until = s.opts.Now()
	}
	if !since.Before(until) {
		return ans, invalidf("since: must be before until (%s), got %s", until.Format(time.RFC3339), since.Format(time.RFC3339))
	}
	var after uint64
	for {
		page, err := s.q.DeadLetters(sub, sub, after, 500)
		if err != nil {
			return ans, err
		}
		for _, dl := range page {
			after = dl.Seq
			if dl.AcceptedAt.Before(since) || !dl.AcceptedAt.Before(until) {
				continue
			}
			if !dl.DeliveredAt.IsZero() {
				ans.Delivered++
				continue
			}
			ans.Matched++
			res, err := s.d.Replay(sub, dl.Seq, false)
			if err == nil && res.Replayed {
				ans.Replayed++
			} else {
				ans.Skipped++
			}
		}
		if len(page) < 500 {
			return ans, nil
		}
	}
}

// Undelivered lists the events owed to sub that are not acknowledged:
// those with a retry scheduled, in seq order, then its dead letters not
// delivered by a replay, in seq order; accepted at or after since. cursor
// is the Next of the previous page.
func (s *API) Undelivered(p principal, sub string, since time.Time, limit int, cursor string) (api.UndeliveredPage, error) {
	page := api.UndeliveredPage{Subscription: sub, Events: []api.UndeliveredEvent{}}
	if _, ok := s.d.View(sub); !ok || !s.canSee(p, sub) {
		return page, fmt.Errorf("subscription %q: %w", sub, ErrNotFound)
	}
	phase, after, err := parseUndeliveredCursor(cursor)
	if err != nil {
		return page, err
	}
	if phase == "retry" {
		// The schedule is kept by due time; the page is in seq order, so
		// read it whole (bounded: it is what the retry budget let
		// through) and sort.
		rs, err := s.q.Retries(sub, maxUndeliveredRetries)
		if err != nil {
			return page, err
		}
		slices.SortFunc(rs, func(a, b queue.Retry) int { return cmp.Compare(a.Seq, b.Seq) })
		for _, r := range rs {
			if r.Seq <= after {
				continue
			}
			u := api.UndeliveredEvent{Seq: r.Seq, State: "retrying", Attempts: r.Attempt, LastStatus: r.LastStatus, LastError: r.LastError, Due: r.Due}
			if ev, err := s.d.LoggedEvent(r.Seq); err == nil {
				u.EventID, u.Type, u.AcceptedAt = ev.ID, ev.Type, ev.AcceptedAt
			}
			if !since.IsZero() && u.AcceptedAt.Before(since) {
				continue
			}
			page.Events = append(page.Events, u)
			if len(page.Events) == limit {
				page.Next = "retry/" + fmt.Sprint(r.Seq)
				return page, nil
			}
		}
		phase, after = "dead", 0
	}
	for {
		dls, err := s.q.DeadLetters(sub, sub, after, 500)
		if err != nil {
			return page, err
		}
		for _, dl := range dls {
			after = dl.Seq
			if !dl.DeliveredAt.IsZero() || (!since.IsZero() && dl.AcceptedAt.Before(since)) {
				continue
			}
			page.Events = append(page.Events, api.UndeliveredEvent{
				Seq: dl.Seq, EventID: dl.EventID, Type: dl.Type, AcceptedAt: dl.AcceptedAt, State: "dead_lettered",
				Attempts: dl.Attempts, LastStatus: dl.LastStatus, LastError: dl.LastError, Reason: dl.Reason,
			})
			if len(page.Events) == limit {
				page.Next = "dead/" + fmt.Sprint(dl.Seq)
				return page, nil
			}
		}
		if len(dls) < 500 {
			return page, nil
		}
	}
}

// maxUndeliveredRetries bounds the retries Undelivered reads at once.
const maxUndeliveredRetries = 100_000

func parseUndeliveredCursor(c string) (phase string, after uint64, err error) {
	if c == "" {
		return "retry", 0, nil
	}
	phase, n, ok := strings.Cut(c, "/")
	if ok && (phase == "retry" || phase == "dead") {
		if _, err := fmt.Sscan(n, &after); err == nil {
			return phase, after, nil
		}
	}
	return "", 0, invalidf("cursor: want the next of a previous page (retry/SEQ or dead/SEQ), got %q", c)
}

// subscriptionInfo is subscription id as GET /v1/subscriptions/{id} shows
// it.
func (s *API) subscriptionInfo(id string) (api.SubscriptionInfo, error) {
	v, ok := s.d.View(id)
	if !ok {
		return api.SubscriptionInfo{}, ErrNotFound
	}
	var info api.SubscriptionInfo
	info.LaneStatus, _ = s.d.Status(id)
	sub := v.Sub
	if len(sub.Spec) > 0 {
		if s.opts.Specs != nil {
			info.Config = s.opts.Specs.Redact(sub.Spec)
		} else if sub.ManagedByAPI() {
			info.Config = map[string]any{"secrets_count": len(sub.Secrets)} // never the secrets themselves
		} else {
			json.Unmarshal(sub.Spec, &info.Config) // already redacted
		}
	}
	if sub.SecretExpiry != nil && info.Config != nil {
		info.Config["secrets_expire"] = sub.SecretExpiry
	}
	for _, k := range sub.LiveSecrets(s.opts.Now()) {
		if pk, ok := k.PublicKey(); ok {
			info.PublicKeys = append(info.PublicKeys, pk.Encode())
		}
	}
	return info, nil
}
