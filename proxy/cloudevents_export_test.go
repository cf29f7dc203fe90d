package proxy

import "github.com/sluicehq/sluice/queue"

// AppendEvent appends ev to s's log as ingest appends what it accepts, and
// returns its seq: for the tests of package proxy_test that need an event
// ingest does not make (one posted as a CloudEvent, with its attributes).
func AppendEvent(s *Server, ev *queue.Event) (uint64, error) {
	seq, _, err := s.q.Append(ev)
	return seq, err
}
