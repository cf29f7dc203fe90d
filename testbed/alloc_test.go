package testbed

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestWebhookPathAllocatesNothing: the benchmarks' receiver must not cost
// the machine it measures on. A lean server with a Hook answers a delivery
// to a path it knows without allocating; one that keeps ids allocates only
// for an id it has not seen.
func TestWebhookPathAllocatesNothing(t *testing.T) {
	hook := func(r Request, status int) int {
		if len(r.Header("webhook-id")) == 0 || len(r.Body()) == 0 || r.N() == 0 {
			t.Error("hook saw an empty request")
		}
		return status
	}
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"lean with a hook", Options{Lean: true, Hook: hook}},
		{"keeping ids, a duplicate", Options{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(c.opts)
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod(fasthttp.MethodPost)
			ctx.Request.SetRequestURI("/s7")
			ctx.Request.Header.Set("webhook-id", "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
			ctx.Request.Header.Set("X-Attempt", "1")
			ctx.Request.SetBodyString(`{"sent_ns":1767225600123456789}`)
			s.handle(&ctx) // the path's first request makes its state
			if n := testing.AllocsPerRun(1000, func() {
				ctx.Response.Reset()
				s.handle(&ctx)
			}); n != 0 {
				t.Fatalf("%v allocations per request", n)
			}
			if st := s.Stats()["/s7"]; st.Accepted < 1001 || st.Attempts["1"] != st.Accepted {
				t.Fatalf("stats = %+v", st)
			}
		})
	}
}
