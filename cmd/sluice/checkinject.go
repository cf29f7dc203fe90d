package main

// `sluice check-inject` explains, for the pods of a namespace or one pod,
// whether the injector's webhooks select it, whether it has the sidecar,
// and what to do about one that asked for it and has none. The decision is
// package inject's Check, the one the injector's scan exports as a metric.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sluicehq/sluice/inject"
)

// checkTimeout bounds one check-inject run: a few API calls, one list per
// page of pods.
const checkTimeout = time.Minute

const checkInjectAbout = `Explains whether each pod of a namespace (or POD alone) should have the
sluice sidecar and whether it has it: which of the injector's webhooks
selects it (read from the cluster's MutatingWebhookConfiguration, so
selectors you changed count), whether it opted out, and, for a pod that
asked for the sidecar and runs without it, why and what to do. -A checks
every pod the webhooks select, across namespaces, as the injector's scan
does. Exits 1 when a pod asked for the sidecar and has none. Reads the
cluster with your kubeconfig (list and get on pods and namespaces, get on
mutatingwebhookconfigurations). Pass the injector's own sidecar flags (the
ports above all) when they differ from the defaults.`

// kubeFlags registers --kubeconfig and --context; the returned function,
// called after parsing, gives the REST config and the context's namespace.
// With neither flag nor $KUBECONFIG it reads ~/.kube/config, as kubectl
// does.
func kubeFlags(fs *flag.FlagSet) func() (*rest.Config, string, error) {
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: its current context)")
	return func() (*rest.Config, string, error) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = *kubeconfig
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeContext})
		cfg, err := cc.ClientConfig()
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig: %w", err)
		}
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, "", fmt.Errorf("kubeconfig: %w", err)
		}
		cfg.UserAgent = "sluice/" + version
		return cfg, ns, nil
	}
}

func checkInjectCmd(args []string, stdout io.Writer) error {
	fs := newFlagSet("check-inject", checkInjectAbout, stdout)
	namespace := fs.String("namespace", "", "namespace (default: the kubeconfig context's)")
	fs.StringVar(namespace, "n", "", "short for --namespace")
	allNamespaces := fs.Bool("all-namespaces", false, "every pod the webhooks select, in every namespace")
	fs.BoolVar(allNamespaces, "A", false, "short for --all-namespaces")
	webhookConfig := fs.String("webhook-configuration", inject.DefaultWebhookConfiguration, "the injector's MutatingWebhookConfiguration")
	kube := kubeFlags(fs)
	options := injectFlags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return fmt.Errorf("check-inject: want at most one POD, got %d arguments", len(pos))
	case len(pos) == 1 && *allNamespaces:
		return errors.New("check-inject: --all-namespaces (-A) checks every namespace; give a POD with --namespace (-n)")
	}
	o, err := options()
	if err != nil {
		return fmt.Errorf("check-inject: %w", err)
	}
	cfg, ctxNamespace, err := kube()
	if err != nil {
		return fmt.Errorf("check-inject: %w", err)
	}
	cluster, err := inject.NewCluster(cfg)
	if err != nil {
		return fmt.Errorf("check-inject: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	var verdicts []inject.Verdict
	if *allNamespaces {
		err = cluster.Candidates(ctx, *webhookConfig, o, func(v inject.Verdict) { verdicts = append(verdicts, v) })
	} else {
		verdicts, err = checkNamespace(ctx, cluster, *webhookConfig, cmp.Or(*namespace, ctxNamespace), pos, o)
	}
	if err != nil {
		return fmt.Errorf("check-inject: %w", err)
	}
	if len(pos) == 1 {
		printVerdict(stdout, verdicts[0])
	} else {
		printVerdicts(stdout, verdicts, *allNamespaces)
	}
	missing := 0
	for _, v := range verdicts {
		if v.Missing() {
			missing++
		}
	}
	if missing > 0 {
		return fmt.Errorf("check-inject: %d of %d pods asked for the sidecar and run without it", missing, len(verdicts))
	}
	return nil
}

// checkNamespace checks pod (pods[0]) in ns, or every pod in ns.
func checkNamespace(ctx context.Context, cluster *inject.Cluster, webhookConfig, ns string, pods []string, o inject.Options) ([]inject.Verdict, error) {
	webhooks, err := cluster.Webhooks(ctx, webhookConfig)
	if err != nil {
		return nil, err
	}
	nsObj, err := cluster.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	if len(pods) == 1 {
		pod, err := cluster.Pod(ctx, ns, pods[0])
		if err != nil {
			return nil, err
		}
		return []inject.Verdict{inject.Check(pod, nsObj, webhooks, o)}, nil
	}
	var verdicts []inject.Verdict
	err = cluster.Pods(ctx, ns, labels.Everything(), func(pod *inject.Pod) {
		verdicts = append(verdicts, inject.Check(pod, nsObj, webhooks, o))
	})
	return verdicts, err
}

// state is a verdict in a word or two: the table's STATE column.
func state(v inject.Verdict) string {
	switch {
	case v.Cause == inject.NotInjected:
		return "MISSING"
	case v.Cause == inject.BadInput:
		return "MISSING (bad input)"
	case v.Has && v.Want:
		return "injected"
	case v.Has:
		return "has sidecar, not asked"
	}
	return "not asked"
}

// remedy says what to do about a pod missing its sidecar.
func remedy(v inject.Verdict) string {
	switch v.Cause {
	case inject.NotInjected:
		if v.Owner != "" {
			return "recreate it: restart its owner (" + v.Owner + "; for a Deployment's ReplicaSet, kubectl -n " + v.Namespace + " rollout restart deployment/NAME)"
		}
		return "recreate it (kubectl -n " + v.Namespace + " delete pod " + v.Pod + ", then create it again)"
	case inject.BadInput:
		return "fix what the reason names in its owner's pod template, then restart it"
	}
	return ""
}

func printVerdict(w io.Writer, v inject.Verdict) {
	fmt.Fprintf(w, "pod %s/%s: %s\n", v.Namespace, v.Pod, state(v))
	fmt.Fprintf(w, "  sidecar: %s\n", map[bool]string{true: "yes", false: "no"}[v.Has])
	fmt.Fprintf(w, "  why:     %s\n", v.Why)
	if r := remedy(v); r != "" {
		fmt.Fprintf(w, "  do:      %s\n", r)
	}
}

func printVerdicts(w io.Writer, verdicts []inject.Verdict, withNamespace bool) {
	if len(verdicts) == 0 {
		fmt.Fprintln(w, "no pods")
		return
	}
	t := newTable(w)
	if withNamespace {
		fmt.Fprint(t, "NAMESPACE\t")
	}
	fmt.Fprintln(t, "POD\tSTATE\tOWNER\tWHY")
	for _, v := range verdicts {
		if withNamespace {
			fmt.Fprintf(t, "%s\t", v.Namespace)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\n", v.Pod, state(v), cmp.Or(v.Owner, "-"), v.Why)
	}
	t.Flush()
	if slices.ContainsFunc(verdicts, inject.Verdict.Missing) {
		fmt.Fprintln(w, "\nMISSING pods asked for the sidecar and run without it: recreate them (restart their owners);\n'sluice check-inject -n NAMESPACE POD' says more about one.")
	}
}
