package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// adminServiceName is the name the test certificates carry: a service's,
// not 127.0.0.1, as in a pod.
const adminServiceName = "jetbridge.events.svc"

// writeAdminCert writes a self-signed ECDSA server certificate for
// adminServiceName and its key as PEM files in a new directory.
func writeAdminCert(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: adminServiceName},
		DNSNames:     []string{adminServiceName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
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
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// adminTLSYAML is admin.tls with the given files, under admin:.
func adminTLSYAML(certFile, keyFile string) string {
	return fmt.Sprintf("  tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)
}

// tlsClient trusts only the certificate in certFile, for
// adminServiceName; nothing is skipped.
func tlsClient(t testing.TB, certFile string, maxVersion uint16) *http.Client {
	t.Helper()
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		t.Fatal("no certificate in " + certFile)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: adminServiceName, MinVersion: tls.VersionTLS10, MaxVersion: maxVersion,
	}}}
}

// With admin.tls the admin server speaks HTTPS only (TLS 1.2 and later),
// with the token checks unchanged; bridge healthcheck --config checks it
// over https://, verifying the configured certificate.
func TestAdminTLS(t *testing.T) {
	t.Setenv("JB_TEST_ADMIN_TOKEN", adminTokenCanary)
	certFile, keyFile := writeAdminCert(t)
	srv := natstest.Start(t)
	sink := sinktest.New(t, sinktest.Always(200))
	yaml := withAdminToken(daemonYAML(srv.URL(), natstest.Creds{}, freePort(t), sink.URL()), adminTLSYAML(certFile, keyFile))
	d := startDaemon(t, yaml)
	base := "https://" + d.admin
	client := tlsClient(t, certFile, 0)
	if err := waitFor(daemonReady, func() error {
		code, _, body, err := adminGet(client, base, "/readyz", "")
		if err != nil || code != 200 {
			return fmt.Errorf("/readyz over https = %d %s %v", code, body, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tokenCheck(client, base, true); err != nil {
		t.Fatal(err)
	}
	// Plain HTTP is refused (net/http's 400 to an HTTP request on a TLS
	// port): no endpoint is served in clear.
	if code, body := get(d.admin, "/metrics"); code != http.StatusBadRequest || !strings.Contains(body, "HTTPS") {
		t.Errorf("plain http to the TLS port: %d %s, want 400", code, body)
	}
	// TLS 1.1 is refused; a client that does not trust the certificate
	// fails.
	if _, _, _, err := adminGet(tlsClient(t, certFile, tls.VersionTLS11), base, "/healthz", ""); err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("TLS 1.1: %v, want a protocol version error", err)
	}
	if _, _, _, err := adminGet(&http.Client{}, base, "/healthz", ""); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client that does not trust the certificate: %v, want a certificate error", err)
	}

	// bridge healthcheck --config: https://, verified, exit 0.
	cfgFile := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runBridge(t, "healthcheck", "--config", cfgFile)
	if want := "healthy: GET https://" + d.admin + "/healthz answered 200\n"; r.code != 0 || r.stdout != want || r.stderr != "" {
		t.Errorf("healthcheck over TLS: want exit 0 and %q, got %s", want, r)
	}
	// The same with admin.listen on every interface (read as 127.0.0.1).
	_, port, _ := strings.Cut(d.admin, ":")
	wild := filepath.Join(t.TempDir(), "wild.yaml")
	if err := os.WriteFile(wild, []byte(strings.Replace(yaml, "listen: "+d.admin, "listen: 0.0.0.0:"+port, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runBridge(t, "healthcheck", "--config", wild); r.code != 0 || r.stdout != "healthy: GET https://127.0.0.1:"+port+"/healthz answered 200\n" {
		t.Errorf("healthcheck over TLS, admin.listen 0.0.0.0: %s", r)
	}
	if strings.Contains(d.logs.String(), adminTokenCanary) {
		t.Fatal("the admin token appears in the logs")
	}

	// Negative controls. The healthcheck as it was (plain http://)
	// fails against the TLS server: the fix is what makes it pass.
	expectBrokenMain(t, "healthcheck over plain http", func(t testing.TB) error {
		return checkHealth(context.Background(), "http://"+d.admin+"/healthz", nil, 2*time.Second, new(strings.Builder))
	})
	// An impostor on the configured address, with its own certificate
	// for the same name, fails the healthcheck: the server is verified,
	// not merely reached over TLS.
	expectBrokenMain(t, "impostor certificate", func(t testing.TB) error {
		otherCert, otherKey := writeAdminCert(t)
		tc, err := adminTLSConfig(configAdminTLS(otherCert, otherKey), zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		addr := freePort(t)
		stop, err := serveAdminTLS(addr, tc, newAdminSwitch(prometheus.NewRegistry()), zerolog.Nop(), defaultAdminTimeouts)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		impostor := filepath.Join(t.TempDir(), "impostor.yaml")
		if err := os.WriteFile(impostor, []byte(strings.Replace(yaml, "listen: "+d.admin, "listen: "+addr, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		r := runBridge(t.(*testing.T), "healthcheck", "--config", impostor)
		if r.code != 0 {
			if !strings.Contains(r.stderr, "certificate signed by unknown authority") {
				t.Errorf("impostor refused, but not for its certificate: %s", r)
			}
			return fmt.Errorf("exit %d: %s", r.code, strings.TrimSpace(r.stderr))
		}
		return nil
	})
}

// A missing or unusable certificate is a configuration error naming the
// key, in bridge check and at the start of bridge run (exit 2).
func TestAdminTLSFilesChecked(t *testing.T) {
	certFile, keyFile := writeAdminCert(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.crt")
	write := func(name, admin string) string {
		p := filepath.Join(dir, name)
		yaml := "admin:\n  listen: 127.0.0.1:0\n" + admin + "destinations:\n  hook: {url: http://127.0.0.1:9/x}\nroutes:\n  - {name: r, subjects: [\"events.>\"], destination: hook}\n"
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", adminTLSYAML(certFile, keyFile))
	if r := runBridge(t, "check", "--config", good); r.code != 0 || r.stderr != "" {
		t.Errorf("valid admin.tls: %s", r)
	}
	bad := write("bad.yaml", "  tls:\n    cert_file: "+missing+"\n    key_file: "+keyFile+"\n")
	want := "bridge: " + bad + ":4: admin.tls.cert_file: cannot read \"" + missing + "\": no such file or directory\n"
	for _, cmd := range []string{"check", "run"} {
		if r := runBridge(t, cmd, "--config", bad); r.code != 2 || r.stderr != want {
			t.Errorf("bridge %s with a missing certificate: want exit 2 and %q, got %s", cmd, want, r)
		}
	}
	onlyCert := write("only.yaml", "  tls:\n    cert_file: "+certFile+"\n")
	if r := runBridge(t, "check", "--config", onlyCert); r.code != 2 || r.stderr != "bridge: "+onlyCert+":3: admin.tls.key_file: is required when admin.tls.cert_file is set\n" {
		t.Errorf("cert_file without key_file: %s", r)
	}
}

func configAdminTLS(certFile, keyFile string) config.AdminTLS {
	return config.AdminTLS{CertFile: certFile, KeyFile: keyFile}
}

// servedCert is the DER of the certificate the TLS server at addr
// presents, verified against the certificates of trusted.
func servedCert(t testing.TB, addr string, trusted ...string) ([]byte, error) {
	t.Helper()
	pool := x509.NewCertPool()
	for _, f := range trusted {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(data)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: adminServiceName, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw, nil
}

// pemDER is the DER of the first certificate of a PEM file.
func pemDER(t testing.TB, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM in " + file)
	}
	return block.Bytes
}

// replaceFile swaps dst for a copy of src, as a Secret volume does
// (write aside, rename), dated a second later than dst so that the
// change shows whatever the file system's time granularity.
func replaceFile(t testing.TB, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	later := fi.ModTime().Add(time.Second)
	if err := os.Chtimes(tmp, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// A renewed certificate (both files replaced) is served from the next
// handshake on, without a restart; a replacement that does not load is
// logged and the previous certificate stays in use.
func TestAdminCertReload(t *testing.T) {
	check := func(t testing.TB, build func(config.AdminTLS, zerolog.Logger) (*tls.Config, error)) error {
		certA, keyA := writeAdminCert(t)
		certB, keyB := writeAdminCert(t) // in a directory of its own
		logs := &natstest.Buffer{}
		tc, err := build(configAdminTLS(certA, keyA), zerolog.New(logs))
		if err != nil {
			t.Fatal(err)
		}
		addr := freePort(t)
		stop, err := serveAdminTLS(addr, tc, newAdminSwitch(prometheus.NewRegistry()), zerolog.Nop(), defaultAdminTimeouts)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		wantA := pemDER(t, certA)
		if got, err := servedCert(t, addr, certA); err != nil || string(got) != string(wantA) {
			t.Fatalf("before the renewal: %v, or not certificate A", err)
		}
		wantB := pemDER(t, certB)
		replaceFile(t, keyB, keyA)
		replaceFile(t, certB, certA)
		got, err := servedCert(t, addr, certB)
		if err != nil {
			return fmt.Errorf("after the renewal: %w", err)
		}
		if string(got) != string(wantB) {
			return errors.New("after the renewal the server still presents the old certificate")
		}
		if !strings.Contains(logs.String(), `"message":"admin certificate reloaded"`) {
			t.Errorf("no log line for the reload:\n%s", logs)
		}
		// A broken replacement: B stays, one warning.
		if err := os.WriteFile(certA, []byte("half written"), 0o600); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if got, err := servedCert(t, addr, certB); err != nil || string(got) != string(wantB) {
				t.Errorf("with a broken certificate file: %v, or not the previous certificate", err)
			}
		}
		if n := strings.Count(logs.String(), "admin certificate changed but does not load"); n != 1 {
			t.Errorf("%d warnings for the broken file, want 1:\n%s", n, logs)
		}
		return nil
	}
	if err := check(t, adminTLSConfig); err != nil {
		t.Fatal(err)
	}
	expectBrokenMain(t, "certificate loaded once at start", func(t testing.TB) error {
		return check(t, func(files config.AdminTLS, _ zerolog.Logger) (*tls.Config, error) {
			pair, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
			return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}, err
		})
	})
}
