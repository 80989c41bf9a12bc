package helm_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
)

// The admin server's bearer token and TLS (config admin.token, admin.tls):
// the chart reads them from the configuration it renders, the one source
// of truth for the probes, the ServiceMonitor and NOTES.txt.

const (
	adminTLSDir = "/etc/jetbridge-admin-tls"
	// adminTLSValues names a certificate and key where a kubernetes.io/tls
	// Secret mounted at adminTLSDir puts them.
	adminTLSValues = `
config:
  admin:
    tls:
      cert_file: /etc/jetbridge-admin-tls/tls.crt
      key_file: /etc/jetbridge-admin-tls/tls.key
`
	// testAdminToken is long enough for bridge check (16 characters).
	testAdminToken = "0123456789abcdef0123456789abcdef"
)

// writeTestCert writes a self-signed certificate for dnsName and its key
// as tls.crt and tls.key (the keys of a kubernetes.io/tls Secret) in dir.
func writeTestCert(t *testing.T, dir, dnsName string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: dnsName},
		DNSNames:              []string{dnsName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestAdminTLSProbes(t *testing.T) {
	// With admin.tls the probes are HTTPS...
	r := mustRender(t, adminTLSValues)
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTPS))
	requireNone(t, "container", checkContainer(r, "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil))
	// ...with the other admin port too...
	r = mustRender(t, adminTLSValues+"    listen: \":9443\"\n")
	requireNone(t, "probes on 9443", checkProbes(r, 9443, corev1.URISchemeHTTPS))
	// ...and HTTP without it, or with both files empty (the bridge's
	// "no TLS"), or with only admin.token (the probes' paths are open).
	for _, v := range []string{"", "config: {admin: {tls: {cert_file: \"\", key_file: \"\"}}}\n", "config: {admin: {token: \"${ADMIN_TOKEN}\"}}\n"} {
		requireNone(t, "probes with "+strings.TrimSpace(v), checkProbes(mustRender(t, v), 8088, corev1.URISchemeHTTP))
	}
}

// tokenMonitorValues: the ServiceMonitor and the token, from existingSecret.
const tokenMonitorValues = `
existingSecret: jetbridge-env
serviceMonitor: {enabled: true}
prometheusRule: {enabled: true}
config:
  admin:
    token: "${ADMIN_TOKEN}"
`

// tlsMonitorValues: the same with admin.tls and the CA of the
// certificate's Secret.
const tlsMonitorValues = `
existingSecret: jetbridge-env
serviceMonitor:
  enabled: true
  tlsConfig:
    ca: {secret: {name: jetbridge-admin-tls, key: ca.crt}}
prometheusRule: {enabled: true}
` + adminTLSValues + `    token: "${ADMIN_TOKEN}"
`

func caSecret(name, key string) *monitoringv1.SecretOrConfigMap {
	return &monitoringv1.SecretOrConfigMap{Secret: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

func caConfigMap(name, key string) *monitoringv1.SecretOrConfigMap {
	return &monitoringv1.SecretOrConfigMap{ConfigMap: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}
}

// requireNotesLines: NOTES.txt has these lines, each exactly.
func requireNotesLines(t *testing.T, r *rendered, lines ...string) {
	t.Helper()
	have := strings.Split(r.notes, "\n")
	for _, l := range lines {
		if !slices.Contains(have, l) {
			t.Errorf("NOTES.txt has no line %q:\n%s", l, r.notes)
		}
	}
}

func TestServiceMonitorAdminToken(t *testing.T) {
	alerts := chartAlerts(t)
	// The token from existingSecret, at the default key.
	r := mustRender(t, tokenMonitorValues)
	requireNone(t, "monitoring", checkMonitoring(r, &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN"}, alerts))
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTP))
	requireNotesLines(t, r,
		`  ADMIN_TOKEN="$(kubectl -n events get secret jetbridge-env -o jsonpath='{.data.ADMIN_TOKEN}' | base64 -d)"`,
		`  curl -s -H "Authorization: Bearer $ADMIN_TOKEN" http://127.0.0.1:8088/status`)

	// From the Secret the chart makes of secretEnv.
	r = mustRender(t, secretEnvValues+"  ADMIN_TOKEN: "+testAdminToken+"\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\nconfig: {admin: {token: \"${ADMIN_TOKEN}\"}}\n")
	requireNone(t, "monitoring with secretEnv", checkMonitoring(r, &monitoring{interval: "30s", tokenSecret: "jetbridge", tokenKey: "ADMIN_TOKEN"}, alerts))
	requireNone(t, "secretEnv", checkSecretEnv(r, "jetbridge", []string{"ADMIN_TOKEN", "DESTINATION_URL", "NATS_URL"}))
	if strings.Contains(r.notes, testAdminToken) || strings.Contains(r.manifest[:strings.Index(r.manifest, "kind: Secret")], testAdminToken) {
		t.Error("the token shows outside the Secret")
	}

	// Another key, named by adminToken.secretKey and by the reference.
	r = mustRender(t, "existingSecret: jetbridge-env\nadminToken: {secretKey: BRIDGE_ADMIN_TOKEN}\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\nconfig: {admin: {token: \"${BRIDGE_ADMIN_TOKEN}\"}}\n")
	requireNone(t, "monitoring with another key", checkMonitoring(r, &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "BRIDGE_ADMIN_TOKEN"}, alerts))

	// A token read from a file: the chart cannot compare the key with the
	// reference, and sends adminToken.secretKey of the Secret.
	r = mustRender(t, "existingSecret: jetbridge-env\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\nconfig: {admin: {token: \"${file:/run/secrets/admin-token}\"}}\n")
	requireNone(t, "monitoring with ${file:}", checkMonitoring(r, &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN"}, alerts))

	// A key YAML would read as a number stays a string.
	r = mustRender(t, "existingSecret: jetbridge-env\nadminToken: {secretKey: \"0123\"}\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\nconfig: {admin: {token: \"${file:/run/secrets/admin-token}\"}}\n")
	requireNone(t, "monitoring with a numeric key", checkMonitoring(r, &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "0123"}, alerts))

	// Without the token in the configuration, no credentials, whatever
	// adminToken says.
	r = mustRender(t, "existingSecret: jetbridge-env\nadminToken: {secretKey: X}\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n")
	requireNone(t, "monitoring without a token", checkMonitoring(r, &monitoring{interval: "30s"}, alerts))
	requireNotesLines(t, r, "  curl -s http://127.0.0.1:8088/status")
}

func TestServiceMonitorAdminTLS(t *testing.T) {
	alerts := chartAlerts(t)
	// The token and TLS: https, the token, the CA from the certificate's
	// Secret, the Service's DNS name.
	r := mustRender(t, tlsMonitorValues)
	requireNone(t, "monitoring", checkMonitoring(r, &monitoring{
		interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN",
		ca: caSecret("jetbridge-admin-tls", "ca.crt"), serverName: "jetbridge.events.svc",
	}, alerts))
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTPS))
	requireNotesLines(t, r,
		"The admin endpoints (/status, /metrics, /healthz, /readyz) on port 8088, HTTPS only:",
		`  curl -s --cacert ca.crt --resolve jetbridge.events.svc:8088:127.0.0.1 -H "Authorization: Bearer $ADMIN_TOKEN" https://jetbridge.events.svc:8088/status`)

	// TLS alone, the CA from a ConfigMap, a server name of its own, in a
	// release with another full name.
	r = mustRender(t, "fullnameOverride: events-bridge\nserviceMonitor:\n  enabled: true\n  tlsConfig:\n    ca: {configMap: {name: internal-ca, key: ca.pem}}\n    serverName: bridge.example.internal\nprometheusRule: {enabled: true}\n"+adminTLSValues)
	requireNone(t, "monitoring, TLS alone", checkMonitoring(r, &monitoring{
		interval: "30s", ca: caConfigMap("internal-ca", "ca.pem"), serverName: "bridge.example.internal",
	}, alerts))
	requireNotesLines(t, r, "  curl -s --cacert ca.crt --resolve bridge.example.internal:8088:127.0.0.1 https://bridge.example.internal:8088/status")

	// The default server name follows the full name.
	r = mustRender(t, "fullnameOverride: events-bridge\nserviceMonitor: {enabled: true, tlsConfig: {ca: {secret: {name: s, key: tls.crt}}}}\nprometheusRule: {enabled: true}\n"+adminTLSValues)
	requireNone(t, "monitoring, default server name", checkMonitoring(r, &monitoring{
		interval: "30s", ca: caSecret("s", "tls.crt"), serverName: "events-bridge.events.svc",
	}, alerts))

	// A CA without admin.tls in the configuration: plain http, no tlsConfig.
	r = mustRender(t, "serviceMonitor: {enabled: true, tlsConfig: {ca: {secret: {name: s, key: tls.crt}}}}\nprometheusRule: {enabled: true}\n")
	requireNone(t, "monitoring, a CA without admin.tls", checkMonitoring(r, &monitoring{interval: "30s"}, alerts))
}

// TestAdminRefusals: what would leave the ServiceMonitor unable to scrape
// is refused at render time with the value to set; the same configuration
// without the ServiceMonitor renders.
func TestAdminRefusals(t *testing.T) {
	const sm = "serviceMonitor: {enabled: true}\n"
	for values, want := range map[string]string{
		"config: {admin: {token: \"${ADMIN_TOKEN}\"}}\n":                                "config.admin.token is set and serviceMonitor.enabled: Prometheus sends the token from a Secret key, and no Secret is set: set existingSecret (a Secret with the key ADMIN_TOKEN) or secretEnv.ADMIN_TOKEN",
		secretEnvValues + "config: {admin: {token: \"${ADMIN_TOKEN}\"}}\n":              "config.admin.token is set and serviceMonitor.enabled: Prometheus sends the token from a Secret key, and secretEnv has no key ADMIN_TOKEN (adminToken.secretKey)",
		"existingSecret: jetbridge-env\nconfig: {admin: {token: \"${OTHER_TOKEN}\"}}\n": "the bridge reads the token from ${OTHER_TOKEN}, but the ServiceMonitor would send key ADMIN_TOKEN of Secret jetbridge-env: set adminToken.secretKey: OTHER_TOKEN",
		"existingSecret: jetbridge-env\n" + adminTLSValues:                              "config.admin.tls is set and serviceMonitor.enabled: Prometheus verifies the admin certificate; set serviceMonitor.tlsConfig.ca.secret (or .configMap)",
	} {
		if _, err := render(sm + values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: render error %v, want one containing %q", sm+values, err, want)
		}
		// Control: without the ServiceMonitor, the same values render.
		if _, err := render(values); err != nil {
			t.Errorf("values %q without the ServiceMonitor: %v", values, err)
		}
	}
	// values.schema.json
	for values, want := range map[string]string{
		"serviceMonitor: {tlsConfig: {ca: {secret: {name: a, key: b}, configMap: {name: a, key: b}}}}\n": "at '/serviceMonitor/tlsConfig/ca': maxProperties: got 2, want 1",
		"serviceMonitor: {tlsConfig: {ca: {secret: {name: a}}}}\n":                                       "at '/serviceMonitor/tlsConfig/ca/secret': missing property 'key'",
		"serviceMonitor: {tlsConfig: {ca: {file: /ca.crt}}}\n":                                           "additional properties 'file' not allowed",
		"serviceMonitor: {tlsConfig: {servername: x}}\n":                                                 "additional properties 'servername' not allowed",
		"adminToken: {secretKey: \"ADMIN TOKEN\"}\n":                                                     "at '/adminToken/secretKey'",
		"adminToken: {key: ADMIN_TOKEN}\n":                                                               "additional properties 'key' not allowed",
	} {
		if _, err := render(values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: render error %v, want one containing %q", values, err, want)
		}
	}
}
