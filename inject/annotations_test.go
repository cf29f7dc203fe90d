package inject

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAnnotationOptions(t *testing.T) {
	fleet := Defaults()
	fleet.JetStreamURLs = []string{"nats://nats:4222"}
	for _, c := range []struct {
		name        string
		annotations map[string]string
		defaults    *Options
		edit        func(o *Options) // what the annotations change from the defaults
		err         string
	}{
		{name: "none"},
		{name: "other prefixes ignored", annotations: map[string]string{"example.com/sluice.io": "x", "prometheus.io/scrape": "true", "x.sluice.io/image": "y"}},
		{name: "inject and required", annotations: map[string]string{AnnotationInject: "true", AnnotationRequired: "false"}},
		{name: "image", annotations: map[string]string{"sluice.io/image": "registry.local/sluice:v1"}, edit: func(o *Options) { o.Image = "registry.local/sluice:v1" }},
		{name: "config-map", annotations: map[string]string{"sluice.io/config-map": "billing-sluice"}, edit: func(o *Options) { o.ConfigMap = "billing-sluice" }},
		{name: "pvc", annotations: map[string]string{"sluice.io/pvc": "billing-queue"}, edit: func(o *Options) { o.PVC = "billing-queue" }},
		{name: "secret", annotations: map[string]string{"sluice.io/secret": "billing-secrets"}, edit: func(o *Options) { o.Secret = "billing-secrets" }},
		{name: "grace", annotations: map[string]string{"sluice.io/grace": "45s"}, edit: func(o *Options) { o.Grace = 45 * time.Second }},
		{name: "ports", annotations: map[string]string{"sluice.io/ingest-port": "9700", "sluice.io/admin-port": "9701"}, edit: func(o *Options) { o.IngestPort, o.AdminPort = 9700, 9701 }},
		{name: "resources", annotations: map[string]string{"sluice.io/cpu-request": "100m", "sluice.io/memory-request": "128Mi", "sluice.io/cpu-limit": "2", "sluice.io/memory-limit": ""},
			edit: func(o *Options) { o.CPURequest, o.MemoryRequest, o.CPULimit, o.MemoryLimit = "100m", "128Mi", "2", "" }},
		{name: "jetstream-urls", annotations: map[string]string{"sluice.io/jetstream-urls": "nats://a:4222, tls://b:4222"},
			edit: func(o *Options) { o.JetStreamURLs = []string{"nats://a:4222", "tls://b:4222"} }},
		{name: "jetstream-urls empty turns fleet off", defaults: &fleet, annotations: map[string]string{"sluice.io/jetstream-urls": ""},
			edit: func(o *Options) { o.JetStreamURLs = nil }},

		{name: "bad grace", annotations: map[string]string{"sluice.io/grace": "soon"}, err: `annotation sluice.io/grace "soon": not a duration`},
		{name: "grace out of range", annotations: map[string]string{"sluice.io/grace": "48h"}, err: `annotation sluice.io/grace 48h0m0s is out of range`},
		{name: "bad port", annotations: map[string]string{"sluice.io/ingest-port": "http"}, err: `annotation sluice.io/ingest-port "http": not a port number`},
		{name: "port range", annotations: map[string]string{"sluice.io/admin-port": "0"}, err: `annotation sluice.io/admin-port 0 is out of range`},
		{name: "port clash with a default", annotations: map[string]string{"sluice.io/admin-port": "8700"},
			err: `the injector's --ingest-port and annotation sluice.io/admin-port are both 8700`},
		{name: "bad inject", annotations: map[string]string{AnnotationInject: "yes"}, err: `annotation sluice.io/inject "yes": not "true" or "false"`},
		{name: "bad required", annotations: map[string]string{AnnotationRequired: "True"}, err: `annotation sluice.io/required "True": not "true" or "false"`},
		{name: "unknown", annotations: map[string]string{"sluice.io/configmap": "x"}, err: `unknown annotation "sluice.io/configmap" (did you mean sluice.io/config-map?)`},
		{name: "unknown far from any", annotations: map[string]string{"sluice.io/sidecar-version": "2"}, err: `unknown annotation "sluice.io/sidecar-version"`},
		{name: "bad config-map", annotations: map[string]string{"sluice.io/config-map": "Billing_Config"}, err: `annotation sluice.io/config-map "Billing_Config" is not a Kubernetes resource name`},
		{name: "empty image", annotations: map[string]string{"sluice.io/image": ""}, err: `annotation sluice.io/image must not be empty`},
		{name: "bad quantity", annotations: map[string]string{"sluice.io/memory-limit": "1GB"}, err: `annotation sluice.io/memory-limit "1GB" is not a Kubernetes quantity`},
		{name: "request above a default limit", annotations: map[string]string{"sluice.io/memory-request": "2Gi"},
			err: `annotation sluice.io/memory-request 2Gi is above the injector's --memory-limit 1Gi`},
		{name: "bad jetstream url", annotations: map[string]string{"sluice.io/jetstream-urls": "http://nats:4222"},
			err: `annotation sluice.io/jetstream-urls "http://nats:4222": must be nats://`},
		{name: "jetstream password redacted", annotations: map[string]string{"sluice.io/jetstream-urls": "nats://u:hunter2@nats:4222"},
			err: `annotation sluice.io/jetstream-urls "[redacted]"`},
		{name: "long value cut short", annotations: map[string]string{"sluice.io/grace": strings.Repeat("x", 1000)},
			err: `annotation sluice.io/grace "` + strings.Repeat("x", 64) + `"…: not a duration`},
	} {
		t.Run(c.name, func(t *testing.T) {
			defaults := Defaults()
			if c.defaults != nil {
				defaults = *c.defaults
			}
			want := defaults
			if c.edit != nil {
				c.edit(&want)
			}
			got, err := annotationOptions(c.annotations, defaults)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				if strings.Contains(err.Error(), "hunter2") {
					t.Errorf("error shows a password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestAnnotationOptionsKeepsDefaults: overriding the URLs of one pod does
// not write through to the injector's defaults, shared by every review.
func TestAnnotationOptionsKeepsDefaults(t *testing.T) {
	d := Defaults()
	d.JetStreamURLs = []string{"nats://a:4222", "nats://b:4222"}
	if _, err := annotationOptions(map[string]string{"sluice.io/jetstream-urls": "nats://c:4222"}, d); err != nil {
		t.Fatal(err)
	}
	if d.JetStreamURLs[0] != "nats://a:4222" {
		t.Errorf("defaults changed: %v", d.JetStreamURLs)
	}
}

// TestAnnotationsCoverFlags: every option has an annotation named like its
// flag, so the annotations table in examples/kubernetes/injector/README.md has one name per row.
func TestAnnotationsCoverFlags(t *testing.T) {
	for _, key := range []string{"image", "config-map", "pvc", "secret", "grace", "ingest-port", "admin-port",
		"cpu-request", "memory-request", "cpu-limit", "memory-limit", "jetstream-urls"} {
		if optionAnnotations[key] == nil {
			t.Errorf("no annotation %s%s", AnnotationPrefix, key)
		}
	}
	if n := reflect.TypeOf(Options{}).NumField(); n != len(optionAnnotations) {
		t.Errorf("Options has %d fields, annotations set %d", n, len(optionAnnotations))
	}
}
