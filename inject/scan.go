package inject

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/rest"
)

// DefaultWebhookConfiguration is the name of the shipped
// MutatingWebhookConfiguration, whose selectors Check evaluates.
const DefaultWebhookConfiguration = "sluice-injector"

// listPage is how many pods one list call returns: a page of full pods is
// tens of KiB each at most, so the scan's memory stays a few MiB however
// many pods the cluster runs.
const listPage = 100

// Cluster reads what Check needs from the API server: the webhook
// configuration, namespaces and pods. It is client-go's REST client (its
// kubeconfig and in-cluster credentials, retries and errors) decoding into
// Check's own types, not client-go's clientset: the clientset registers
// every API group at start-up, 19 MiB more RSS in every process of this
// binary, sidecars included (measured with `/usr/bin/time -f %M sluice
// version`: 26 MB against 45 MB).
type Cluster struct {
	c rest.Interface
}

// NewCluster connects to the API server cfg names (rest.InClusterConfig in
// a pod, or a kubeconfig's).
func NewCluster(cfg *rest.Config) (*Cluster, error) {
	// The scheme decodes the API server's errors (metav1.Status); the
	// objects are read as JSON into Check's types.
	scheme := runtime.NewScheme()
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	cfg = rest.CopyConfig(cfg)
	cfg.APIPath = "/api"
	cfg.GroupVersion = &schema.GroupVersion{Version: "v1"}
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	cfg.ContentType = runtime.ContentTypeJSON
	c, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{c: c}, nil
}

// get reads the JSON answer to req into v.
func get(ctx context.Context, req *rest.Request, v any) error {
	b, err := req.SetHeader("Accept", runtime.ContentTypeJSON).DoRaw(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Webhooks are the webhooks of the MutatingWebhookConfiguration name.
func (c *Cluster) Webhooks(ctx context.Context, name string) ([]MutatingWebhook, error) {
	var mwc struct {
		Webhooks []MutatingWebhook `json:"webhooks"`
	}
	if err := get(ctx, c.c.Get().AbsPath("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", name), &mwc); err != nil {
		return nil, fmt.Errorf("read MutatingWebhookConfiguration %s: %w", name, err)
	}
	return mwc.Webhooks, nil
}

// Namespace is the namespace name.
func (c *Cluster) Namespace(ctx context.Context, name string) (*Namespace, error) {
	var ns Namespace
	if err := get(ctx, c.c.Get().Resource("namespaces").Name(name), &ns); err != nil {
		return nil, fmt.Errorf("read namespace %s: %w", name, err)
	}
	return &ns, nil
}

// Namespaces are all namespaces (a cluster has hundreds at most, in one
// list).
func (c *Cluster) Namespaces(ctx context.Context) ([]Namespace, error) {
	var list struct {
		Items []Namespace `json:"items"`
	}
	if err := get(ctx, c.c.Get().Resource("namespaces"), &list); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", err)
	}
	return list.Items, nil
}

// Pod is the pod name in namespace ns.
func (c *Cluster) Pod(ctx context.Context, ns, name string) (*Pod, error) {
	var pod Pod
	if err := get(ctx, c.c.Get().Namespace(ns).Resource("pods").Name(name), &pod); err != nil {
		return nil, fmt.Errorf("read pod %s/%s: %w", ns, name, err)
	}
	return &pod, nil
}

// Pods calls each with the pods of namespace ns ("" for all) that match
// sel, a page at a time.
func (c *Cluster) Pods(ctx context.Context, ns string, sel labels.Selector, each func(*Pod)) error {
	where := "pods"
	if ns != "" {
		where += " in namespace " + ns
	}
	if !sel.Empty() {
		where += " (labels " + sel.String() + ")"
	}
	next := ""
	for {
		var list struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
			Items []Pod `json:"items"`
		}
		req := c.c.Get().Namespace(ns).Resource("pods").Param("limit", strconv.Itoa(listPage))
		if !sel.Empty() {
			req = req.Param("labelSelector", sel.String())
		}
		if next != "" {
			req = req.Param("continue", next)
		}
		if err := get(ctx, req, &list); err != nil {
			return fmt.Errorf("list %s: %w", where, err)
		}
		for i := range list.Items {
			each(&list.Items[i])
		}
		if next = list.Metadata.Continue; next == "" {
			return nil
		}
	}
}

// Candidates calls each with the Verdict of every pod that a webhook of
// the configuration named webhookConfig selects: the pods that should have
// the sidecar, and those opted out by annotation (Check tells them apart).
// A webhook whose namespaceSelector names a label value (the namespace
// opt-in) has its pods listed per namespace it matches; one that matches
// most namespaces (the pod opt-in) has them listed across the cluster by
// its objectSelector, which the API server filters. Either way no list
// reads every pod of a cluster that opted few in.
func (c *Cluster) Candidates(ctx context.Context, webhookConfig string, defaults Options, each func(Verdict)) error {
	webhooks, err := c.Webhooks(ctx, webhookConfig)
	if err != nil {
		return err
	}
	all, err := c.Namespaces(ctx)
	if err != nil {
		return err
	}
	seen := map[string]bool{} // namespace/name: selectors may overlap
	check := func(byName map[string]*Namespace) func(*Pod) {
		return func(pod *Pod) {
			ns := byName[pod.Metadata.Namespace]
			key := pod.Metadata.Namespace + "/" + pod.Metadata.Name
			if ns == nil || seen[key] {
				return
			}
			seen[key] = true
			each(Check(pod, ns, webhooks, defaults))
		}
	}
	for _, w := range webhooks {
		path := webhookPath(&w)
		if (path != PodPath && path != NamespacePath) || !createsPods(&w) {
			continue
		}
		nsSel, err := selector(w.NamespaceSelector)
		if err != nil {
			return fmt.Errorf("webhook %s: namespaceSelector: %w", w.Name, err)
		}
		objSel, err := selector(w.ObjectSelector)
		if err != nil {
			return fmt.Errorf("webhook %s: objectSelector: %w", w.Name, err)
		}
		matched := map[string]*Namespace{}
		for i := range all {
			if nsSel.Matches(labels.Set(all[i].Metadata.Labels)) {
				matched[all[i].Metadata.Name] = &all[i]
			}
		}
		if narrows(nsSel) {
			for _, name := range slices.Sorted(maps.Keys(matched)) {
				if err := c.Pods(ctx, name, objSel, check(matched)); err != nil {
					return err
				}
			}
			continue
		}
		if err := c.Pods(ctx, "", objSel, check(matched)); err != nil {
			return err
		}
	}
	return nil
}

// narrows reports whether sel asks for a label to be present (with a value
// or any), as an opt-in label does; NotIn and DoesNotExist alone exclude a
// few and let the rest through.
func narrows(sel labels.Selector) bool {
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		switch r.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals, selection.Exists:
			return true
		}
	}
	return false
}

// Scanner runs Candidates every interval and exports what it finds:
//
//	sluice_injector_pods_without_sidecar{namespace,cause}  pods that asked for the sidecar and run without it
//	sluice_injector_scan_last_success_timestamp_seconds    when a scan last completed
//	sluice_injector_scan_errors_total                      scans that failed (the error is logged)
//
// The first is set whole after each complete scan, so a scrape never sees
// half a scan; a namespace with none has no series.
type Scanner struct {
	cluster       *Cluster
	webhookConfig string
	defaults      Options
	interval      time.Duration
	log           *slog.Logger

	mu      sync.Mutex
	missing map[[2]string]int // namespace, cause

	desc        *prometheus.Desc
	lastSuccess prometheus.Gauge
	errs        prometheus.Counter
}

// NewScanner makes a Scanner and registers its metrics on reg.
func NewScanner(cluster *Cluster, webhookConfig string, defaults Options, interval time.Duration, reg prometheus.Registerer, log *slog.Logger) *Scanner {
	s := &Scanner{cluster: cluster, webhookConfig: webhookConfig, defaults: defaults, interval: interval, log: log,
		desc: prometheus.NewDesc("sluice_injector_pods_without_sidecar",
			"Pods that asked for the sidecar (the webhooks select them and they did not opt out) and run without it, by namespace and cause: not_injected (created while no injector answered, or before the opt-in; recreate them) or bad_input (the review admitted them without it, with a warning; fix their spec).",
			[]string{"namespace", "cause"}, nil),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_injector_scan_last_success_timestamp_seconds",
			Help: "Unix time at which the last scan for pods without the sidecar completed (0: none yet).",
		}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_injector_scan_errors_total",
			Help: "Scans for pods without the sidecar that failed (the injector logs why: RBAC, the API server).",
		}),
	}
	if reg != nil {
		reg.MustRegister(s, s.lastSuccess, s.errs)
	}
	return s
}

// Describe implements prometheus.Collector.
func (s *Scanner) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

// Collect implements prometheus.Collector.
func (s *Scanner) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.missing {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
}

// Run scans at once and then every interval until ctx is done.
func (s *Scanner) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.Scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Scan runs one scan, updates the metrics, logs the pods found whenever
// their counts change (not every interval), and returns them.
func (s *Scanner) Scan(ctx context.Context) ([]Verdict, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.interval, time.Minute))
	defer cancel()
	var found []Verdict
	err := s.cluster.Candidates(ctx, s.webhookConfig, s.defaults, func(v Verdict) {
		if v.Missing() {
			found = append(found, v)
		}
	})
	if err != nil {
		if ctx.Err() == nil || errors.Is(err, context.DeadlineExceeded) {
			s.errs.Inc()
			s.log.Error("scan for pods without the sidecar failed; the last complete scan's counts stay", "err", err)
		}
		return nil, err
	}
	missing := map[[2]string]int{}
	for _, v := range found {
		missing[[2]string{v.Namespace, string(v.Cause)}]++
	}
	s.mu.Lock()
	before := s.missing
	s.missing = missing
	s.mu.Unlock()
	s.lastSuccess.SetToCurrentTime()
	if len(found) > 0 && !maps.Equal(before, missing) {
		for _, v := range found[:min(len(found), maxLoggedPods)] {
			s.log.Warn("pod runs without the sidecar it asked for", "namespace", v.Namespace, "pod", v.Pod,
				"owner", v.Owner, "cause", string(v.Cause), "why", v.Why)
		}
		if len(found) > maxLoggedPods {
			s.log.Warn("more pods run without the sidecar they asked for: sluice check-inject -A lists them all",
				"logged", maxLoggedPods, "found", len(found))
		}
	}
	return found, nil
}

// maxLoggedPods bounds the pods a scan logs by name: an outage that left
// thousands without their sidecar is one metric and a few lines, not
// thousands of lines a minute.
const maxLoggedPods = 20
