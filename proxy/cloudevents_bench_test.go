package proxy_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/proxy/delivery"
)

// BenchmarkIngestCloudEvent is BenchmarkIngest's async case (64
// producers, a 512-byte JSON body, no subscriptions) for a plain event
// with an Idempotency-Key, against the same event posted as a CloudEvent
// in binary mode (five ce-* headers) and in structured mode (the
// attributes and the data in one JSON object), in the same run: what
// reading a CloudEvent costs ingest.
func BenchmarkIngestCloudEvent(b *testing.B) {
	data := `{"vehicle":"v-17","zone":"depot-3","pad":"` + strings.Repeat("x", 470) + `"}`
	for _, mode := range []string{"plain", "binary", "structured"} {
		b.Run(mode, func(b *testing.B) {
			s := benchServer(b, false)
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			perEvent(b, func() {
				produceEach(b, 64, b.N, func(req *fasthttp.Request) {
					switch mode {
					case "plain":
						req.SetRequestURI(s.URL() + "/v1/events/geofence.enter")
						req.Header.SetContentType("application/json")
						req.SetBodyString(data)
					case "binary":
						req.SetRequestURI(s.URL() + "/v1/events")
						req.Header.SetContentType("application/json")
						req.Header.Set("ce-specversion", "1.0")
						req.Header.Set("ce-source", "https://fleet.example.com/trips")
						req.Header.Set("ce-type", "geofence.enter")
						req.Header.Set("ce-subject", "v-17")
						req.SetBodyString(data)
					case "structured":
						req.SetRequestURI(s.URL() + "/v1/events")
						req.Header.SetContentType("application/cloudevents+json")
					}
				}, func(req *fasthttp.Request, _ int64, id []byte) {
					switch mode {
					case "plain":
						req.Header.SetBytesV("Idempotency-Key", id)
					case "binary":
						req.Header.SetBytesV("ce-id", id)
					case "structured":
						req.SetBodyString(`{"specversion":"1.0","id":"` + string(id) + `","source":"https://fleet.example.com/trips","type":"geofence.enter",` +
							`"subject":"v-17","datacontenttype":"application/json","data":` + data + `}`)
					}
				})
			})
		})
	}
}

// produceEach posts n events from conc keep-alive connections: setup
// makes each connection's request once, and each sets event i's unique
// id in it (and whatever else differs per event); any answer but 202
// fails b.
func produceEach(b *testing.B, conc, n int, setup func(req *fasthttp.Request), each func(req *fasthttp.Request, i int64, id []byte)) {
	c := &fasthttp.Client{MaxConnsPerHost: conc}
	run := benchRun.Add(1)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.Header.SetMethod("POST")
			setup(req)
			var id []byte
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				id = fmt.Appendf(id[:0], "r%d-%d", run, i)
				each(req, i, id)
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 202 {
					b.Errorf("post: %v %d %s", err, resp.StatusCode(), resp.Body())
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkDeliveryFormats is fan-out 1 and 10 of a 512-byte JSON body
// posted plainly, every subscription in one delivery format: Standard
// Webhooks (the default), CloudEvents binary and CloudEvents structured,
// in one run. The CloudEvents attributes are derived and rendered once
// per event for all the subscriptions of a format, so fan-out 1 pays a
// rendering per delivery and fan-out 10 a tenth of one; the rest is the
// headers copied in and, in structured mode, the envelope's larger bytes
// signed and sent.
func BenchmarkDeliveryFormats(b *testing.B) {
	body := []byte(`{"type":"geofence.enter","data":{"depot":"A","speed":42,"kind":"alarm.high","pad":"` + strings.Repeat("x", 420) + `"}}`)
	for _, fan := range []int{1, 10} {
		for _, format := range []string{delivery.FormatStandardWebhooks, delivery.FormatCloudEventsBinary, delivery.FormatCloudEventsStructured} {
			b.Run(fmt.Sprintf("fanout=%d/format=%s", fan, format), func(b *testing.B) {
				benchDelivery(b, fan, body, func(subs []*delivery.Subscription) {
					for _, s := range subs {
						s.Format = format
					}
				})
			})
		}
	}
}
