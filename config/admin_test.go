package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTestCert writes a self-signed ECDSA certificate for host and its
// key as PEM files in dir.
func writeTestCert(t *testing.T, dir, host string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, host+".crt"), filepath.Join(dir, host+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// The admin keys: a token (a Secret, never printed), and a certificate
// and key that must be set together, exist and parse; each error names
// the key and its line.
func TestAdminKeys(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeTestCert(t, dir, "jetbridge.events.svc")
	_, otherKey := writeTestCert(t, dir, "other.example")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	const token = "CANARY-admin-token-0123456789"
	env := map[string]string{"ADMIN_TOKEN": token, "SHORT": "CANARY-short", "SPACED": "CANARY with spaces in it", "CERT": missing}

	good := mustLoad(t, fmt.Sprintf("admin:\n  listen: 0.0.0.0:8088\n  token: ${ADMIN_TOKEN}\n  tls: {cert_file: %q, key_file: %q}\n", cert, key)+minimal, env)
	if good.Admin.Token.Value() != token || good.Admin.TLS.CertFile != cert || good.Admin.TLS.KeyFile != key || !good.Admin.TLS.Enabled() {
		t.Errorf("admin = %+v", good.Admin)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		if s := fmt.Sprintf(verb, good); strings.Contains(s, "CANARY") {
			t.Errorf("%s prints the admin token: %s", verb, s)
		}
	}
	if d := mustLoad(t, minimal, nil); d.Admin.Token != "" || d.Admin.TLS.Enabled() {
		t.Errorf("default admin = %+v, want no token and no TLS", d.Admin)
	}

	for _, tc := range []struct{ name, admin, want string }{
		{"short token", "  token: ${SHORT}\n",
			"test.yaml:2: admin.token: must be at least 16 characters: use a random value, e.g. from openssl rand -hex 32"},
		{"token with spaces", "  token: ${SPACED}\n",
			"test.yaml:2: admin.token: must be printable ASCII without spaces: it is sent as Authorization: Bearer <token>"},
		{"cert without key", fmt.Sprintf("  tls: {cert_file: %q}\n", cert),
			"test.yaml:2: admin.tls.key_file: is required when admin.tls.cert_file is set"},
		{"key without cert", fmt.Sprintf("  tls:\n    key_file: %q\n", key),
			"test.yaml:2: admin.tls.cert_file: is required when admin.tls.key_file is set"},
		{"missing cert", fmt.Sprintf("  tls:\n    cert_file: %q\n    key_file: %q\n", missing, key),
			fmt.Sprintf("test.yaml:3: admin.tls.cert_file: cannot read %q: no such file or directory", missing)},
		{"missing cert from a reference", fmt.Sprintf("  tls:\n    cert_file: ${CERT}\n    key_file: %q\n", key),
			"test.yaml:3: admin.tls.cert_file: cannot read the value of ${CERT}: no such file or directory"},
		{"missing key", fmt.Sprintf("  tls:\n    cert_file: %q\n    key_file: %q\n", cert, missing),
			fmt.Sprintf("test.yaml:4: admin.tls.key_file: cannot read %q: no such file or directory", missing)},
		{"not a certificate", fmt.Sprintf("  tls:\n    cert_file: %q\n    key_file: %q\n", garbage, key),
			fmt.Sprintf("test.yaml:3: admin.tls.cert_file: %q, %q: tls: failed to find any PEM data in certificate input", garbage, key)},
		{"not a key", fmt.Sprintf("  tls:\n    cert_file: %q\n    key_file: %q\n", cert, garbage),
			fmt.Sprintf("test.yaml:4: admin.tls.key_file: %q, %q: tls: failed to find any PEM data in key input", cert, garbage)},
		{"key of another certificate", fmt.Sprintf("  tls:\n    cert_file: %q\n    key_file: %q\n", cert, otherKey),
			fmt.Sprintf("test.yaml:4: admin.tls.key_file: %q, %q: tls: private key does not match public key", cert, otherKey)},
		{"unknown key", "  tls: {ca_file: x}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadWith([]byte("admin:\n"+tc.admin+minimal), "test.yaml", lookupIn(env))
			if err == nil {
				t.Fatal("loaded, want an error")
			}
			if tc.want != "" && err.Error() != tc.want {
				t.Errorf("error:\n%s\nwant:\n%s", err, tc.want)
			}
			if strings.Contains(err.Error(), "CANARY") {
				t.Errorf("the error prints the token: %s", err)
			}
		})
	}
}
