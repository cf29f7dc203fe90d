package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/proxy/delivery"
)

// BenchmarkDeliveryVariants is fan-out 40 of a 512-byte JSON body, sent as
// stored (variants=0) and with the 40 subscriptions spread over 3 body
// variants (variants=3: an envelope, a projection, both). Each
// variant is rendered once per event, so the cost is 3 renderings per 40
// deliveries, plus each rendering's bytes, shared by its lanes.
func BenchmarkDeliveryVariants(b *testing.B) {
	body := []byte(`{"type":"geofence.enter","data":{"depot":"A","speed":42,"kind":"alarm.high","pad":"` + strings.Repeat("x", 420) + `"}}`)
	specs := []policy.VariantSpec{
		{Envelope: policy.EnvelopeStandardWebhooks},
		{Fields: []string{"data.depot", "data.speed", "data.kind"}},
		{Envelope: policy.EnvelopeStandardWebhooks, Fields: []string{"data.depot"}},
	}
	variants := make([]*policy.Variant, len(specs))
	for i, spec := range specs {
		v, err := policy.ParseVariant(spec)
		if err != nil {
			b.Fatal(err)
		}
		variants[i] = v
	}
	for _, n := range []int{0, len(variants)} {
		b.Run(fmt.Sprintf("variants=%d", n), func(b *testing.B) {
			benchDelivery(b, 40, body, func(subs []*delivery.Subscription) {
				for i, s := range subs {
					if n > 0 {
						s.Variant = variants[i%n]
					}
				}
			})
		})
	}
}
