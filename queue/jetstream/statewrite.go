package jetstream

// Writes of <S>_STATE: one message or one atomic batch (commit), a lane's
// fenced write (writeLane) and pipelined writes (pipe). Why a delete is a
// purge marker that expires is in state.go's file comment.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// Writes.

// newPut is a message writing value under key.
func (s *Store) newPut(key string, value []byte) *nats.Msg {
	return &nats.Msg{Subject: s.statePfx + key, Header: nats.Header{}, Data: value}
}

// newPurge is a message deleting key: a purge marker that expires (see
// the file comment).
func (s *Store) newPurge(key string) *nats.Msg {
	m := &nats.Msg{Subject: s.statePfx + key, Header: nats.Header{}}
	m.Header.Set("KV-Operation", "PURGE")
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	m.Header.Set(jetstream.MsgTTLHeader, markerTTL.String())
	return m
}

// expectRev makes m a compare-and-set: stored only if its key's last
// message is rev (0: the subject holds nothing).
func expectRev(m *nats.Msg, rev uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
}

// setFence makes m stored only while the lease subject is at rev.
func setFence(m *nats.Msg, subj string, rev uint64) {
	m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, subj)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(rev, 10))
}

// write is one message of a state write; cas when it expects its own
// key's revision (it cannot carry the fence too: a message has one
// expectation).
type write struct {
	m   *nats.Msg
	cas bool
}

// commit stores ws: one message as a plain publish, more as one atomic
// batch. The error is the servers' (*jetstream.APIError) or the
// transport's.
func (s *Store) commit(ctx context.Context, ws []write) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout)
	defer cancel()
	if len(ws) == 1 {
		ack, err := s.st.js.PublishMsg(ctx, ws[0].m)
		if err == nil {
			s.wrote(ws[0].m.Subject, ack.Sequence)
		}
		return err
	}
	select {
	case s.st.batches <- struct{}{}:
		defer func() { <-s.st.batches }()
	case <-ctx.Done():
		return ctx.Err()
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	for i, w := range ws {
		m := w.m
		m.Header.Set("Nats-Batch-Id", id)
		m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
		if i < len(ws)-1 {
			if err := s.nc.PublishMsg(m); err != nil {
				return err
			}
			continue
		}
		m.Header.Set("Nats-Batch-Commit", "1")
		resp, err := s.nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		var ack struct {
			Error *jetstream.APIError `json:"error"`
			Seq   uint64              `json:"seq"`
			Count int                 `json:"count"`
		}
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return fmt.Errorf("batch answer %q: %w", resp.Data, err)
		}
		if ack.Error != nil {
			return ack.Error
		}
		if ack.Count != len(ws) {
			return fmt.Errorf("batch of %d stored %d", len(ws), ack.Count)
		}
		// A batch is stored at consecutive seqs, in order.
		for i, w := range ws {
			s.wrote(w.m.Subject, ack.Seq-uint64(len(ws)-1-i))
		}
	}
	return nil
}

// wrote notes an answered write of subj at seq, for retentionFloor.
func (s *Store) wrote(subj string, seq uint64) {
	k := strings.TrimPrefix(subj, s.statePfx)
	if !strings.HasPrefix(k, keyMember) && !strings.HasPrefix(k, keyCursor) && !strings.HasPrefix(k, keyRetry) {
		return
	}
	for {
		cur := s.st.ownSeq.Load()
		if seq <= cur || s.st.ownSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// laneFence is fence, or the test's stand-in.
func (s *Store) laneFence(sub string) (subject string, rev uint64, fenced bool, done func(), err error) {
	if f := s.st.fenceFn; f != nil {
		return f(sub)
	}
	return s.fence(sub)
}

func apiCode(err error) jetstream.ErrorCode {
	var e jetstream.JetStreamError
	if errors.As(err, &e) && e.APIError() != nil {
		return e.APIError().ErrorCode
	}
	return 0
}

// casRetryable: the write may succeed if sent again (another expectation on
// one of its subjects was in flight; the batch could not be opened).
func casRetryable(err error) bool {
	switch apiCode(err) {
	case codeWrongLastConst, codeBatchGone, codeBatchInflight:
		return true
	}
	return false
}

// writeLane writes about sub what build returns, fenced by this node's
// lease on sub, and retries on a conflict: build is called again (it
// reads what it writes over afresh). The caller holds sub's wmu.
//
// The fence rides on the first message without an expectation of its
// own; when every message has one, sub's cursor is written again as it
// is to carry it (cursorAsIs; before Own too, which costs a rewrite only
// there). A refused expectation (10071) of a write whose only one is the
// fence is queue.ErrFenced; with expectations of its own too, the lease is
// read to tell which failed (lease revisions only grow, so a lease still
// at rev passed its check). The fence is taken after build's reads, so a
// renewal of the lease waits only for the write itself.
func (s *Store) writeLane(sub string, build func(ctx context.Context) ([]write, error)) error {
	ctx := s.st.ctx
	deadline := time.Now().Add(s.opts.RequestTimeout)
	for attempt := 0; ; attempt++ {
		ws, err := build(ctx)
		if err != nil || len(ws) == 0 {
			return err
		}
		cas, carrier := false, -1
		for i, w := range ws {
			cas = cas || w.cas
			if !w.cas && carrier < 0 {
				carrier = i
			}
		}
		if carrier < 0 {
			c, err := s.cursorAsIs(ctx, sub)
			if err != nil {
				return err
			}
			ws, carrier = append(ws, c), len(ws)
		}
		ws[0], ws[carrier] = ws[carrier], ws[0]
		subj, rev, fenced, done, err := s.laneFence(sub)
		if err != nil {
			return err
		}
		if fenced {
			setFence(ws[0].m, subj, rev)
		}
		err = s.commit(ctx, ws)
		done()
		code := apiCode(err)
		switch {
		case err == nil:
			return nil
		case code == codeWrongLastSeq && fenced && !cas:
			return fmt.Errorf("%w: the lease of %s moved on from revision %d", queue.ErrFenced, sub, rev)
		case code == codeWrongLastSeq && fenced:
			e, gerr := s.getSubject(ctx, subj)
			if gerr != nil {
				return gerr
			}
			if e.rev != rev {
				return fmt.Errorf("%w: the lease of %s moved on from revision %d", queue.ErrFenced, sub, rev)
			}
		case code == codeWrongLastSeq, casRetryable(err), errors.Is(err, nats.ErrNoResponders):
			// No responders: nothing reached the stream (a leader election).
		default:
			return err
		}
		// A conflict: read again and write again, for a while.
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: state of %s: conflicting writes for %s: %w", queue.ErrUnavailable, sub, s.opts.RequestTimeout, err)
		}
		if code != codeWrongLastSeq {
			if err := s.pause(ctx, attempt); err != nil {
				return err
			}
		}
	}
}

// pause waits a little before a write is sent again (1 ms doubling to
// 32 ms), unless the store closes.
func (s *Store) pause(ctx context.Context, attempt int) error {
	t := time.NewTimer(time.Millisecond << min(attempt, 5))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return queue.ErrClosed
	}
}

// cursorAsIs is a carrier for the fence when every other message of a
// write has an expectation of its own: sub's cursor written again as it
// is. Only the lane's owner writes the cursor (fenced, one write at a
// time), so rewriting it changes nothing.
func (s *Store) cursorAsIs(ctx context.Context, sub string) (write, error) {
	e, err := s.get(ctx, cursorKey(sub))
	if err != nil {
		return write{}, err
	}
	if !e.exists() {
		return write{m: s.newPurge(cursorKey(sub))}, nil
	}
	return write{m: s.newPut(cursorKey(sub), e.data)}, nil
}

// pipe sends writes without waiting for each answer; one goroutine takes
// the answers in order and hands each to its callback, so a callback may
// release what the sender needs next.
type pipe struct {
	s  *Store
	q  chan pending
	wg sync.WaitGroup
}

type pending struct {
	f    jetstream.PubAckFuture
	subj string
	done func(error)
}

func (s *Store) newPipe() *pipe {
	p := &pipe{s: s, q: make(chan pending, stateWindow)}
	p.wg.Add(1)
	go p.collect()
	return p
}

func (p *pipe) send(m *nats.Msg, done func(error)) {
	f, err := p.s.st.js.PublishMsgAsync(m)
	if err != nil {
		done(err)
		return
	}
	p.q <- pending{f, m.Subject, done}
}

// collect: every future resolves, the context times out unanswered ones
// (WithPublishAsyncTimeout).
func (p *pipe) collect() {
	defer p.wg.Done()
	for w := range p.q {
		select {
		case ack := <-w.f.Ok():
			p.s.wrote(w.subj, ack.Sequence)
			w.done(nil)
		case err := <-w.f.Err():
			w.done(err)
		}
	}
}

// wait returns once every write sent has its answer.
func (p *pipe) wait() {
	close(p.q)
	p.wg.Wait()
}
