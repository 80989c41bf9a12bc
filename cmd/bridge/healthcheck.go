package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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
configuration at all, http://127.0.0.1:8088/healthz.`,
		Example: `  bridge healthcheck                                   # $BRIDGE_CONFIG's admin.listen, else :8088
  bridge healthcheck --config config/quickstart.yaml
  bridge healthcheck --url http://127.0.0.1:8090/healthz`,
		Args: cli.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			u := target
			if u == "" {
				var err error
				if u, err = healthURL(configFile, c.ErrOrStderr()); err != nil {
					return err
				}
			} else if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
				return usageErr("--url %q: want an http:// or https:// URL, e.g. http://127.0.0.1:8088/healthz", u)
			}
			if timeout <= 0 {
				return usageErr("--timeout must be positive, e.g. 2s")
			}
			return checkHealth(c.Context(), u, timeout, c.OutOrStdout())
		},
	}
	configFlag(c.Flags(), &configFile)
	c.Flags().StringVar(&target, "url", "", "the /healthz URL to check (default: from admin.listen)")
	c.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return c
}

// healthURL is the /healthz URL of admin.listen in the configuration
// (--config, else $BRIDGE_CONFIG), else of 127.0.0.1:8088.
func healthURL(flagPath string, stderr io.Writer) (string, error) {
	listen := net.JoinHostPort("127.0.0.1", defaultAdminPort)
	if configPath(flagPath) != "" {
		cfg, _, err := loadConfig(flagPath, "", stderr)
		if err != nil {
			return "", err
		}
		if cfg.Admin.Listen == "" {
			return "", &exitError{Code: 1, Msg: "admin.listen is empty: the bridge serves no /healthz to check"}
		}
		listen = cfg.Admin.Listen
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", &exitError{Code: 2, Msg: fmt.Sprintf("admin.listen %q: %v", listen, err)}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz", nil
}

// checkHealth GETs u: nil on 200, else an exit-1 error saying what came
// back. The body is not read beyond what closing it needs.
func checkHealth(ctx context.Context, u string, timeout time.Duration, stdout io.Writer) error {
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
	resp, err := client.Do(req)
	if err != nil {
		cause := fmt.Sprintf("no answer within %s", timeout)
		var oe *net.OpError
		if errors.As(err, &oe) && !errors.Is(err, context.DeadlineExceeded) {
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
