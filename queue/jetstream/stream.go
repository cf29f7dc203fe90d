package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes the log side tells apart (nats-server
// v2.15 server/errors.json).
const (
	errCodeNoPeers         = 10005 // no suitable peers for placement
	errCodeUnavailable     = 10008 // JetStream system temporarily unavailable
	errCodeNoMessage       = 10037 // no message found
	errCodeSeqNotFound     = 10043 // sequence not found (a delete of one already gone)
	errCodeDeleteFailed    = 10057 // message delete failed ("no message found" among them)
	errCodeReplicasNotSupp = 10074 // replicas > 1 not supported in non-clustered mode
	errCodeStoreFailed     = 10077 // store failed: max bytes/msgs (discard new), message too large
	errCodeDupInProcess    = 10158 // duplicate message id is in process
	errCodeNotEnabled      = 10076 // JetStream not enabled
	errCodeNotEnabledAcct  = 10039 // JetStream not enabled for account
)

// streamConfig is the event stream as sluice makes it: file storage, the
// dedup window as the duplicate window, limits retention and discard new,
// so that a full stream refuses new events (queue.ErrDiskFull) instead of
// dropping undelivered ones, and direct gets so reads are answered by the
// nearest replica.
func (s *Store) streamConfig() jetstream.StreamConfig {
	maxBytes := s.opts.MaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:              s.opts.Stream,
		Description:       "sluice events (fleet mode)",
		Subjects:          []string{s.evSubj + ">"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          s.opts.Replicas,
		Duplicates:        s.opts.DedupWindow,
		MaxBytes:          maxBytes,
		MaxMsgs:           -1,
		MaxMsgsPerSubject: -1,
		MaxAge:            0,
		Discard:           jetstream.DiscardNew,
		AllowDirect:       true,
	}
}

// permanentErr marks a set-up error that retrying cannot cure.
type permanentErr struct{ err error }

func (p *permanentErr) Error() string { return p.err.Error() }
func (p *permanentErr) Unwrap() error { return p.err }

// setUpStream creates the event stream, or checks an existing one and
// refuses it, naming the setting, when sluice cannot work with it; only
// max_bytes is brought to the configured value. Errors that pass (no meta
// leader yet, no responders right after the servers start, the servers
// away) are retried with backoff (Store.retry).
func (s *Store) setUpStream() error {
	return s.retrySetUp("jetstream.stream "+s.opts.Stream, s.ensureStream)
}

// retrySetUp calls f until it succeeds or fails permanently (permanentErr).
func (s *Store) retrySetUp(what string, f func() error) error {
	var p *permanentErr
	err := s.retry(what, f, func(err error) bool { return !errors.As(err, &p) })
	if p != nil {
		return p.err
	}
	return err
}

// ensureStream is one attempt of setUpStream.
func (s *Store) ensureStream() error {
	want := s.streamConfig()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RequestTimeout)
	defer cancel()
	st, err := s.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = s.js.CreateStream(ctx, want)
		if err != nil {
			return s.createError(err)
		}
		s.log.Info("created the event stream", "stream", want.Name, "replicas", want.Replicas, "max_bytes", want.MaxBytes)
		s.stream = st
		return nil
	}
	if err != nil {
		return setUpError(err)
	}
	have := st.CachedInfo().Config
	if err := s.streamCompatible(have, want); err != nil {
		return &permanentErr{err}
	}
	if have.MaxBytes != want.MaxBytes {
		upd := have
		upd.MaxBytes = want.MaxBytes
		if st, err = s.js.UpdateStream(ctx, upd); err != nil {
			return setUpError(fmt.Errorf("update max_bytes of stream %s to %d: %w", want.Name, want.MaxBytes, err))
		}
		s.log.Info("updated the event stream's max_bytes", "stream", want.Name, "from", have.MaxBytes, "to", want.MaxBytes)
	}
	s.stream = st
	return nil
}

// createError classifies a failed stream create.
func (s *Store) createError(err error) error {
	ae := apiError(err)
	switch {
	case ae == nil:
		return setUpError(err)
	case ae.ErrorCode == jetstream.JSErrCodeStreamNameInUse:
		// Another node created it at the same moment: check that one.
		return err
	case ae.ErrorCode == errCodeReplicasNotSupp:
		return &permanentErr{fmt.Errorf("jetstream.replicas %d: the NATS server at %s is not clustered (%s); use jetstream.replicas: 1 with a single server",
			s.opts.Replicas, s.nc.ConnectedUrlRedacted(), ae.Description)}
	case ae.ErrorCode == errCodeNoPeers:
		if n := len(s.nc.Servers()); s.opts.Replicas > n {
			return &permanentErr{fmt.Errorf("jetstream.replicas %d: the cluster has %d servers (%s), too few for %d replicas (%s)",
				s.opts.Replicas, n, strings.Join(s.nc.Servers(), ", "), s.opts.Replicas, ae.Description)}
		}
		// Right after the servers start the meta leader may not know
		// every peer yet ("peer offline"): that passes.
		return fmt.Errorf("jetstream.replicas %d: %w", s.opts.Replicas, err)
	}
	return setUpError(err)
}

// setUpError marks err permanentErr unless it is one that passes.
func setUpError(err error) error {
	if transientErr(err) || notYetKnown(err) {
		return err
	}
	if ae := apiError(err); ae != nil && (ae.ErrorCode == errCodeNotEnabled || ae.ErrorCode == errCodeNotEnabledAcct) {
		// Right after start a server may answer before its JetStream is
		// up; after ConnectTimeout the error says what it was (retry).
		return fmt.Errorf("JetStream is not enabled on the NATS servers (jetstream.urls): %w", err)
	}
	return &permanentErr{err}
}

// transient reports whether err is one that a retry may cure: no
// responders, timeouts, a cluster still electing its leaders.
func transientErr(err error) bool {
	if brokerAway(err) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		return true
	}
	if ae := apiError(err); ae != nil {
		return ae.Code >= 500 && ae.ErrorCode != errCodeReplicasNotSupp
	}
	return false
}

// apiError returns the JetStream API error inside err, or nil.
func apiError(err error) *jetstream.APIError {
	var je jetstream.JetStreamError
	if errors.As(err, &je) {
		return je.APIError()
	}
	return nil
}

// streamCompatible names the first setting of an existing stream that sluice
// cannot work with, and the config key that would fix it where there is
// one. Nothing is changed: the stream may hold another deployment's events.
func (s *Store) streamCompatible(have, want jetstream.StreamConfig) error {
	name := "jetstream.stream " + want.Name
	switch {
	case !slices.Equal(have.Subjects, want.Subjects):
		return fmt.Errorf("%s exists with subjects %v; sluice needs %v (choose another jetstream.stream, or delete this one)", name, have.Subjects, want.Subjects)
	case have.Retention != jetstream.LimitsPolicy:
		return fmt.Errorf("%s exists with retention %s; sluice needs limits (it removes events itself, by compaction)", name, strings.ToLower(have.Retention.String()))
	case have.Storage != jetstream.FileStorage:
		return fmt.Errorf("%s exists with %s storage; sluice needs file storage (an accepted event must survive a restart)", name, strings.ToLower(have.Storage.String()))
	case have.Replicas != want.Replicas:
		return fmt.Errorf("%s exists with %d replicas; jetstream.replicas is %d (set jetstream.replicas to %d, or change the stream's replicas with the nats CLI)", name, have.Replicas, want.Replicas, have.Replicas)
	case have.Duplicates != want.Duplicates:
		return fmt.Errorf("%s exists with a duplicate window of %s; dedup_window is %s (set dedup_window to %s, or change the stream's duplicate window with the nats CLI)", name, have.Duplicates, want.Duplicates, have.Duplicates)
	case have.Discard != jetstream.DiscardNew:
		return fmt.Errorf("%s exists with discard old; sluice needs discard new (a full stream must refuse new events, not drop undelivered ones)", name)
	case have.MaxAge != 0:
		return fmt.Errorf("%s exists with max_age %s; sluice needs none (undelivered events must not expire)", name, have.MaxAge)
	case have.MaxMsgs > 0:
		return fmt.Errorf("%s exists with max_msgs %d; sluice needs none (limit the stream's size with max_disk_bytes)", name, have.MaxMsgs)
	case have.MaxMsgsPerSubject > 0:
		return fmt.Errorf("%s exists with max_msgs_per_subject %d; sluice needs none (an id may be accepted again once the dedup window has passed)", name, have.MaxMsgsPerSubject)
	case have.Mirror != nil || len(have.Sources) > 0:
		return fmt.Errorf("%s exists as a mirror or with sources; sluice needs a stream it alone writes", name)
	case have.SubjectTransform != nil:
		return fmt.Errorf("%s exists with a subject transform; sluice needs its subjects unchanged", name)
	case have.Sealed || have.DenyDelete || have.DenyPurge:
		return fmt.Errorf("%s exists sealed or with deny_delete/deny_purge; sluice compacts it by purging and deleting", name)
	case !have.AllowDirect:
		return fmt.Errorf("%s exists with allow_direct false; sluice reads events with direct gets", name)
	}
	return nil
}

// streamState is what the log knows of the stream from its last info.
type streamState struct {
	bytes    uint64
	firstSeq uint64
	lastSeq  uint64
	maxBytes int64
	at       time.Time
}

// fetchState asks the stream leader for the stream's state.
func (s *Store) fetchState() (streamState, error) {
	var resp struct {
		Error  *jetstream.APIError `json:"error"`
		Config struct {
			MaxBytes int64 `json:"max_bytes"`
		} `json:"config"`
		State struct {
			Bytes    uint64 `json:"bytes"`
			FirstSeq uint64 `json:"first_seq"`
			LastSeq  uint64 `json:"last_seq"`
		} `json:"state"`
	}
	if err := s.apiJSON(s.lg.api+"STREAM.INFO."+s.opts.Stream, nil, &resp); err != nil {
		return streamState{}, err
	}
	if resp.Error != nil {
		return streamState{}, resp.Error
	}
	return streamState{bytes: resp.State.Bytes, firstSeq: resp.State.FirstSeq, lastSeq: resp.State.LastSeq,
		maxBytes: resp.Config.MaxBytes, at: time.Now()}, nil
}

// apiJSON sends one JetStream API request and decodes its JSON answer.
func (s *Store) apiJSON(subj string, req []byte, resp any) error {
	m, err := s.nc.Request(subj, req, s.opts.RequestTimeout)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(m.Data, resp); err != nil {
		return fmt.Errorf("%s: decode answer: %w", subj, err)
	}
	return nil
}
