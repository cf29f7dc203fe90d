package proxy

import (
	"github.com/sluicehq/sluice/proxy/admin"
	"github.com/sluicehq/sluice/proxy/api"
)

// Pause stops a subscription's deliveries (its events wait on disk) and
// records why; the pause survives restarts until Resume.
func (s *Server) Pause(id, reason string) error { return s.d.Pause(id, reason) }

// Resume lifts a run-time pause (an operator's, or a 410 Gone's).
func (s *Server) Resume(id string) error { return s.d.Resume(id) }

// Event answers the completion ledger for an event id still in the dedup
// window (delivery.Dispatcher.Event).
func (s *Server) Event(id string) (*api.EventStatus, error) { return s.d.Event(id) }

// Replay schedules one dead letter for delivery again; one already
// replayed is skipped unless force (delivery.Dispatcher.Replay).
func (s *Server) Replay(sub string, seq uint64, force bool) (api.ReplayResult, error) {
	return s.d.Replay(sub, seq, force)
}

// SetTenantTokens replaces the tenant tokens of the config (admin.tokens)
// on a reload: a token no longer among them is refused from the next
// request, a new one works from then; issued tokens are not touched.
func (s *Server) SetTenantTokens(toks []admin.TenantToken) {
	if s.api == nil {
		s.opts.TenantTokens = toks // not open yet: Open gives them to the API
		return
	}
	s.api.SetTenantTokens(toks)
}
