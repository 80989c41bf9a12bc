package helm_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// The checks below each return the problems they find in one render (none
// when the property holds). Every one of them is shown to report a broken
// render in TestChecksCatchBrokenRenders.

const (
	configPath = "/etc/jetbridge/bridge.yaml"
	imageUser  = 65532 // the image's uid and gid
)

// problems collects what a check finds.
type problems []string

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// container is the bridge container, or nil (with a problem) when the
// Deployment does not have exactly one container named bridge.
func (r *rendered) container(p *problems) *corev1.Container {
	if r.deployment == nil {
		p.add("no Deployment")
		return nil
	}
	cs := r.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "bridge" {
		p.add("want one container named bridge, got %d", len(cs))
		return nil
	}
	return &cs[0]
}

// bridgeConfig is the ConfigMap's bridge.yaml, parsed.
func (r *rendered) bridgeConfig(p *problems) map[string]any {
	if r.configMap == nil {
		p.add("no ConfigMap")
		return nil
	}
	text, ok := r.configMap.Data["bridge.yaml"]
	if !ok || len(r.configMap.Data) != 1 || len(r.configMap.BinaryData) != 0 {
		p.add("the ConfigMap must hold exactly bridge.yaml, it holds %d keys", len(r.configMap.Data)+len(r.configMap.BinaryData))
		return nil
	}
	var cfg map[string]any
	if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
		p.add("bridge.yaml: %v", err)
		return nil
	}
	return cfg
}

// checkReplicas: the Deployment runs want replicas.
func checkReplicas(r *rendered, want int32) (p problems) {
	switch {
	case r.deployment == nil:
		p.add("no Deployment")
	case r.deployment.Spec.Replicas == nil:
		p.add("replicas not set")
	case *r.deployment.Spec.Replicas != want:
		p.add("replicas = %d, want %d", *r.deployment.Spec.Replicas, want)
	}
	return p
}

// checkContainer: the image's entrypoint with args [run], the image and its
// pull policy, BRIDGE_CONFIG then the extra environment, and the ConfigMap
// mounted read-only where BRIDGE_CONFIG points.
func checkContainer(r *rendered, image string, pull corev1.PullPolicy, extraEnv []corev1.EnvVar) (p problems) {
	c := r.container(&p)
	if c == nil {
		return p
	}
	if c.Image != image || c.ImagePullPolicy != pull {
		p.add("image %s (%s), want %s (%s)", c.Image, c.ImagePullPolicy, image, pull)
	}
	if len(c.Command) != 0 || !slices.Equal(c.Args, []string{"run"}) {
		p.add("command %q args %q, want the image's entrypoint with args [run]", c.Command, c.Args)
	}
	wantEnv := append([]corev1.EnvVar{{Name: "BRIDGE_CONFIG", Value: configPath}}, extraEnv...)
	if !reflect.DeepEqual(c.Env, wantEnv) {
		p.add("env %v, want %v", envNames(c.Env), envNames(wantEnv))
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		if m.MountPath != "/etc/jetbridge" {
			continue
		}
		mounted = m.ReadOnly
		if !m.ReadOnly {
			p.add("/etc/jetbridge is mounted writable")
		}
		v := volume(r.deployment.Spec.Template.Spec.Volumes, m.Name)
		if v == nil || v.ConfigMap == nil || r.configMap == nil || v.ConfigMap.Name != r.configMap.Name || len(v.ConfigMap.Items) != 0 {
			p.add("/etc/jetbridge is not the whole chart's ConfigMap (volume %q)", m.Name)
		}
	}
	if !mounted {
		p.add("no read-only mount at /etc/jetbridge")
	}
	r.bridgeConfig(&p)
	return p
}

func volume(vs []corev1.Volume, name string) *corev1.Volume {
	for i := range vs {
		if vs[i].Name == name {
			return &vs[i]
		}
	}
	return nil
}

// envNames lists the variables' names only: values may be secrets.
func envNames(env []corev1.EnvVar) []string {
	var out []string
	for _, e := range env {
		out = append(out, e.Name)
	}
	return out
}

// checkProbes: port want named admin (the port of config admin.listen),
// liveness on GET /healthz and readiness on GET /readyz there with scheme
// (HTTPS exactly when the configuration has admin.tls), and a ClusterIP
// Service exposing it for the pods of the release.
func checkProbes(r *rendered, want int32, scheme corev1.URIScheme) (p problems) {
	c := r.container(&p)
	if c == nil {
		return p
	}
	wantPorts := []corev1.ContainerPort{{Name: "admin", ContainerPort: want, Protocol: corev1.ProtocolTCP}}
	if !reflect.DeepEqual(c.Ports, wantPorts) {
		p.add("container ports %+v, want %+v", c.Ports, wantPorts)
	}
	get := func(path string) corev1.ProbeHandler {
		return corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromString("admin"), Scheme: scheme}}
	}
	for _, pr := range []struct {
		name      string
		got, want *corev1.Probe
	}{
		{"liveness", c.LivenessProbe, &corev1.Probe{ProbeHandler: get("/healthz"), InitialDelaySeconds: 5, PeriodSeconds: 10, TimeoutSeconds: 2, FailureThreshold: 3}},
		{"readiness", c.ReadinessProbe, &corev1.Probe{ProbeHandler: get("/readyz"), PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: 2}},
	} {
		if !reflect.DeepEqual(pr.got, pr.want) {
			g, _ := json.Marshal(pr.got)
			w, _ := json.Marshal(pr.want)
			p.add("%s probe %s, want %s", pr.name, g, w)
		}
	}
	if cfg := r.bridgeConfig(&p); cfg != nil {
		listen, _ := dig(cfg, "admin", "listen").(string)
		if !strings.HasSuffix(listen, fmt.Sprintf(":%d", want)) {
			p.add("config admin.listen %q is not on port %d", listen, want)
		}
		if tls := adminTLS(cfg); tls != (scheme == corev1.URISchemeHTTPS) {
			p.add("config admin.tls set = %v, but the probes are wanted over %s", tls, scheme)
		}
	}
	s := r.service
	if s == nil {
		p.add("no Service")
		return p
	}
	wantSvcPorts := []corev1.ServicePort{{Name: "admin", Port: want, TargetPort: intstr.FromString("admin"), Protocol: corev1.ProtocolTCP}}
	if s.Spec.Type != corev1.ServiceTypeClusterIP || !reflect.DeepEqual(s.Spec.Ports, wantSvcPorts) {
		p.add("Service %s %+v, want ClusterIP %+v", s.Spec.Type, s.Spec.Ports, wantSvcPorts)
	}
	if sel := r.deployment.Spec.Selector; sel == nil || !reflect.DeepEqual(s.Spec.Selector, sel.MatchLabels) {
		p.add("the Service selects %v, not the Deployment's pods", s.Spec.Selector)
	}
	return p
}

// adminTLS: the configuration has admin.tls (the bridge serves HTTPS only).
func adminTLS(cfg map[string]any) bool {
	cert, _ := dig(cfg, "admin", "tls", "cert_file").(string)
	key, _ := dig(cfg, "admin", "tls", "key_file").(string)
	return cert != "" || key != ""
}

// dig returns the value at keys in nested maps, or nil.
func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// shutdownTimeout is config shutdown_timeout (the bridge's default, 30s,
// when absent).
func shutdownTimeout(r *rendered, p *problems) (time.Duration, bool) {
	cfg := r.bridgeConfig(p)
	if cfg == nil {
		return 0, false
	}
	s := "30s"
	if v, ok := cfg["shutdown_timeout"]; ok {
		s, _ = v.(string)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		p.add("config shutdown_timeout: %v", err)
		return 0, false
	}
	return d, true
}

// checkGrace: the kubelet waits strictly longer than the bridge's
// shutdown_timeout before SIGKILL.
func checkGrace(r *rendered) (p problems) {
	d, ok := shutdownTimeout(r, &p)
	if !ok || r.deployment == nil {
		return append(p, "no configuration or no Deployment")
	}
	g := r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
	if g == nil {
		p.add("terminationGracePeriodSeconds not set (Kubernetes' default is 30s)")
	} else if time.Duration(*g)*time.Second <= d {
		p.add("terminationGracePeriodSeconds %d is not longer than shutdown_timeout %s", *g, d)
	}
	return p
}

// checkSecurity: the restricted security context.
func checkSecurity(r *rendered) (p problems) {
	c := r.container(&p)
	if c == nil {
		return p
	}
	ps := r.deployment.Spec.Template.Spec.SecurityContext
	if ps == nil {
		ps = &corev1.PodSecurityContext{}
	}
	wantInt := func(name string, v *int64) {
		if v == nil || *v != imageUser {
			p.add("pod %s = %v, want %d", name, deref(v), imageUser)
		}
	}
	if ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot {
		p.add("pod runAsNonRoot = %v, want true", deref(ps.RunAsNonRoot))
	}
	wantInt("runAsUser", ps.RunAsUser)
	wantInt("runAsGroup", ps.RunAsGroup)
	wantInt("fsGroup", ps.FSGroup)
	if ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		p.add("pod seccompProfile %+v, want RuntimeDefault", ps.SeccompProfile)
	}
	cs := c.SecurityContext
	if cs == nil {
		p.add("no container securityContext")
		return p
	}
	if cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
		p.add("readOnlyRootFilesystem = %v, want true", deref(cs.ReadOnlyRootFilesystem))
	}
	if cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation {
		p.add("allowPrivilegeEscalation = %v, want false", deref(cs.AllowPrivilegeEscalation))
	}
	if cs.Privileged != nil && *cs.Privileged {
		p.add("privileged")
	}
	if cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(cs.Capabilities.Add) != 0 {
		p.add("capabilities %+v, want drop [ALL] and nothing added", cs.Capabilities)
	}
	for name, v := range map[string]*int64{"runAsUser": cs.RunAsUser, "runAsGroup": cs.RunAsGroup} {
		if v != nil && *v != imageUser {
			p.add("container %s = %d overrides the pod's %d", name, *v, imageUser)
		}
	}
	if cs.RunAsNonRoot != nil && !*cs.RunAsNonRoot {
		p.add("container runAsNonRoot = false")
	}
	return p
}

func deref[T any](v *T) any {
	if v == nil {
		return "unset"
	}
	return *v
}

// checkAntiAffinity: the scheduler prefers one pod of the release per node.
func checkAntiAffinity(r *rendered) (p problems) {
	if r.deployment == nil || r.deployment.Spec.Selector == nil {
		return append(p, "no Deployment")
	}
	a := r.deployment.Spec.Template.Spec.Affinity
	if a == nil || a.PodAntiAffinity == nil {
		return append(p, "no pod anti-affinity")
	}
	terms := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	if len(terms) != 1 || len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		return append(p, fmt.Sprintf("want one preferred anti-affinity term and no required one, got %d and %d",
			len(terms), len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)))
	}
	t := terms[0]
	if t.Weight != 100 || t.PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" || t.PodAffinityTerm.LabelSelector == nil ||
		!reflect.DeepEqual(t.PodAffinityTerm.LabelSelector.MatchLabels, r.deployment.Spec.Selector.MatchLabels) ||
		len(t.PodAffinityTerm.LabelSelector.MatchExpressions) != 0 || len(t.PodAffinityTerm.Namespaces) != 0 {
		p.add("anti-affinity term %+v, want weight 100 on kubernetes.io/hostname for the Deployment's selector", t)
	}
	return p
}

// checkPDB: with more than one replica, a PodDisruptionBudget lets one pod
// of the release go at a time; with one, there is none (it would block
// node drains).
func checkPDB(r *rendered) (p problems) {
	if r.deployment == nil || r.deployment.Spec.Replicas == nil || r.deployment.Spec.Selector == nil {
		return append(p, "no Deployment")
	}
	if *r.deployment.Spec.Replicas <= 1 {
		if r.pdb != nil {
			p.add("a PodDisruptionBudget for %d replica", *r.deployment.Spec.Replicas)
		}
		return p
	}
	if r.pdb == nil {
		return append(p, fmt.Sprintf("no PodDisruptionBudget for %d replicas", *r.deployment.Spec.Replicas))
	}
	one := intstr.FromInt32(1)
	s := r.pdb.Spec
	if !(s.MaxUnavailable != nil && *s.MaxUnavailable == one && s.MinAvailable == nil) &&
		!(s.MinAvailable != nil && *s.MinAvailable == one && s.MaxUnavailable == nil) {
		p.add("PodDisruptionBudget maxUnavailable %v minAvailable %v, want maxUnavailable 1 or minAvailable 1", deref(s.MaxUnavailable), deref(s.MinAvailable))
	}
	if s.Selector == nil || !reflect.DeepEqual(s.Selector.MatchLabels, r.deployment.Spec.Selector.MatchLabels) || len(s.Selector.MatchExpressions) != 0 {
		p.add("the PodDisruptionBudget selects %v, not the Deployment's pods", s.Selector)
	}
	return p
}

// checkSecretEnv: the container's environment comes from Secret want
// (none when want is ""); the chart creates that Secret, with the keys
// createdKeys, only when createdKeys is not nil.
func checkSecretEnv(r *rendered, want string, createdKeys []string) (p problems) {
	c := r.container(&p)
	if c == nil {
		return p
	}
	var wantFrom []corev1.EnvFromSource
	if want != "" {
		wantFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: want}}}}
	}
	if !reflect.DeepEqual(c.EnvFrom, wantFrom) {
		var got []string
		for _, f := range c.EnvFrom {
			if f.SecretRef != nil {
				got = append(got, "secret "+f.SecretRef.Name)
			} else {
				got = append(got, "not a Secret")
			}
		}
		p.add("envFrom %q, want secret %q", got, want)
	}
	switch {
	case createdKeys == nil && r.secret != nil:
		p.add("the chart created Secret %s", r.secret.Name)
	case createdKeys != nil && r.secret == nil:
		p.add("the chart did not create Secret %s", want)
	case createdKeys != nil:
		var keys []string
		for k := range r.secret.StringData {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if r.secret.Name != want || r.secret.Type != corev1.SecretTypeOpaque || !slices.Equal(keys, createdKeys) || len(r.secret.Data) != 0 {
			p.add("Secret %s (%s) with keys %q, want %s (Opaque) with keys %q", r.secret.Name, r.secret.Type, keys, want, createdKeys)
		}
	}
	return p
}

// checkServiceAccount: the pods run as the chart's ServiceAccount, with no
// API token mounted.
func checkServiceAccount(r *rendered) (p problems) {
	if r.deployment == nil || r.serviceAccount == nil {
		return append(p, "no Deployment or no ServiceAccount")
	}
	spec := r.deployment.Spec.Template.Spec
	if spec.ServiceAccountName != r.serviceAccount.Name {
		p.add("the pods run as %q, not ServiceAccount %q", spec.ServiceAccountName, r.serviceAccount.Name)
	}
	if a := r.serviceAccount.AutomountServiceAccountToken; a == nil || *a {
		p.add("ServiceAccount automountServiceAccountToken = %v, want false", deref(a))
	}
	if a := spec.AutomountServiceAccountToken; a == nil || *a {
		p.add("pod automountServiceAccountToken = %v, want false", deref(a))
	}
	return p
}

// checkResources: the container's requests and limits are exactly want.
func checkResources(r *rendered, want corev1.ResourceRequirements) (p problems) {
	c := r.container(&p)
	if c == nil {
		return p
	}
	same := func(a, b corev1.ResourceList) bool {
		if len(a) != len(b) {
			return false
		}
		for k, q := range a {
			if w, ok := b[k]; !ok || q.Cmp(w) != 0 {
				return false
			}
		}
		return true
	}
	if !same(c.Resources.Requests, want.Requests) || !same(c.Resources.Limits, want.Limits) {
		p.add("resources requests %s limits %s, want requests %s limits %s", quantities(c.Resources.Requests), quantities(c.Resources.Limits), quantities(want.Requests), quantities(want.Limits))
	}
	for _, k := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[k]; !ok {
			p.add("no %s request", k)
		}
		if _, ok := c.Resources.Limits[k]; !ok {
			p.add("no %s limit", k)
		}
	}
	return p
}

// quantities shows a resource list as "cpu=100m memory=128Mi".
func quantities(l corev1.ResourceList) string {
	var out []string
	for k, q := range l {
		out = append(out, fmt.Sprintf("%s=%s", k, q.String()))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func resources(reqCPU, reqMem, limCPU, limMem string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(reqCPU), corev1.ResourceMemory: resource.MustParse(reqMem)},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limCPU), corev1.ResourceMemory: resource.MustParse(limMem)},
	}
}

// checkLabels: every object, and the pod template, carries the standard
// app.kubernetes.io labels of the release.
func checkLabels(r *rendered, version string) (p problems) {
	want := map[string]string{
		"app.kubernetes.io/name":       "jetbridge",
		"app.kubernetes.io/instance":   releaseName,
		"app.kubernetes.io/version":    version,
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/part-of":    "jetbridge",
		"app.kubernetes.io/component":  "bridge",
		"helm.sh/chart":                "jetbridge-0.1.0",
	}
	has := func(what string, labels map[string]string) {
		for k, v := range want {
			if labels[k] != v {
				p.add("%s: label %s = %q, want %q", what, k, labels[k], v)
			}
		}
	}
	for _, o := range r.objects {
		has(o.kind+" "+o.name, o.labels)
	}
	if r.deployment != nil {
		has("the pod template", r.deployment.Spec.Template.Labels)
	}
	return p
}

const checksumKey = "checksum/config"

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// checkChecksum: each render's pod template carries the sha256 of its
// rendered ConfigMap's bridge.yaml, so the two differ exactly when the configurations
// differ (configChanged).
func checkChecksum(a, b *rendered, configChanged bool) (p problems) {
	var sums [2]string
	for i, r := range []*rendered{a, b} {
		if r.deployment == nil {
			return append(p, "no Deployment")
		}
		sums[i] = r.deployment.Spec.Template.Annotations[checksumKey]
		if !sha256Hex.MatchString(sums[i]) {
			p.add("pod template annotation %s = %q, not a sha256", checksumKey, sums[i])
		}
		var q problems
		if r.bridgeConfig(&q); len(q) > 0 || sums[i] != sha256Sum([]byte(r.configMap.Data["bridge.yaml"])) {
			p.add("%s is not the sha256 of the rendered ConfigMap's bridge.yaml %v", checksumKey, q)
		}
	}
	if changed := sums[0] != sums[1]; changed != configChanged {
		p.add("%s changed = %v, want %v (configuration changed = %v)", checksumKey, changed, configChanged, configChanged)
	}
	return p
}

func sha256Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// monitoring is what a render with the Prometheus Operator resources on
// should hold.
type monitoring struct {
	interval string
	labels   map[string]string // extra labels on both objects
	// With config admin.token: the Secret and key the scrape's bearer
	// token comes from.
	tokenSecret, tokenKey string
	// With config admin.tls: the CA and the name Prometheus verifies the
	// certificate with (the scheme is then https).
	ca         *monitoringv1.SecretOrConfigMap
	serverName string
}

// endpoint is the ServiceMonitor endpoint m describes, exactly.
func (m *monitoring) endpoint() monitoringv1.Endpoint {
	scheme := monitoringv1.Scheme("http")
	e := monitoringv1.Endpoint{Port: "admin", Path: "/metrics", Interval: monitoringv1.Duration(m.interval), ScrapeTimeout: "10s"}
	if m.tokenSecret != "" {
		e.Authorization = &monitoringv1.SafeAuthorization{Type: "Bearer", Credentials: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: m.tokenSecret}, Key: m.tokenKey,
		}}
	}
	if m.ca != nil {
		scheme = "https"
		serverName := m.serverName
		e.TLSConfig = &monitoringv1.TLSConfig{SafeTLSConfig: monitoringv1.SafeTLSConfig{CA: *m.ca, ServerName: &serverName}}
	}
	e.Scheme = &scheme
	return e
}

// checkMonitoring: with want nil, no ServiceMonitor and no PrometheusRule;
// otherwise a ServiceMonitor scraping /metrics on the admin port of the
// release's Service every want.interval as job "jetbridge", exactly with
// want's credentials and TLS, which the configuration's admin.token and
// admin.tls call for and the pods' Secret holds; and a PrometheusRule with
// the groups of the chart's files/alerts.yml.
func checkMonitoring(r *rendered, want *monitoring, alertsFile []byte) (p problems) {
	if want == nil {
		if r.serviceMonitor != nil || r.prometheusRule != nil {
			p.add("ServiceMonitor %v, PrometheusRule %v: want neither", r.serviceMonitor != nil, r.prometheusRule != nil)
		}
		return p
	}
	sm, pr := r.serviceMonitor, r.prometheusRule
	if sm == nil || pr == nil || r.service == nil {
		return append(p, fmt.Sprintf("ServiceMonitor %v, PrometheusRule %v, Service %v: want all three", sm != nil, pr != nil, r.service != nil))
	}
	for k, v := range want.labels {
		if sm.Labels[k] != v || pr.Labels[k] != v {
			p.add("label %s=%s missing on the ServiceMonitor or the PrometheusRule", k, v)
		}
	}
	// The Prometheus Operator names the job after the Service's jobLabel
	// label; the alerts select job="jetbridge".
	if job := r.service.Labels[sm.Spec.JobLabel]; sm.Spec.JobLabel == "" || job != "jetbridge" {
		p.add("ServiceMonitor jobLabel %q gives job %q, want \"jetbridge\" (the alerts select up{job=\"jetbridge\"})", sm.Spec.JobLabel, job)
	}
	sel := sm.Spec.Selector.MatchLabels
	if len(sel) == 0 || len(sm.Spec.Selector.MatchExpressions) != 0 {
		p.add("ServiceMonitor selector %+v", sm.Spec.Selector)
	}
	for k, v := range sel {
		if r.service.Labels[k] != v {
			p.add("the ServiceMonitor selects %s=%s, which the Service does not have", k, v)
		}
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) || sm.Spec.NamespaceSelector.Any {
		p.add("ServiceMonitor namespaceSelector %+v, want [%s]", sm.Spec.NamespaceSelector, namespace)
	}
	if len(sm.Spec.Endpoints) != 1 {
		p.add("ServiceMonitor: %d endpoints, want 1", len(sm.Spec.Endpoints))
	} else if e, w := sm.Spec.Endpoints[0], want.endpoint(); !reflect.DeepEqual(e, w) {
		g, _ := json.Marshal(e)
		wj, _ := json.Marshal(w)
		p.add("ServiceMonitor endpoint %s, want %s", g, wj)
	}
	p = append(p, checkScrapeCredentials(r, want)...)
	p = append(p, compareGroups(r, alertsFile)...)
	return p
}

// checkScrapeCredentials: the wanted endpoint sends a token exactly when the
// configuration has admin.token and is https exactly when it has
// admin.tls; the rendered token's Secret is the one the pods' environment
// comes from, holding the key (when the chart makes it), and with a token
// written ${NAME} the key is NAME.
func checkScrapeCredentials(r *rendered, want *monitoring) (p problems) {
	cfg := r.bridgeConfig(&p)
	if cfg == nil {
		return p
	}
	token, _ := dig(cfg, "admin", "token").(string)
	if (token != "") != (want.tokenSecret != "") {
		p.add("config admin.token set = %v, but the wanted endpoint sends credentials = %v", token != "", want.tokenSecret != "")
	}
	if tls := adminTLS(cfg); tls != (want.ca != nil) {
		p.add("config admin.tls set = %v, but the wanted endpoint is https = %v", tls, want.ca != nil)
	}
	if r.serviceMonitor == nil || len(r.serviceMonitor.Spec.Endpoints) != 1 {
		return p
	}
	a := r.serviceMonitor.Spec.Endpoints[0].Authorization
	if a == nil || a.Credentials == nil {
		return p
	}
	name, key := a.Credentials.Name, a.Credentials.Key
	var envSecret string
	if c := r.container(&p); c != nil && len(c.EnvFrom) == 1 && c.EnvFrom[0].SecretRef != nil {
		envSecret = c.EnvFrom[0].SecretRef.Name
	}
	if name != envSecret {
		p.add("the ServiceMonitor's credentials name Secret %q, not the pods' environment Secret %q", name, envSecret)
	}
	if r.secret != nil && r.secret.Name == name {
		if _, ok := r.secret.StringData[key]; !ok {
			p.add("the chart's Secret %s has no key %s, which the ServiceMonitor sends", name, key)
		}
	}
	if m := envReference.FindStringSubmatch(token); m != nil && m[1] != key {
		p.add("config admin.token reads ${%s}, but the ServiceMonitor sends key %s", m[1], key)
	}
	return p
}

// envReference is a whole value ${NAME}.
var envReference = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$`)

// compareGroups: the rendered PrometheusRule's spec.groups, as rendered,
// equal the groups of a Prometheus rules file; the file's groups also
// decode strictly into the Prometheus Operator's types.
func compareGroups(r *rendered, rulesFile []byte) (p problems) {
	var doc []byte
	for _, o := range r.objects {
		if o.kind == "PrometheusRule" {
			doc = o.raw
		}
	}
	if doc == nil {
		return append(p, "no PrometheusRule")
	}
	var rendered, file map[string]any
	if j, err := yaml.YAMLToJSONStrict(doc); err != nil || json.Unmarshal(j, &rendered) != nil {
		return append(p, fmt.Sprintf("the PrometheusRule: %v", err))
	}
	j, err := yaml.YAMLToJSONStrict(rulesFile)
	if err == nil {
		err = json.Unmarshal(j, &file)
	}
	if err != nil {
		return append(p, fmt.Sprintf("the rules file: %v", err))
	}
	if err := decodeStrict(rulesFile, &monitoringv1.PrometheusRuleSpec{}); err != nil {
		p.add("the rules file: %v", err)
	}
	got, want := dig(rendered, "spec", "groups"), file["groups"]
	if want == nil {
		p.add("the rules file has no groups")
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", "  ")
		w, _ := json.MarshalIndent(want, "", "  ")
		p.add("the PrometheusRule's spec.groups differ from the rules file's groups:\nrendered: %s\nfile: %s", g, w)
	}
	return p
}
