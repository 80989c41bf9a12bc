package helm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/cli/values"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
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
	createSecret    = regexp.MustCompile(`create secret generic ([\w.-]+)`)
	createTLSSecret = regexp.MustCompile(`create secret tls ([\w.-]+)`)
	fromLiteral     = regexp.MustCompile(`--from-literal=(\w+)=`)
)

// valuesFiles merges values files as helm -f a.yaml -f b.yaml does.
func valuesFiles(t *testing.T, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	var opts values.Options
	for i, f := range files {
		path := filepath.Join(dir, fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(path, []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
		opts.ValueFiles = append(opts.ValueFiles, path)
	}
	merged, err := opts.MergeValues(nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(merged)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestDocsHelmSection: what docs/deploy.md tells an operator to write works:
// its values file and monitoring file render, lint and give a configuration
// bridge check accepts with the Secret it tells them to create; the
// default configuration it shows is the chart's.
func TestDocsHelmSection(t *testing.T) {
	section := helmSection(t)
	yamls := blocks(section, "yaml")
	if len(yamls) != 5 {
		t.Fatalf("want 5 yaml blocks (values.yaml, the default configuration, the NATS credentials file, monitoring.yaml, admin-tls.yaml), got %d", len(yamls))
	}
	values, defaults, credsFile, monitoringFile, adminTLSFile := yamls[0], yamls[1], yamls[2], yamls[3], yamls[4]

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
	// monitoring.yaml [-f admin-tls.yaml], the files merged as helm does.
	withMonitoring := valuesFiles(t, values, monitoringFile)
	withTLS := valuesFiles(t, values, monitoringFile, adminTLSFile)
	for name, v := range map[string]string{"values.yaml": values, "values.yaml and monitoring.yaml": withMonitoring, "values.yaml, monitoring.yaml and admin-tls.yaml": withTLS} {
		if msgs := lint(t, v); len(msgs) > 0 {
			t.Errorf("helm lint --strict -f %s:\n  %s", name, strings.Join(msgs, "\n  "))
		}
	}
	r = mustRender(t, withMonitoring)
	requireNone(t, "monitoring", checkMonitoring(r, &monitoring{
		interval: "30s", labels: map[string]string{"release": "kube-prometheus-stack"}, tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN",
	}, chartAlerts(t)))
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTP))

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
		if strings.HasPrefix(kv, "ADMIN_TOKEN=") {
			env[i] = "ADMIN_TOKEN=" + testAdminToken
		} else if strings.HasPrefix(kv, "NATS_URL=") {
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

	if !slices.Contains(env, "ADMIN_TOKEN="+testAdminToken) {
		t.Errorf("the Secret the section creates has no ADMIN_TOKEN, which the values' admin.token reads: %q", env)
	}

	// admin-tls.yaml: the probes use HTTPS, the ServiceMonitor https with
	// the token and the CA from the certificate's Secret, for the name the
	// section's certificate carries.
	tlsSecret, serverName := "", "jetbridge.events.svc"
	for _, b := range blocks(section, "sh") {
		if m := createTLSSecret.FindStringSubmatch(b); m != nil {
			tlsSecret = m[1]
			if !strings.Contains(b, "subjectAltName=DNS:"+serverName+" ") {
				t.Errorf("the section's certificate does not carry the name Prometheus verifies, %s:\n%s", serverName, b)
			}
		}
	}
	if tlsSecret == "" {
		t.Fatal("the section creates no certificate Secret with kubectl create secret tls NAME")
	}
	r = mustRender(t, withTLS)
	requireNone(t, "probes with admin-tls.yaml", checkProbes(r, 8088, corev1.URISchemeHTTPS))
	requireNone(t, "monitoring with admin-tls.yaml", checkMonitoring(r, &monitoring{
		interval: "30s", labels: map[string]string{"release": "kube-prometheus-stack"}, tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN",
		ca: caSecret(tlsSecret, "tls.crt"), serverName: serverName,
	}, chartAlerts(t)))
	// The files admin.tls names are in a read-only mount of the whole
	// certificate Secret (no subPath: renewals reach the pod).
	var q problems
	cfg := r.bridgeConfig(&q)
	mountDir := ""
	for _, k := range []string{"cert_file", "key_file"} {
		file, _ := dig(cfg, "admin", "tls", k).(string)
		found := false
		for _, m := range r.deployment.Spec.Template.Spec.Containers[0].VolumeMounts {
			v := volume(r.deployment.Spec.Template.Spec.Volumes, m.Name)
			if file != "" && strings.HasPrefix(file, m.MountPath+"/") && m.ReadOnly && m.SubPath == "" && v != nil && v.Secret != nil && v.Secret.SecretName == tlsSecret {
				found, mountDir = true, m.MountPath
			}
		}
		if !found || len(q) > 0 {
			t.Errorf("admin-tls.yaml: admin.tls.%s %q is not in a read-only mount of Secret %s %v", k, file, tlsSecret, q)
		}
	}
	// bridge check accepts the configuration with a certificate and key
	// where the mount puts them (generated here, tls.crt and tls.key as in
	// a kubernetes.io/tls Secret)...
	dir := t.TempDir()
	writeTestCert(t, dir, serverName)
	inPod := r.configMap.Data["bridge.yaml"]
	r.configMap.Data["bridge.yaml"] = strings.ReplaceAll(inPod, mountDir+"/", dir+"/")
	if out, code := bridgeCheck(t, r, env...); code != 0 {
		t.Errorf("bridge check of admin-tls.yaml with the generated certificate: exit %d\n%s", code, out)
	}
	// ...and refuses it without them (control).
	r.configMap.Data["bridge.yaml"] = inPod
	if out, code := bridgeCheck(t, r, env...); code != 2 || !strings.Contains(out, "admin.tls.cert_file") {
		t.Errorf("bridge check of admin-tls.yaml without the certificate: exit %d\n%s", code, out)
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
