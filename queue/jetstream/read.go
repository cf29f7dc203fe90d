package jetstream

// Reads. A direct get is answered by the nearest replica (on loopback, the
// server this node is connected to), which may not yet have applied the
// latest writes of its stream; a read that misses an event the head says
// exists asks the stream leader (STREAM.MSG.GET) before saying not found.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// decodeEvent makes an event of a stored message; data becomes its body.
// Every read path (the stream follower, direct gets, batched gets) decodes
// through it, so each reads the same headers.
func decodeEvent(seq uint64, subject string, h nats.Header, data []byte) (*queue.Event, error) {
	id := hval(h, jetstream.MsgIDHeader)
	if id == "" {
		return nil, fmt.Errorf("message %d on %s has no Nats-Msg-Id: %w", seq, subject, queue.ErrCorrupt)
	}
	at, err := strconv.ParseInt(hval(h, hdrAcceptedAt), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("message %d (%s): %s: %w", seq, id, hdrAcceptedAt, queue.ErrCorrupt)
	}
	if data == nil {
		data = []byte{}
	}
	return &queue.Event{
		Seq: seq, ID: id, Type: hval(h, hdrType), ContentType: hval(h, hdrContentType),
		OrderingKey: hval(h, hdrOrderingKey), TraceParent: hval(h, hdrTraceParent), TraceState: hval(h, hdrTraceState),
		Tenant: hval(h, hdrTenant), CloudEvent: hval(h, hdrCloudEvent),
		AcceptedAt: time.Unix(0, at),
		// The message's own buffer, capped so no append can reach the
		// bytes next to it.
		Body: data[:len(data):len(data)],
	}, nil
}

func hval(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// getMsg is one stored message as a read returns it.
type getMsg struct {
	seq     uint64
	subject string
	ts      int64 // stored at, unix nanos (the server's clock)
	hdr     nats.Header
	data    []byte
}

// errNoMsg: the server has no such message.
var errNoMsg = errors.New("no message")

// directGet asks the nearest replica: by seq, or the last message on subj.
func (s *Store) directGet(stream string, seq uint64, subj string) (*getMsg, error) {
	var (
		m   *nats.Msg
		err error
	)
	if subj != "" {
		m, err = s.nc.Request(s.lg.api+"DIRECT.GET."+stream+"."+subj, nil, s.opts.RequestTimeout)
	} else {
		req := append(strconv.AppendUint([]byte(`{"seq":`), seq, 10), '}')
		m, err = s.nc.Request(s.lg.api+"DIRECT.GET."+stream, req, s.opts.RequestTimeout)
		if err == nil {
			m.Data = m.Data[:len(m.Data):len(m.Data)]
		}
	}
	if err != nil {
		return nil, err
	}
	return directMsg(m)
}

// directMsg decodes one answer of a direct get.
func directMsg(m *nats.Msg) (*getMsg, error) {
	if len(m.Data) == 0 {
		switch st := hval(m.Header, "Status"); st {
		case "":
		case "404":
			return nil, errNoMsg
		default:
			return nil, fmt.Errorf("direct get: status %s %s", st, hval(m.Header, "Description"))
		}
	}
	seq, err := strconv.ParseUint(hval(m.Header, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("direct get: bad %s header: %w", jetstream.SequenceHeader, queue.ErrCorrupt)
	}
	ts, err := time.Parse(time.RFC3339Nano, hval(m.Header, jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("direct get: bad %s header: %w", jetstream.TimeStampHeaer, queue.ErrCorrupt)
	}
	return &getMsg{seq: seq, subject: hval(m.Header, jetstream.SubjectHeader), ts: ts.UnixNano(), hdr: m.Header, data: m.Data}, nil
}

// leaderGet asks the stream leader (not a direct get): the message at
// seq, the first at or after seq when next, or the last on subj.
func (s *Store) leaderGet(stream string, seq uint64, next bool, subj string) (*getMsg, error) {
	req := map[string]any{}
	switch {
	case subj != "":
		req["last_by_subj"] = subj
	case next:
		req["seq"], req["next_by_subj"] = seq, s.evSubj+">"
	default:
		req["seq"] = seq
	}
	body, _ := json.Marshal(req)
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Hdrs    []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := s.apiJSON(s.lg.api+"STREAM.MSG.GET."+stream, body, &resp); err != nil {
		return nil, err
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == errCodeNoMessage || resp.Error.Code == 404 {
			return nil, errNoMsg
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("stream %s: a message get answered no message", stream)
	}
	g := &getMsg{seq: resp.Message.Seq, subject: resp.Message.Subject, ts: resp.Message.Time.UnixNano(), data: resp.Message.Data}
	if len(resp.Message.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Hdrs)
		if err != nil {
			return nil, fmt.Errorf("message %d: headers: %w", g.seq, queue.ErrCorrupt)
		}
		g.hdr = h
	}
	return g, nil
}

// readErr wraps a failed read: unavailable when the cluster did not
// answer, closed after Close.
func (s *Store) readErr(what string, err error) error {
	switch {
	case s.closed.Load() || errors.Is(err, nats.ErrConnectionClosed):
		return fmt.Errorf("%s: %w", what, queue.ErrClosed)
	case transientErr(err):
		return fmt.Errorf("%s: %w: %w", what, queue.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Event reads one event by seq; ErrNotFound once it is compacted.
func (s *Store) Event(seq uint64) (*queue.Event, error) {
	if s.closed.Load() {
		return nil, queue.ErrClosed
	}
	what := "event " + strconv.FormatUint(seq, 10)
	if seq == 0 {
		return nil, fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	g, err := s.directGet(s.opts.Stream, seq, "")
	if errors.Is(err, errNoMsg) && seq <= s.stored() {
		g, err = s.leaderGet(s.opts.Stream, seq, false, "")
	}
	if errors.Is(err, errNoMsg) {
		return nil, fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	if err != nil {
		return nil, s.readErr(what, err)
	}
	return decodeEvent(g.seq, g.subject, g.hdr, g.data)
}

// dedupSlack is how much longer than the dedup window Lookup remembers an
// id: the server forgets ids on a timer, so an id Lookup calls gone must
// already be gone for the stream's duplicate check too.
const dedupSlack = time.Second

// Lookup returns the seq and type of the event with this id while the id
// is remembered: the last message on the id's subject, or, once that event
// is compacted, its entry in the id index (compact.go), until the dedup
// window has passed since the event was stored.
func (s *Store) Lookup(id string) (uint64, string, string, error) {
	if s.closed.Load() {
		return 0, "", "", queue.ErrClosed
	}
	what := "lookup " + id
	subj := s.eventSubject(id)
	horizon := time.Now().Add(-s.opts.DedupWindow - dedupSlack).UnixNano()
	g, err := s.directGet(s.opts.Stream, 0, subj)
	if errors.Is(err, errNoMsg) {
		g, err = s.leaderGet(s.opts.Stream, 0, false, subj)
	}
	switch {
	case err == nil:
		if g.ts < horizon {
			return 0, "", "", fmt.Errorf("%s: %w", what, queue.ErrNotFound)
		}
		return g.seq, hval(g.hdr, hdrType), hval(g.hdr, hdrTenant), nil
	case !errors.Is(err, errNoMsg):
		return 0, "", "", s.readErr(what, err)
	}
	seq, typ, tenant, ts, err := s.lookupIndex(id)
	if errors.Is(err, errNoMsg) || err == nil && ts < horizon {
		return 0, "", "", fmt.Errorf("%s: %w", what, queue.ErrNotFound)
	}
	if err != nil {
		return 0, "", "", s.readErr(what, err)
	}
	return seq, typ, tenant, nil
}
