// Package injecttest holds what the admission webhook's tests share: a
// certificate authority and serving pairs made in the test, written the
// way cert-manager's Secret volume writes them (a ..data symlink swapped
// at once), and an AdmissionReview of the pod a Deployment creates, built
// with the k8s.io/api types. For tests only.
package injecttest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	Pool *x509.CertPool // trusts this CA only
}

// NewCA makes a CA.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice-injector test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}
}

// PEM is the CA's certificate, PEM-encoded: a webhook's caBundle.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// Pair is a serving certificate and its key, PEM-encoded.
type Pair struct {
	Cert, Key []byte
	Serial    *big.Int
}

// Leaf makes a serving pair for 127.0.0.1 and localhost with the given
// serial number.
func (ca *CA) Leaf(tb testing.TB, serial int64) Pair {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "sluice-injector.sluice-system.svc"},
		DNSNames:     []string{"localhost", "sluice-injector.sluice-system.svc"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	return Pair{
		Cert:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:    pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
		Serial: big.NewInt(serial),
	}
}

// Volume is a directory laid out as the kubelet lays out a Secret volume:
// tls.crt and tls.key are symlinks into ..data, itself a symlink to a
// timestamped directory that each update replaces whole.
type Volume struct {
	Dir string
	n   int
}

// NewVolume makes an empty volume in a temporary directory.
func NewVolume(tb testing.TB) *Volume {
	return &Volume{Dir: tb.TempDir()}
}

// Serving makes a CA and a volume holding a pair it issued with serial.
func Serving(tb testing.TB, serial int64) (*CA, *Volume) {
	tb.Helper()
	ca, vol := NewCA(tb), NewVolume(tb)
	p := ca.Leaf(tb, serial)
	vol.Write(tb, p.Cert, p.Key)
	return ca, vol
}

// CertFile and KeyFile are the paths the injector is given.
func (v *Volume) CertFile() string { return filepath.Join(v.Dir, "tls.crt") }
func (v *Volume) KeyFile() string  { return filepath.Join(v.Dir, "tls.key") }

// Write publishes cert and key as the kubelet does: both are written into a
// new directory, then a symlink to it is renamed over ..data, so a reader
// sees the old pair or the new one, never half of each.
func (v *Volume) Write(tb testing.TB, cert, key []byte) {
	tb.Helper()
	v.n++
	ts := fmt.Sprintf("..2026_12_01_00_00_%02d.%d", v.n, v.n)
	if err := os.Mkdir(filepath.Join(v.Dir, ts), 0o755); err != nil {
		tb.Fatal(err)
	}
	for name, b := range map[string][]byte{"tls.crt": cert, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(v.Dir, ts, name), b, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		tb.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		tb.Fatal(err)
	}
	for _, name := range []string{"tls.crt", "tls.key"} {
		link := filepath.Join(v.Dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			tb.Fatal(err)
		}
	}
}

// Client is an HTTPS client trusting only pool, keeping connections alive.
func Client(pool *x509.CertPool) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		MaxIdleConnsPerHost: 4,
	}}
}

// ServedSerial opens a new TLS connection to addr (host:port) trusting
// only pool and returns the serial number of the certificate it presents.
func ServedSerial(addr string, pool *x509.CertPool) (*big.Int, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber, nil
}

// DeploymentPod is the pod a ReplicaSet of Deployment "web" creates in
// namespace "shop", as the API server has it when it calls mutating
// webhooks: the service account admission plugin has added its token
// volume already. annotations are added to the pod's.
func DeploymentPod(annotations map[string]string) *corev1.Pod {
	ann := map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-12-01T10:00:00Z"}
	for k, v := range annotations {
		ann[k] = v
	}
	yes := true
	expiry := int64(3607)
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "web-7d9f8c6b5d-",
			Namespace:    "shop",
			Labels:       map[string]string{"app": "web", "pod-template-hash": "7d9f8c6b5d", "sluice.io/inject": "true"},
			Annotations:  ann,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7d9f8c6b5d",
				UID: "0b0b3a6e-61a4-4c8e-9c53-8e7f3d2f5a10", Controller: &yes, BlockOwnerDeletion: &yes,
			}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "web",
				Image: "registry.example.com/shop/web:1.42.0",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
				Env: []corev1.EnvVar{
					{Name: "SLUICE_URL", Value: "http://127.0.0.1:8700"},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}},
					PeriodSeconds: 5, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3},
				VolumeMounts:             []corev1.VolumeMount{{Name: "kube-api-access-x7k2p", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				TerminationMessagePath:   "/dev/termination-log",
				TerminationMessagePolicy: corev1.TerminationMessageReadFile,
				ImagePullPolicy:          corev1.PullIfNotPresent,
			}},
			Volumes: []corev1.Volume{{Name: "kube-api-access-x7k2p", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &expiry}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
						Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				},
			}}}},
			RestartPolicy:                 corev1.RestartPolicyAlways,
			DNSPolicy:                     corev1.DNSClusterFirst,
			ServiceAccountName:            "web",
			SecurityContext:               &corev1.PodSecurityContext{},
			SchedulerName:                 corev1.DefaultSchedulerName,
			Tolerations:                   []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
			EnableServiceLinks:            &yes,
			PreemptionPolicy:              func() *corev1.PreemptionPolicy { p := corev1.PreemptLowerPriority; return &p }(),
			TerminationGracePeriodSeconds: func() *int64 { s := int64(30); return &s }(),
		},
	}
}

// Review is the AdmissionReview request the API server sends for creating
// pod, with the given uid.
func Review(tb testing.TB, uid string, pod *corev1.Pod) []byte {
	tb.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		tb.Fatal(err)
	}
	opts, err := json.Marshal(metav1.CreateOptions{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "CreateOptions"}})
	if err != nil {
		tb.Fatal(err)
	}
	no := false
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID(uid), Kind: gvk, Resource: gvr, RequestKind: &gvk, RequestResource: &gvr,
			Namespace: pod.Namespace, Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller",
				UID: "5c2a1e3d-0f7b-4d61-a0f5-2b6c9e8d7a41", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}},
			Object:  runtime.RawExtension{Raw: raw},
			DryRun:  &no,
			Options: runtime.RawExtension{Raw: opts},
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// DecodeResponse decodes an AdmissionReview answer strictly (unknown
// fields are errors) and checks it is a v1 AdmissionReview with a response.
func DecodeResponse(body []byte) (*admissionv1.AdmissionReview, error) {
	var ar admissionv1.AdmissionReview
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ar); err != nil {
		return nil, fmt.Errorf("decode answer %.200q: %w", body, err)
	}
	if ar.APIVersion != "admission.k8s.io/v1" || ar.Kind != "AdmissionReview" || ar.Response == nil {
		return nil, fmt.Errorf("not an admission.k8s.io/v1 AdmissionReview answer: %.200q", body)
	}
	return &ar, nil
}

// MovedByOne checks that exactly one result's count of reviews moved
// between two readings, by one, and returns that result.
func MovedByOne(tb testing.TB, before, after map[string]float64) string {
	tb.Helper()
	var moved []string
	for r, v := range after {
		if v != before[r] {
			moved = append(moved, fmt.Sprintf("%s%+g", r, v-before[r]))
		}
	}
	if len(moved) != 1 || !strings.HasSuffix(moved[0], "+1") {
		tb.Fatalf("reviews moved %v, want one result by one", moved)
	}
	return strings.TrimSuffix(moved[0], "+1")
}

// BadPairs writes, in a new temporary directory, what start-up must refuse
// next to a good pair: a.crt and a.key (a pair), b.key (another pair's
// key), garbage.crt (not PEM). It returns the directory.
func BadPairs(tb testing.TB) string {
	tb.Helper()
	ca := NewCA(tb)
	a, b := ca.Leaf(tb, 1), ca.Leaf(tb, 2)
	dir := tb.TempDir()
	for name, data := range map[string][]byte{"a.crt": a.Cert, "a.key": a.Key, "b.key": b.Key, "garbage.crt": []byte("not PEM")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}
