package client

import (
	"net/http"
	"testing"
	"time"
)

// TestRetryScheduleIsShort: a sidecar that is gone fails a call in under
// ten seconds; a long Retry-After does not stretch it.
func TestRetryScheduleIsShort(t *testing.T) {
	var total time.Duration
	for i := range DefaultRetryMax {
		total += cappedBackoff(DefaultRetryWaitMin, DefaultRetryWaitMax, i, nil)
	}
	if total < 3*time.Second || total > 8*time.Second {
		t.Fatalf("retries wait %s in all; want a restart's worth, under ten seconds", total)
	}
	resp := &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"3600"}}}
	if d := cappedBackoff(DefaultRetryWaitMin, DefaultRetryWaitMax, 0, resp); d != DefaultRetryWaitMax {
		t.Fatalf("Retry-After 3600 waits %s", d)
	}
}
