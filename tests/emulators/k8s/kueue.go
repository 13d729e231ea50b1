package main

// Kueue (sigs.k8s.io/kueue, built from source by build-kueue.sh into a
// binary of its own: it needs k8s.io libraries v0.35 where this module pins
// v0.37) as one more child process of serve:
//
//   - its CRDs, from the module source that build-kueue.sh copied beside the
//     binary (kueue-config/crd), applied with this module's dynamic client;
//     the five with a conversion webhook point it at Kueue's /convert;
//   - its webhook configurations (kueue-config/webhook/manifests.yaml), cut
//     down to the webhooks for Kueue's own kinds and pods (the integrations
//     enabled here; a webhook nobody serves with failurePolicy Fail would
//     refuse every Deployment, Job, ...), each pointed by URL at Kueue's
//     webhook server on https://127.0.0.1:PORT;
//   - certificates: Kueue without its internal certificate management reads
//     its metrics certificate from a fixed /etc/kueue/metrics/certs and exits
//     when it is not there, so the internal management stays on and is handed
//     what it would have made: the Secret kueue-system/kueue-webhook-server-cert
//     with an RSA CA named kueue-ca and a serving certificate for both
//     kueue-webhook-service.kueue-system.svc (what its rotator checks) and
//     127.0.0.1 (what the apiserver dials), the same files in webhook.certDir
//     (where a kubelet would have mounted the Secret). The rotator finds them
//     valid, keeps them, and injects that CA into the webhook configurations
//     and CRDs, which already carry it;
//   - a Configuration: the pod integration only (pod groups), leader election
//     off, metrics off, the visibility server off (it would bind :8082),
//     health probes and webhook on free loopback ports; the admin kubeconfig.
//
// serve says READY once Kueue's readyz answers and a dry-run ResourceFlavor
// passes its webhooks through the apiserver.

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

const (
	kueueNamespace  = "kueue-system"
	kueueService    = "kueue-webhook-service"
	kueueSecret     = "kueue-webhook-server-cert"
	kueueMutating   = "kueue-mutating-webhook-configuration"
	kueueValidating = "kueue-validating-webhook-configuration"
)

var (
	crdGVR        = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	mutatingGVR   = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}
	validatingGVR = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
	flavorGVR     = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
)

// kueueConversionCRDs: the CRDs Kueue's kustomization gives a conversion
// webhook, and whose caBundle its rotator injects (it fails when one has
// no webhook clientConfig).
var kueueConversionCRDs = map[string]bool{
	"localqueues.kueue.x-k8s.io": true, "clusterqueues.kueue.x-k8s.io": true,
	"workloads.kueue.x-k8s.io": true, "cohorts.kueue.x-k8s.io": true,
	"multikueueclusters.kueue.x-k8s.io": true,
}

// readYAMLDocs: every object of a multi-document YAML file.
func readYAMLDocs(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(obj) > 0 {
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
}

// kueueCerts makes the RSA CA and serving certificate Kueue's rotator
// accepts as its own; returns the PEMs (ca.crt, ca.key, tls.crt, tls.key).
func kueueCerts() (map[string][]byte, error) {
	caKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kueue-ca", Organization: []string{"kueue"}},
		DNSNames:              []string{"kueue-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	dns := kueueService + "." + kueueNamespace + ".svc"
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: dns},
		DNSNames:     []string{dns},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(5 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	enc := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	return map[string][]byte{
		"ca.crt":  enc("CERTIFICATE", caDER),
		"ca.key":  enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(caKey)),
		"tls.crt": enc("CERTIFICATE", der),
		"tls.key": enc("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)),
	}, nil
}

// startKueue: everything above, then the child process, then the wait.
func (h *harness) startKueue(bin string, say func(string)) error {
	t0 := time.Now()
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("kueue: %w", err)
	}
	cfgDir := filepath.Join(filepath.Dir(bin), "kueue-config")
	if _, err := os.Stat(filepath.Join(cfgDir, "webhook", "manifests.yaml")); err != nil {
		return fmt.Errorf("kueue: its manifests are not beside the binary (build-kueue.sh copies them): %w", err)
	}
	dyn, err := dynamic.NewForConfig(h.restConfig)
	if err != nil {
		return err
	}
	webhookPort, err := freePort()
	if err != nil {
		return err
	}
	healthPort, err := freePort()
	if err != nil {
		return err
	}
	base := fmt.Sprintf("https://127.0.0.1:%d", webhookPort)

	certs, err := kueueCerts()
	if err != nil {
		return fmt.Errorf("kueue certificates: %w", err)
	}
	certDir := filepath.Join(h.dir, "kueue", "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	for name, b := range certs {
		if err := os.WriteFile(filepath.Join(certDir, name), b, 0o600); err != nil {
			return err
		}
	}
	if _, err := h.client.CoreV1().Namespaces().Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kueueNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("namespace %s: %w", kueueNamespace, err)
	}
	if _, err := h.client.CoreV1().Secrets(kueueNamespace).Create(h.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: kueueSecret, Namespace: kueueNamespace},
		Data:       certs,
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("secret %s: %w", kueueSecret, err)
	}
	caBundle := certs["ca.crt"]

	// CRDs.
	crdFiles, err := filepath.Glob(filepath.Join(cfgDir, "crd", "*.yaml"))
	if err != nil || len(crdFiles) == 0 {
		return fmt.Errorf("kueue: no CRDs in %s", filepath.Join(cfgDir, "crd"))
	}
	sort.Strings(crdFiles)
	var crdNames []string
	for _, f := range crdFiles {
		docs, err := readYAMLDocs(f)
		if err != nil {
			return err
		}
		for _, crd := range docs {
			if crd.GetKind() != "CustomResourceDefinition" {
				continue
			}
			if kueueConversionCRDs[crd.GetName()] {
				_ = unstructured.SetNestedMap(crd.Object, map[string]any{
					"strategy": "Webhook",
					"webhook": map[string]any{
						"clientConfig": map[string]any{
							"url":      base + "/convert",
							"caBundle": base64.StdEncoding.EncodeToString(caBundle),
						},
						"conversionReviewVersions": []any{"v1"},
					},
				}, "spec", "conversion")
			}
			if _, err := dyn.Resource(crdGVR).Create(h.ctx, crd, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("CRD %s: %w", crd.GetName(), err)
			}
			crdNames = append(crdNames, crd.GetName())
		}
	}
	if err := waitCRDsEstablished(h, dyn, crdNames, 60*time.Second); err != nil {
		return err
	}

	// Webhook configurations.
	docs, err := readYAMLDocs(filepath.Join(cfgDir, "webhook", "manifests.yaml"))
	if err != nil {
		return err
	}
	for _, doc := range docs {
		var gvr schema.GroupVersionResource
		switch doc.GetKind() {
		case "MutatingWebhookConfiguration":
			gvr = mutatingGVR
			doc.SetName(kueueMutating)
		case "ValidatingWebhookConfiguration":
			gvr = validatingGVR
			doc.SetName(kueueValidating)
		default:
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(doc.Object, "webhooks")
		var kept []any
		for _, x := range hooks {
			hook := x.(map[string]any)
			if !kueueHookServed(hook) {
				continue
			}
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{"url": base + path, "caBundle": base64.StdEncoding.EncodeToString(caBundle)}
			if kueueHookOnPods(hook) {
				// What Kueue's kustomization patches in: never its own
				// namespace nor kube-system.
				hook["namespaceSelector"] = map[string]any{"matchExpressions": []any{map[string]any{
					"key": "kubernetes.io/metadata.name", "operator": "NotIn",
					"values": []any{"kube-system", kueueNamespace},
				}}}
			}
			kept = append(kept, hook)
		}
		if len(kept) == 0 {
			return fmt.Errorf("kueue: no webhook left in %s", doc.GetKind())
		}
		_ = unstructured.SetNestedSlice(doc.Object, kept, "webhooks")
		if _, err := dyn.Resource(gvr).Create(h.ctx, doc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("%s: %w", doc.GetKind(), err)
		}
	}

	// The Configuration and the process.
	config := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: %s
  webhookSecretName: %s
clientConnection:
  qps: 200
  burst: 400
featureGates:
  VisibilityOnDemand: false
integrations:
  frameworks:
  - pod
`, kueueNamespace, healthPort, webhookPort, certDir, kueueService, kueueSecret)
	cfgPath := filepath.Join(h.dir, "kueue", "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(h.dir, "logs", "kueue.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--config="+cfgPath, "--zap-log-level=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "KUBECONFIG="+h.kubeconfig)
	cmd.Dir = filepath.Join(h.dir, "kueue")
	if err := h.startProcess("kueue", cmd, logf); err != nil {
		return err
	}

	// Ready: readyz (webhook server started, certificates in place), then
	// a dry-run ResourceFlavor through the apiserver (its webhooks answer).
	deadline := time.Now().Add(120 * time.Second)
	readyz := fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort)
	var last error
	for {
		if h.ctx.Err() != nil {
			return errors.New("kueue exited before it was ready; see " + logPath)
		}
		last = kueueAnswers(h, dyn, readyz)
		if last == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kueue not ready within 120 s: %v (log: %s)", last, logPath)
		}
		time.Sleep(300 * time.Millisecond)
	}
	say(fmt.Sprintf("kueue ready, webhooks on %s (%.1fs)", base, time.Since(t0).Seconds()))
	return nil
}

func kueueAnswers(h *harness, dyn dynamic.Interface, readyz string) error {
	resp, err := http.Get(readyz)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	rf := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
		"metadata": map[string]any{"name": "harness-readiness-probe"},
	}}
	_, err = dyn.Resource(flavorGVR).Create(h.ctx, rf, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// kueueHookServed: a webhook of Kueue's own kinds or of pods (the pod
// integration); the other integrations are not enabled, so nothing serves
// their paths.
func kueueHookServed(hook map[string]any) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, r := range rules {
		groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		for _, g := range groups {
			if g == "kueue.x-k8s.io" {
				return true
			}
		}
	}
	return kueueHookOnPods(hook)
}

func kueueHookOnPods(hook map[string]any) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, r := range rules {
		groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
		resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
		if len(groups) == 1 && groups[0] == "" && len(resources) == 1 && resources[0] == "pods" {
			return true
		}
	}
	return false
}

func waitCRDsEstablished(h *harness, dyn dynamic.Interface, names []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, name := range names {
		for {
			crd, err := dyn.Resource(crdGVR).Get(h.ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(crd) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s not Established within %v (%v)", name, limit, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func crdEstablished(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
