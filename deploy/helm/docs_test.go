package helm_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// helmSection is the "Kubernetes with the Helm chart" section of
// docs/deploy.md.
func helmSection(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "deploy.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Kubernetes with the Helm chart\n")
	if !ok {
		t.Fatal(`docs/deploy.md has no "## Kubernetes with the Helm chart" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return section
}

var fencedBlock = regexp.MustCompile("(?ms)^```(\\w*)\n(.*?)^```$")

// blocks returns the section's code blocks of a language.
func blocks(section, lang string) []string {
	var out []string
	for _, m := range fencedBlock.FindAllStringSubmatch(section, -1) {
		if m[1] == lang {
			out = append(out, m[2])
		}
	}
	return out
}

var (
	createSecret = regexp.MustCompile(`create secret generic ([\w.-]+)`)
	fromLiteral  = regexp.MustCompile(`--from-literal=(\w+)=`)
)

// TestDocsHelmSection: what docs/deploy.md tells an operator to write works:
// its values file and monitoring file render, lint and give a configuration
// bridge check accepts with the Secret it tells them to create; the
// default configuration it shows is the chart's.
func TestDocsHelmSection(t *testing.T) {
	section := helmSection(t)
	yamls := blocks(section, "yaml")
	if len(yamls) != 4 {
		t.Fatalf("want 4 yaml blocks (values.yaml, the default configuration, the NATS credentials file, monitoring.yaml), got %d", len(yamls))
	}
	values, defaults, credsFile, monitoringFile := yamls[0], yamls[1], yamls[2], yamls[3]

	// The credentials file example mounts its Secret where its
	// configuration looks.
	r := mustRender(t, credsFile)
	if msgs := lint(t, credsFile); len(msgs) > 0 {
		t.Errorf("helm lint --strict with the credentials example:\n  %s", strings.Join(msgs, "\n  "))
	}
	var p problems
	creds, _ := dig(r.bridgeConfig(&p), "nats", "creds_file").(string)
	mounted := false
	for _, m := range r.deployment.Spec.Template.Spec.Containers[0].VolumeMounts {
		v := volume(r.deployment.Spec.Template.Spec.Volumes, m.Name)
		mounted = mounted || (creds != "" && strings.HasPrefix(creds, m.MountPath+"/") && m.ReadOnly && v != nil && v.Secret != nil)
	}
	if !mounted || len(p) > 0 {
		t.Errorf("the credentials example: nats.creds_file %q is not in a read-only Secret mount %v", creds, p)
	}

	requireConfig(t, mustRender(t, ""), defaults)

	// helm install -f values.yaml, then helm upgrade -f values.yaml -f
	// monitoring.yaml (their top-level keys are distinct).
	for name, v := range map[string]string{"values.yaml": values, "values.yaml and monitoring.yaml": values + monitoringFile} {
		if msgs := lint(t, v); len(msgs) > 0 {
			t.Errorf("helm lint --strict -f %s:\n  %s", name, strings.Join(msgs, "\n  "))
		}
	}
	r = mustRender(t, values+monitoringFile)
	requireNone(t, "monitoring", checkMonitoring(r, &monitoring{interval: "30s", labels: map[string]string{"release": "kube-prometheus-stack"}}, chartAlerts(t)))

	// The Secret the section creates is the one the values name, and its
	// keys are all the configuration needs.
	var secret string
	var env []string
	for _, b := range blocks(section, "sh") {
		if m := createSecret.FindStringSubmatch(b); m != nil {
			secret = m[1]
			for _, k := range fromLiteral.FindAllStringSubmatch(b, -1) {
				env = append(env, k[1]+"=x")
			}
		}
	}
	if secret == "" || len(env) == 0 {
		t.Fatal("the section creates no Secret with kubectl create secret generic NAME --from-literal=KEY=...")
	}
	requireNone(t, "secret env", checkSecretEnv(r, secret, nil))
	for i, kv := range env {
		if strings.HasPrefix(kv, "NATS_URL=") {
			env[i] = "NATS_URL=nats://nats.nats.svc:4222"
		} else if strings.HasSuffix(strings.TrimSuffix(kv, "=x"), "_URL") {
			env[i] = strings.TrimSuffix(kv, "x") + "https://orders.example.com/hooks/events"
		}
	}
	if out, code := bridgeCheck(t, r, env...); code != 0 {
		t.Errorf("bridge check of the documented values with the documented Secret's keys: exit %d\n%s", code, out)
	}
	// Control: without one of the Secret's keys, bridge check refuses it.
	if out, code := bridgeCheck(t, r, env[1:]...); code != 2 {
		t.Errorf("bridge check without %s: exit %d\n%s", strings.Split(env[0], "=")[0], code, out)
	}

	// Every install command names the chart's directory and the namespace
	// the Secret is created in.
	for _, b := range blocks(section, "sh") {
		for _, line := range strings.Split(b, "\n") {
			if strings.HasPrefix(line, "helm install ") || strings.HasPrefix(line, "helm upgrade ") {
				if !strings.Contains(line, " deploy/helm/jetbridge ") || !strings.Contains(line, " -n events ") {
					t.Errorf("%q: not the chart directory deploy/helm/jetbridge in namespace events", line)
				}
			}
		}
	}
}
