package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sotercare/jetbridge/internal/cli"
)

// defaultAdminPort is admin.listen's port in the example configurations
// and the container image (docs/deploy.md).
const defaultAdminPort = "8088"

func newHealthcheckCmd() *cobra.Command {
	var (
		configFile, target string
		timeout            time.Duration
	)
	c := &cobra.Command{
		Use:   "healthcheck",
		Short: "check a running bridge's /healthz: exit 0 when healthy, 1 when not",
		Long: `Check a running bridge: GET its /healthz and exit 0 on 200, 1 on anything
else (no answer within --timeout included). Made for container health
checks, which run it without a shell.

The address is --url, else admin.listen of --config (or $BRIDGE_CONFIG),
with a wildcard host (0.0.0.0, ::, or none) read as 127.0.0.1; with no
configuration at all, http://127.0.0.1:8088/healthz. With admin.tls the
check uses https:// and trusts exactly the configured certificate
(admin.tls.cert_file), for the host names it carries; an https:// --url
is verified against the system's roots.`,
		Example: `  bridge healthcheck                                   # $BRIDGE_CONFIG's admin.listen, else :8088
  bridge healthcheck --config config/quickstart.yaml
  bridge healthcheck --url http://127.0.0.1:8090/healthz`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			u := target
			var tc *tls.Config
			if u == "" {
				var err error
				if u, tc, err = healthURL(configFile, c.ErrOrStderr()); err != nil {
					return err
				}
			} else if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
				return usageErr("--url %q: want an http:// or https:// URL, e.g. http://127.0.0.1:8088/healthz", u)
			}
			if timeout <= 0 {
				return usageErr("--timeout must be positive, e.g. 2s")
			}
			return checkHealth(c.Context(), u, tc, timeout, c.OutOrStdout())
		},
	}
	configFlag(c.Flags(), &configFile)
	c.Flags().StringVar(&target, "url", "", "the /healthz URL to check (default: from admin.listen)")
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return c
}

// healthURL is the /healthz URL of admin.listen in the configuration
// (--config, else $BRIDGE_CONFIG), else of 127.0.0.1:8088, and the TLS
// client configuration for it when admin.tls is set (else nil).
func healthURL(flagPath string, stderr io.Writer) (string, *tls.Config, error) {
	listen := net.JoinHostPort("127.0.0.1", defaultAdminPort)
	var tc *tls.Config
	if configPath(flagPath) != "" {
		cfg, _, err := loadConfig(flagPath, "", stderr)
		if err != nil {
			// A health check answers 0 or 1 only (Docker reserves 2): a
			// configuration that cannot be read makes the check fail.
			var ee *exitError
			if errors.As(err, &ee) {
				return "", nil, &exitError{Code: 1, Msg: ee.Msg}
			}
			return "", nil, &exitError{Code: 1, Msg: err.Error()}
		}
		if cfg.Admin.Listen == "" {
			return "", nil, &exitError{Code: 1, Msg: "admin.listen is empty: the bridge serves no /healthz to check"}
		}
		listen = cfg.Admin.Listen
		if cfg.Admin.TLS.Enabled() {
			if tc, err = trustAdminCert(cfg.Admin.TLS.CertFile); err != nil {
				return "", nil, &exitError{Code: 1, Msg: "admin.tls.cert_file: " + err.Error()}
			}
		}
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", nil, &exitError{Code: 1, Msg: fmt.Sprintf("admin.listen %q: %v", listen, err)}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	if tc != nil {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + "/healthz", tc, nil
}

// trustAdminCert is the healthcheck's TLS client configuration for the
// bridge's own admin server: it trusts the certificates of certFile (the
// server's certificate and any chain after it) as its only roots, and
// verifies the server's certificate, in full, for the first name that
// certificate carries (a DNS name, else an IP address).
//
// Why not the address dialled: the healthcheck dials 127.0.0.1 (inside
// the container or pod), while the certificate names the service
// (jetbridge.events.svc, say), not 127.0.0.1, so a check of the dialled
// name would always fail. Why not InsecureSkipVerify: that would accept
// any certificate, so a process squatting on the port would pass; here
// the server must present the configured certificate (or one issued by a
// certificate in that file) and prove it holds the key, within its
// validity period. Nothing is skipped: the name checked is one the
// configured certificate carries.
func trustAdminCert(certFile string) (*tls.Config, error) {
	data, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	var leaf *x509.Certificate
	for rest := data; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", certFile, err)
		}
		if leaf == nil {
			leaf = c
		}
		pool.AddCert(c)
	}
	switch {
	case leaf == nil:
		return nil, fmt.Errorf("%s: no PEM certificate found", certFile)
	case len(leaf.DNSNames) > 0:
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: leaf.DNSNames[0]}, nil
	case len(leaf.IPAddresses) > 0:
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: leaf.IPAddresses[0].String()}, nil
	}
	return nil, fmt.Errorf("%s: the certificate carries no DNS name or IP address (subject alternative name) to verify", certFile)
}

// checkHealth GETs u: nil on 200, else an exit-1 error saying what came
// back. The body is not read beyond what closing it needs.
func checkHealth(ctx context.Context, u string, tc *tls.Config, timeout time.Duration, stdout io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return usageErr("--url: %v", err)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if tc != nil {
		client.Transport = &http.Transport{TLSClientConfig: tc}
	}
	resp, err := client.Do(req)
	if err != nil {
		cause := fmt.Sprintf("no answer within %s", timeout)
		var (
			oe *net.OpError
			ve *tls.CertificateVerificationError
		)
		switch {
		case errors.As(err, &ve):
			cause = "TLS: " + ve.Error()
		case errors.As(err, &oe) && !errors.Is(err, context.DeadlineExceeded):
			cause = "cannot connect: " + oe.Err.Error()
		}
		return &exitError{Code: 1, Msg: fmt.Sprintf("unhealthy: GET %s: %s", u, cause)}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &exitError{Code: 1, Msg: fmt.Sprintf("unhealthy: GET %s answered %d", u, resp.StatusCode)}
	}
	_, err = fmt.Fprintf(stdout, "healthy: GET %s answered 200\n", u)
	return err
}
