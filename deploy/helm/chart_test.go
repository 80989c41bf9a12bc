package helm_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// customValues is a values file as an operator writes one: every value the
// default render does not exercise.
const customValues = `
replicaCount: 3
image:
  repository: registry.example.com/platform/jetbridge
  tag: v0.1.0-rc.1
  pullPolicy: Always
existingSecret: jetbridge-env
env:
  - name: OTEL_EXPORTER_OTLP_ENDPOINT
    value: http://otel-collector.observability:4318
  - name: OTEL_SERVICE_NAME
    value: jetbridge-prod
resources:
  requests: {cpu: 250m, memory: 256Mi}
  limits: {cpu: "2", memory: 1Gi}
serviceMonitor:
  enabled: true
  interval: 15s
  labels: {release: kube-prometheus-stack}
prometheusRule:
  enabled: true
  labels: {release: kube-prometheus-stack}
config:
  shutdown_timeout: 1m30s
  log: {level: debug}
  destinations:
    example: null
    caregiver:
      url: ${CAREGIVER_URL}
      timeout: 2s
      headers: {X-Api-Key: "${CAREGIVER_KEY}"}
  routes:
    - name: caregiver-alerts
      subjects: ["events.critical.>"]
      destination: caregiver
      max_deliver: 5
`

// customConfig is the bridge configuration customValues gives: the
// defaults merged with config (maps merged, lists replaced, a null removes
// a default key).
const customConfig = `
nats: {url: "${NATS_URL}"}
admin: {listen: "0.0.0.0:8088"}
log: {level: debug, format: json}
shutdown_timeout: 1m30s
destinations:
  caregiver:
    url: ${CAREGIVER_URL}
    timeout: 2s
    headers: {X-Api-Key: "${CAREGIVER_KEY}"}
routes:
  - name: caregiver-alerts
    subjects: ["events.critical.>"]
    destination: caregiver
    max_deliver: 5
`

const defaultConfig = `
nats: {url: "${NATS_URL}"}
admin: {listen: "0.0.0.0:8088"}
log: {level: info, format: json}
shutdown_timeout: 30s
destinations:
  example: {url: "${DESTINATION_URL}"}
routes:
  - {name: example, subjects: ["events.>"], destination: example}
`

// secretEnvValues has the chart create the Secret.
const secretEnvValues = `
secretEnv:
  NATS_URL: nats://bridge:not-a-real-password@nats.nats.svc:4222
  DESTINATION_URL: https://hooks.example.com/events
`

// requireNone fails the test with the problems a check found.
func requireNone(t *testing.T, what string, p problems) {
	t.Helper()
	if len(p) > 0 {
		t.Errorf("%s:\n  %s", what, strings.Join(p, "\n  "))
	}
}

// chartAlerts is the chart's copy of the rules.
func chartAlerts(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "files", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func requireConfig(t *testing.T, r *rendered, want string) {
	t.Helper()
	requireNone(t, "the ConfigMap's bridge.yaml", compareConfig(r, want))
}

// compareConfig: the ConfigMap's bridge.yaml is, as data, the YAML want.
func compareConfig(r *rendered, want string) (p problems) {
	got := r.bridgeConfig(&p)
	var w map[string]any
	if err := yaml.UnmarshalStrict([]byte(want), &w); err != nil {
		return append(p, "the wanted configuration: "+err.Error())
	}
	if !reflect.DeepEqual(got, w) {
		g, _ := yaml.Marshal(got)
		p.add("the ConfigMap's bridge.yaml is\n%s\nwant\n%s", g, want)
	}
	return p
}

func TestDefaults(t *testing.T) {
	r := mustRender(t, "")
	kinds := func(r *rendered) []string {
		var ks []string
		for _, o := range r.objects {
			ks = append(ks, o.kind+" "+o.name)
		}
		slices.Sort(ks)
		return ks
	}
	want := []string{"ConfigMap jetbridge", "Deployment jetbridge", "PodDisruptionBudget jetbridge", "Service jetbridge", "ServiceAccount jetbridge"}
	if got := kinds(r); !slices.Equal(got, want) {
		t.Errorf("objects %q, want %q", got, want)
	}
	requireNone(t, "replicas", checkReplicas(r, 2))
	requireNone(t, "container", checkContainer(r, "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil))
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTP))
	requireNone(t, "grace", checkGrace(r))
	if g := r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 45 (30s + 15)", deref(g))
	}
	requireNone(t, "security", checkSecurity(r))
	requireNone(t, "anti-affinity", checkAntiAffinity(r))
	requireNone(t, "PodDisruptionBudget", checkPDB(r))
	requireNone(t, "secret env", checkSecretEnv(r, "", nil))
	requireNone(t, "service account", checkServiceAccount(r))
	requireNone(t, "resources", checkResources(r, resources("100m", "128Mi", "1", "512Mi")))
	requireNone(t, "labels", checkLabels(r, "v0.1.0"))
	requireNone(t, "monitoring", checkMonitoring(r, nil, nil))
	requireConfig(t, r, defaultConfig)
	if !strings.Contains(r.notes, "WARNING: no Secret is set") {
		t.Errorf("NOTES.txt does not warn that no Secret is set:\n%s", r.notes)
	}
}

func TestCustomValues(t *testing.T) {
	r := mustRender(t, customValues)
	requireNone(t, "replicas", checkReplicas(r, 3))
	requireNone(t, "container", checkContainer(r, "registry.example.com/platform/jetbridge:v0.1.0-rc.1", corev1.PullAlways, []corev1.EnvVar{
		{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: "http://otel-collector.observability:4318"},
		{Name: "OTEL_SERVICE_NAME", Value: "jetbridge-prod"},
	}))
	requireNone(t, "probes", checkProbes(r, 8088, corev1.URISchemeHTTP))
	requireNone(t, "grace", checkGrace(r))
	if g := r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != 105 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 105 (1m30s + 15)", deref(g))
	}
	requireNone(t, "security", checkSecurity(r))
	requireNone(t, "anti-affinity", checkAntiAffinity(r))
	requireNone(t, "PodDisruptionBudget", checkPDB(r))
	requireNone(t, "secret env", checkSecretEnv(r, "jetbridge-env", nil))
	requireNone(t, "service account", checkServiceAccount(r))
	requireNone(t, "resources", checkResources(r, resources("250m", "256Mi", "2", "1Gi")))
	requireNone(t, "labels", checkLabels(r, "v0.1.0-rc.1"))
	requireNone(t, "monitoring", checkMonitoring(r, &monitoring{interval: "15s", labels: map[string]string{"release": "kube-prometheus-stack"}}, chartAlerts(t)))
	requireConfig(t, r, customConfig)
	if strings.Contains(r.notes, "WARNING") || !strings.Contains(r.notes, "ServiceMonitor jetbridge") {
		t.Errorf("NOTES.txt:\n%s", r.notes)
	}
}

func TestSecretModes(t *testing.T) {
	// The chart creates the Secret from secretEnv...
	r := mustRender(t, secretEnvValues)
	requireNone(t, "secretEnv", checkSecretEnv(r, "jetbridge", []string{"DESTINATION_URL", "NATS_URL"}))
	requireNone(t, "labels", checkLabels(r, "v0.1.0"))
	if r.secret.StringData["NATS_URL"] != "nats://bridge:not-a-real-password@nats.nats.svc:4222" {
		t.Error("the Secret's NATS_URL is not the value of secretEnv")
	}
	if strings.Contains(r.notes, "not-a-real-password") || strings.Contains(r.notes, "WARNING") {
		t.Error("NOTES.txt shows a secret or warns that there is no Secret")
	}
	// ...but existingSecret wins: the chart then creates none.
	r = mustRender(t, secretEnvValues+"existingSecret: jetbridge-env\n")
	requireNone(t, "existingSecret and secretEnv", checkSecretEnv(r, "jetbridge-env", nil))
}

func TestReplicas(t *testing.T) {
	// One replica: no PodDisruptionBudget (minAvailable 1 of 1 would block
	// node drains); the other properties hold.
	r := mustRender(t, "replicaCount: 1\n")
	requireNone(t, "replicas", checkReplicas(r, 1))
	requireNone(t, "PodDisruptionBudget", checkPDB(r))
	if r.pdb != nil {
		t.Error("a PodDisruptionBudget for one replica")
	}
	requireNone(t, "anti-affinity", checkAntiAffinity(r))
}

func TestChecksumFollowsTheConfig(t *testing.T) {
	base := mustRender(t, "")
	// Values that are not the configuration leave the checksum alone...
	for _, v := range []string{"", "replicaCount: 5\n", "existingSecret: other\nimage: {tag: v9}\n", "resources: {requests: {cpu: 1, memory: 1Gi}, limits: {cpu: 2, memory: 2Gi}}\n"} {
		requireNone(t, "values "+strings.TrimSpace(v), checkChecksum(base, mustRender(t, v), false))
	}
	// ...a change of the configuration changes it.
	for _, v := range []string{"config: {log: {level: debug}}\n", "config: {shutdown_timeout: 31s}\n", customValues} {
		requireNone(t, "values "+strings.TrimSpace(v), checkChecksum(base, mustRender(t, v), true))
	}
}

func TestAdminPortFromConfig(t *testing.T) {
	r := mustRender(t, "config: {admin: {listen: \"[::]:9090\"}}\n")
	requireNone(t, "probes", checkProbes(r, 9090, corev1.URISchemeHTTP))
	r = mustRender(t, "config: {admin: {listen: \":9091\"}}\n")
	requireNone(t, "probes", checkProbes(r, 9091, corev1.URISchemeHTTP))
}

func TestRefusedValues(t *testing.T) {
	for values, want := range map[string]string{
		// The probes and Prometheus reach the pod's IP, not its loopback.
		"config: {admin: {listen: \"127.0.0.1:8088\"}}\n": "config.admin.listen must be 0.0.0.0:PORT",
		"config: {admin: {listen: \"\"}}\n":               "config.admin.listen must be 0.0.0.0:PORT",
		"config: {admin: {listen: \"0.0.0.0:70000\"}}\n":  "port 70000 out of range",
		"config: {shutdown_timeout: thirty}\n":            `config.shutdown_timeout: "thirty" is not a Go duration`,
		// The bridge refuses a certificate without its key and the reverse.
		"config: {admin: {tls: {cert_file: /etc/t/tls.crt}}}\n": "config.admin.tls: cert_file and key_file must be set together",
		"config: {admin: {tls: {key_file: /etc/t/tls.key}}}\n":  "config.admin.tls: cert_file and key_file must be set together",
		"config: {shutdown_timeout: \"${T}\"}\n":                `config.shutdown_timeout: "${T}" is not a Go duration`,
		// values.schema.json
		"config: {shutdown_timeout: 30}\n":                     "at '/config/shutdown_timeout': got number, want string",
		"terminationGraceExtraSeconds: 0\n":                    "at '/terminationGraceExtraSeconds': minimum: got 0, want 1",
		"replicas: 3\n":                                        "additional properties 'replicas' not allowed",
		"config: {destinations: null}\n":                       "missing property 'destinations'",
		"config: {admin: {tls: {certfile: /etc/t/tls.crt}}}\n": "additional properties 'certfile' not allowed",
		"config: {admin: {token: 12345678901234567}}\n":        "at '/config/admin/token': got number, want string",
	} {
		if _, err := render(values); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: render error %v, want one containing %q", values, err, want)
		}
	}
	// The templates refuse it too, when the schema is skipped
	// (--skip-schema-validation).
	if _, err := renderWith("terminationGraceExtraSeconds: 0\n", true); err == nil || !strings.Contains(err.Error(), "terminationGraceExtraSeconds must be at least 1") {
		t.Errorf("terminationGraceExtraSeconds 0 without the schema: %v", err)
	}
}

func TestShutdownTimeoutParsing(t *testing.T) {
	// The chart parses Go durations itself (Sprig cannot): rounded up to
	// whole seconds, absent meaning the bridge's default 30s.
	for timeout, grace := range map[string]int64{"30s": 45, "1m30s": 105, "2m": 135, "1h": 3615, "1.5s": 17, "500ms": 16, "1m0.25s": 76, "": 45} {
		values := "config: {shutdown_timeout: " + timeout + "}\n"
		if timeout == "" {
			values = "config: {shutdown_timeout: null}\n"
		}
		r, err := render(values)
		if err != nil {
			t.Errorf("shutdown_timeout %q: %v", timeout, err)
			continue
		}
		requireNone(t, "grace for "+timeout, checkGrace(r))
		if g := r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g != grace {
			t.Errorf("shutdown_timeout %q: terminationGracePeriodSeconds %v, want %d", timeout, deref(g), grace)
		}
	}
}

func TestExtraVolumes(t *testing.T) {
	r := mustRender(t, `
extraVolumes:
  - name: nats-creds
    secret: {secretName: jetbridge-nats-creds}
extraVolumeMounts:
  - name: nats-creds
    mountPath: /etc/jetbridge-secrets
    readOnly: true
`)
	spec := r.deployment.Spec.Template.Spec
	v := volume(spec.Volumes, "nats-creds")
	if v == nil || v.Secret == nil || v.Secret.SecretName != "jetbridge-nats-creds" || len(spec.Volumes) != 3 {
		t.Errorf("volumes %+v, want config, tmp and the Secret jetbridge-nats-creds", spec.Volumes)
	}
	want := []corev1.VolumeMount{
		{Name: "config", MountPath: "/etc/jetbridge", ReadOnly: true},
		{Name: "tmp", MountPath: "/tmp"},
		{Name: "nats-creds", MountPath: "/etc/jetbridge-secrets", ReadOnly: true},
	}
	if got := spec.Containers[0].VolumeMounts; !reflect.DeepEqual(got, want) {
		t.Errorf("volume mounts %+v, want %+v", got, want)
	}
	requireNone(t, "container", checkContainer(r, "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil))
	requireNone(t, "security", checkSecurity(r))
}

// TestPackagedChart: `helm package` keeps what the chart needs (the rules
// file, the schema, NOTES.txt), and the archive renders as the directory
// does.
func TestPackagedChart(t *testing.T) {
	dir, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	tgz, err := chartutil.Save(dir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(tgz) != "jetbridge-0.1.0.tgz" {
		t.Errorf("packaged as %s, want jetbridge-0.1.0.tgz", filepath.Base(tgz))
	}
	archive, err := loader.LoadFile(tgz)
	if err != nil {
		t.Fatal(err)
	}
	if len(archive.Schema) == 0 {
		t.Error("the archive has no values.schema.json")
	}
	for _, values := range []string{"", customValues} {
		fromDir, err := renderChart(dir, values, false)
		if err != nil {
			t.Fatal(err)
		}
		fromArchive, err := renderChart(archive, values, false)
		if err != nil {
			t.Fatal(err)
		}
		if fromArchive.manifest != fromDir.manifest || fromArchive.notes != fromDir.notes {
			t.Errorf("values %q: the archive renders otherwise than the directory", strings.TrimSpace(values))
		}
	}
	r, err := renderChart(archive, customValues, false)
	if err != nil {
		t.Fatal(err)
	}
	requireNone(t, "monitoring from the archive", checkMonitoring(r, &monitoring{interval: "15s", labels: map[string]string{"release": "kube-prometheus-stack"}}, chartAlerts(t)))
	// Control: the same comparison tells two renders apart.
	other, err := renderChart(archive, "replicaCount: 4\n", false)
	if err != nil {
		t.Fatal(err)
	}
	if other.manifest == r.manifest {
		t.Error("two different renders compare equal")
	}
}
