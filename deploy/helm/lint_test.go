package helm_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	corev1 "k8s.io/api/core/v1"
)

// lint runs `helm lint --strict --namespace events` with valuesYAML as the
// values file: any warning or error is returned.
func lint(t *testing.T, valuesYAML string) []string {
	t.Helper()
	vals, err := common.ReadValues([]byte(valuesYAML))
	if err != nil {
		t.Fatal(err)
	}
	l := action.NewLint()
	l.Strict = true
	l.Namespace = namespace
	res := l.Run([]string{chartDir}, vals)
	var out []string
	for _, e := range res.Errors {
		out = append(out, e.Error())
	}
	if res.TotalChartsLinted != 1 {
		out = append(out, "the chart was not linted")
	}
	if action.HasWarningsOrErrors(res) && len(out) == 0 {
		out = append(out, "lint reports warnings")
	}
	return out
}

func TestLint(t *testing.T) {
	for name, values := range map[string]string{"defaults": "", "custom": customValues, "secretEnv": secretEnvValues, "one replica": "replicaCount: 1\n", "admin TLS": adminTLSValues, "token monitor": tokenMonitorValues, "TLS monitor": tlsMonitorValues} {
		if msgs := lint(t, values); len(msgs) > 0 {
			t.Errorf("helm lint --strict (%s):\n  %s", name, strings.Join(msgs, "\n  "))
		}
	}
	// The same lint fails values that break the schema. (It does not
	// fail on the templates' own fail calls: helm lint only logs them.
	// TestRefusedValues checks those.)
	msgs := lint(t, "replicaCount: two\n")
	if !strings.Contains(strings.Join(msgs, "\n"), "at '/replicaCount': got string, want integer") {
		t.Errorf("helm lint passed replicaCount: two: %q", msgs)
	}
}

// binDir holds the test's build of cmd/bridge.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jetbridge-helm-test")
	if err != nil {
		panic(err)
	}
	binDir = dir
	// helm lint logs the templates' fail calls, which TestRefusedValues
	// renders on purpose.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bridgeBinary builds cmd/bridge of this repository once.
var bridgeBinary = sync.OnceValues(func() (string, error) {
	exe := filepath.Join(binDir, "bridge")
	cmd := exec.Command("go", "build", "-o", exe, "./cmd/bridge")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", errors.New("go build ./cmd/bridge: " + err.Error() + "\n" + string(out))
	}
	return exe, nil
})

// bridgeCheck runs `bridge check` on the ConfigMap's bridge.yaml with env
// as the environment the Secret and env values give the pod; it returns
// the output and the exit code.
func bridgeCheck(t *testing.T, r *rendered, env ...string) (string, int) {
	t.Helper()
	exe, err := bridgeBinary()
	if err != nil {
		t.Fatal(err)
	}
	if r.configMap == nil {
		t.Fatal("no ConfigMap")
	}
	file := filepath.Join(t.TempDir(), "bridge.yaml")
	if err := os.WriteFile(file, []byte(r.configMap.Data["bridge.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "check", "--config", file)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	default:
		t.Fatal(err)
		return "", -1
	}
}

// TestConfigPassesBridgeCheck: the configuration the chart writes is one
// the bridge accepts (bridge check: unknown keys, ranges, references), with
// the environment the documented Secret gives.
func TestConfigPassesBridgeCheck(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("go is not on PATH: cannot build cmd/bridge")
	}
	env := []string{"NATS_URL=nats://nats.nats.svc:4222", "DESTINATION_URL=https://hooks.example.com/events"}
	for name, values := range map[string]string{"defaults": "", "custom": customValues} {
		r := mustRender(t, values)
		out, code := bridgeCheck(t, r, append(env, "CAREGIVER_URL=https://caregiver.example.com/alerts", "CAREGIVER_KEY=k")...)
		if code != 0 || !strings.Contains(out, "configuration OK") {
			t.Errorf("%s: bridge check exit %d:\n%s", name, code, out)
		}
	}
	// With the admin server's token and TLS: the certificate and key the
	// configuration names exist (generated here, where the mounted Secret
	// would put them in the pod).
	dir := t.TempDir()
	cert, key := writeTestCert(t, dir, "jetbridge.events.svc")
	tlsValues := "config:\n  admin:\n    token: \"${ADMIN_TOKEN}\"\n    tls: {cert_file: " + cert + ", key_file: " + key + "}\n"
	r := mustRender(t, tlsValues)
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTPS))
	if out, code := bridgeCheck(t, r, append(env, "ADMIN_TOKEN="+testAdminToken)...); code != 0 || !strings.Contains(out, "configuration OK") {
		t.Errorf("admin token and TLS: bridge check exit %d:\n%s", code, out)
	}
	// Controls: without the key file, or with a token too short, bridge
	// check refuses the same configuration.
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if out, code := bridgeCheck(t, r, append(env, "ADMIN_TOKEN="+testAdminToken)...); code != 2 || !strings.Contains(out, "admin.tls.key_file") {
		t.Errorf("admin TLS without the key file: bridge check exit %d:\n%s", code, out)
	}
	if out, code := bridgeCheck(t, mustRender(t, "config: {admin: {token: \"${ADMIN_TOKEN}\"}}\n"), append(env, "ADMIN_TOKEN=short")...); code != 2 || !strings.Contains(out, "admin.token") {
		t.Errorf("a short admin token: bridge check exit %d:\n%s", code, out)
	}

	// Negative controls: the same check refuses a configuration the bridge
	// would not start with, and the default one without its Secret.
	r = mustRender(t, "config: {routes: [{name: r, subjects: [events.>], destination: nowhere}]}\n")
	if out, code := bridgeCheck(t, r, env...); code != 2 || !strings.Contains(out, "routes[0].destination") {
		t.Errorf("a route to an unknown destination: bridge check exit %d:\n%s", code, out)
	}
	if out, code := bridgeCheck(t, mustRender(t, ""), "NATS_URL=nats://nats.nats.svc:4222"); code != 2 || !strings.Contains(out, "DESTINATION_URL") {
		t.Errorf("the default configuration without DESTINATION_URL: bridge check exit %d:\n%s", code, out)
	}
}

// TestPrometheusRuleMatchesStandaloneRules: the PrometheusRule carries the
// rules of deploy/prometheus/alerts.yml, the file Prometheus users load
// directly.
func TestPrometheusRuleMatchesStandaloneRules(t *testing.T) {
	standalone, err := os.ReadFile(filepath.Join("..", "prometheus", "alerts.yml"))
	if err != nil {
		t.Fatalf("deploy/prometheus/alerts.yml, the standalone rules the chart's files/alerts.yml copies, is missing: %v", err)
	}
	r := mustRender(t, "prometheusRule: {enabled: true}\n")
	requireNone(t, "PrometheusRule against deploy/prometheus/alerts.yml", compareGroups(r, standalone))
	requireNone(t, "PrometheusRule against the chart's files/alerts.yml", compareGroups(r, chartAlerts(t)))
}
