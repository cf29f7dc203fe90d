package proxy_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/proxy/delivery"
)

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
