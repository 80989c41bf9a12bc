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
	"strings"
	"testing"
	"time"

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
