package helm_test

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "jetbridge"
	releaseName = "jetbridge"
	namespace   = "events"
)

// rendered is one render of the chart, every object decoded strictly into
// its Go type.
type rendered struct {
	manifest string
	notes    string
	objects  []object

	deployment     *appsv1.Deployment
	configMap      *corev1.ConfigMap
	service        *corev1.Service
	serviceAccount *corev1.ServiceAccount
	secret         *corev1.Secret
	pdb            *policyv1.PodDisruptionBudget
	serviceMonitor *monitoringv1.ServiceMonitor
	prometheusRule *monitoringv1.PrometheusRule
}

// object is one rendered document.
type object struct {
	source string // the template it came from
	kind   string
	name   string
	labels map[string]string
	raw    []byte // the document as rendered
}

// render renders the chart as `helm install --dry-run=client -f values.yaml`
// does, with valuesYAML as the values file ("" for the defaults).
func render(valuesYAML string) (*rendered, error) {
	return renderWith(valuesYAML, false)
}

// renderWith renders as render does, without values.schema.json when
// skipSchema.
func renderWith(valuesYAML string, skipSchema bool) (*rendered, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load the chart: %w", err)
	}
	return renderChart(chrt, valuesYAML, skipSchema)
}

// renderChart renders a loaded chart (a directory or a packaged archive).
func renderChart(chrt *chart.Chart, valuesYAML string, skipSchema bool) (*rendered, error) {
	vals, err := common.ReadValues([]byte(valuesYAML))
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	cfg := action.NewConfiguration()
	cfg.SetLogger(slog.DiscardHandler)
	install := action.NewInstall(cfg)
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.SkipSchemaValidation = skipSchema
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	r, ok := rel.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("render: a %T, not a *release.Release", rel)
	}
	if len(r.Hooks) != 0 {
		return nil, fmt.Errorf("render: %d hooks; the chart has none", len(r.Hooks))
	}
	out := &rendered{manifest: r.Manifest, notes: r.Info.Notes}
	if err := out.decode(); err != nil {
		return nil, err
	}
	return out, nil
}

// mustRender renders valuesYAML or fails the test.
func mustRender(t *testing.T, valuesYAML string) *rendered {
	t.Helper()
	r, err := render(valuesYAML)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var (
	docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)
	sourceLine   = regexp.MustCompile(`(?m)^# Source: (\S+)$`)
)

// decode splits the manifest into its documents and decodes every one
// strictly into the Go type of its apiVersion and kind: an unknown kind, an
// unknown field, a duplicate key or a second object of a kind is an error.
func (r *rendered) decode() error {
	for _, doc := range docSeparator.Split(r.manifest, -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		m := sourceLine.FindStringSubmatch(doc)
		if m == nil {
			return fmt.Errorf("a document without its # Source line:\n%s", doc)
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return fmt.Errorf("%s: %w", m[1], err)
		}
		obj := object{source: m[1], kind: head.Kind, name: head.Metadata.Name, labels: head.Metadata.Labels, raw: []byte(doc)}
		var target any
		var dup bool
		switch gvk := head.APIVersion + " " + head.Kind; gvk {
		case "apps/v1 Deployment":
			dup, r.deployment = r.deployment != nil, &appsv1.Deployment{}
			target = r.deployment
		case "v1 ConfigMap":
			dup, r.configMap = r.configMap != nil, &corev1.ConfigMap{}
			target = r.configMap
		case "v1 Service":
			dup, r.service = r.service != nil, &corev1.Service{}
			target = r.service
		case "v1 ServiceAccount":
			dup, r.serviceAccount = r.serviceAccount != nil, &corev1.ServiceAccount{}
			target = r.serviceAccount
		case "v1 Secret":
			dup, r.secret = r.secret != nil, &corev1.Secret{}
			target = r.secret
		case "policy/v1 PodDisruptionBudget":
			dup, r.pdb = r.pdb != nil, &policyv1.PodDisruptionBudget{}
			target = r.pdb
		case "monitoring.coreos.com/v1 ServiceMonitor":
			dup, r.serviceMonitor = r.serviceMonitor != nil, &monitoringv1.ServiceMonitor{}
			target = r.serviceMonitor
		case "monitoring.coreos.com/v1 PrometheusRule":
			dup, r.prometheusRule = r.prometheusRule != nil, &monitoringv1.PrometheusRule{}
			target = r.prometheusRule
		default:
			return fmt.Errorf("%s: an object of an unexpected kind %q", m[1], gvk)
		}
		if dup {
			return fmt.Errorf("%s: a second %s", m[1], head.Kind)
		}
		if err := decodeStrict([]byte(doc), target); err != nil {
			return fmt.Errorf("%s: %s %s: %w", m[1], head.Kind, head.Metadata.Name, err)
		}
		r.objects = append(r.objects, obj)
	}
	if len(r.objects) == 0 {
		return errors.New("the chart rendered no object")
	}
	return nil
}

// decodeStrict decodes one YAML document into target as the API server
// does: duplicate keys, fields that target's type does not have and
// fields whose case differs from the type's (encoding/json alone would
// take servername for serverName) are errors.
func decodeStrict(doc []byte, target any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, target, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

func TestDecodeStrictRefusesUnknownFields(t *testing.T) {
	for _, c := range []struct {
		doc    string
		target any
		want   string
	}{
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndat: {}\n", &corev1.ConfigMap{}, `unknown field "dat"`},
		{"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 1, prot: TCP}]}\n", &corev1.Service{}, `unknown field "spec.ports[0].prot"`},
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, name: y}\n", &corev1.ConfigMap{}, `"name" already set`},
		// encoding/json alone would take a field whose case differs.
		{"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nData: {a: b}\n", &corev1.ConfigMap{}, `unknown field "Data"`},
	} {
		err := decodeStrict([]byte(c.doc), c.target)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("decodeStrict(%q) = %v, want an error containing %q", c.doc, err, c.want)
		}
	}
	rule := "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: x}\nspec: {groups: [{name: g, rules: [{alert: A, expr: up, fro: 5m}]}]}\n"
	if err := decodeStrict([]byte(rule), &monitoringv1.PrometheusRule{}); err == nil || !strings.Contains(err.Error(), `unknown field "spec.groups[0].rules[0].fro"`) {
		t.Errorf("a PrometheusRule with an unknown field: %v", err)
	}
	sm := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\nspec: {selector: {}, endpoints: [{port: admin, tlsConfig: {ca: {secret: {name: s, key: ca.crt}}, servername: x}}]}\n"
	if err := decodeStrict([]byte(sm), &monitoringv1.ServiceMonitor{}); err == nil || !strings.Contains(err.Error(), `unknown field "spec.endpoints[0].tlsConfig.servername"`) {
		t.Errorf("a ServiceMonitor with an unknown tlsConfig field: %v", err)
	}
	// The same through render's decoding: an unexpected kind is refused.
	r := &rendered{manifest: "---\n# Source: jetbridge/templates/x.yaml\napiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\n"}
	if err := r.decode(); err == nil || !strings.Contains(err.Error(), `unexpected kind "batch/v1 Job"`) {
		t.Errorf("an unexpected kind: %v", err)
	}
}
