package helm_test

import (
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// TestChecksCatchBrokenRenders shows every check failing: each case breaks
// one property, through the values where the chart lets an operator do it,
// otherwise by editing the decoded objects of a good render, and requires
// the check to report it.
func TestChecksCatchBrokenRenders(t *testing.T) {
	// edit renders valuesYAML and applies f to the result.
	edit := func(valuesYAML string, f func(r *rendered)) *rendered {
		r := mustRender(t, valuesYAML)
		if f != nil {
			f(r)
		}
		return r
	}
	bridge := func(r *rendered) *corev1.Container { return &r.deployment.Spec.Template.Spec.Containers[0] }
	defaults := resources("100m", "128Mi", "1", "512Mi")
	alerts := chartAlerts(t)
	mon := &monitoring{interval: "30s"}
	monValues := "serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n"
	tokenValues := monValues + "existingSecret: jetbridge-env\nconfig: {admin: {token: \"${ADMIN_TOKEN}\"}}\n"
	tokenMon := &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN"}
	tlsValues := tlsMonitorValues
	tlsMon := &monitoring{interval: "30s", tokenSecret: "jetbridge-env", tokenKey: "ADMIN_TOKEN", ca: caSecret("jetbridge-admin-tls", "ca.crt"), serverName: "jetbridge.events.svc"}

	cases := []struct {
		name  string
		check func() problems
		want  string
	}{
		{"replicas", func() problems { return checkReplicas(mustRender(t, "replicaCount: 3\n"), 2) }, "replicas = 3, want 2"},

		{"image", func() problems {
			return checkContainer(mustRender(t, "image: {tag: v9}\n"), "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil)
		}, "image jetbridge:v9 (IfNotPresent), want jetbridge:v0.1.0"},
		{"args", func() problems {
			return checkContainer(edit("", func(r *rendered) { bridge(r).Args = []string{"run", "--no-delivery"} }), "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil)
		}, "want the image's entrypoint with args [run]"},
		{"env", func() problems {
			return checkContainer(mustRender(t, "env: [{name: A, value: b}]\n"), "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil)
		}, "env [BRIDGE_CONFIG A], want [BRIDGE_CONFIG]"},
		{"config mount", func() problems {
			return checkContainer(edit("", func(r *rendered) { bridge(r).VolumeMounts[0].ReadOnly = false }), "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil)
		}, "/etc/jetbridge is mounted writable"},
		{"config volume", func() problems {
			return checkContainer(edit("", func(r *rendered) { r.deployment.Spec.Template.Spec.Volumes[0].ConfigMap.Name = "other" }), "jetbridge:v0.1.0", corev1.PullIfNotPresent, nil)
		}, "/etc/jetbridge is not the whole chart's ConfigMap"},

		{"readiness path", func() problems {
			return checkProbes(edit("", func(r *rendered) { bridge(r).ReadinessProbe.HTTPGet.Path = "/healthz" }), 8088, corev1.URISchemeHTTP)
		}, `readiness probe {"httpGet":{"path":"/healthz","port":"admin","scheme":"HTTP"},"timeoutSeconds":2,"periodSeconds":5,"failureThreshold":2}, want {"httpGet":{"path":"/readyz"`},
		{"liveness port", func() problems {
			return checkProbes(edit("", func(r *rendered) { bridge(r).LivenessProbe.HTTPGet.Port = intstr.FromInt32(8088) }), 8088, corev1.URISchemeHTTP)
		}, `liveness probe {"httpGet":{"path":"/healthz","port":8088,"scheme":"HTTP"}`},
		{"probe timing", func() problems {
			return checkProbes(edit("", func(r *rendered) { bridge(r).LivenessProbe.TimeoutSeconds = 1 }), 8088, corev1.URISchemeHTTP)
		}, `liveness probe {"httpGet":{"path":"/healthz","port":"admin","scheme":"HTTP"},"initialDelaySeconds":5,"timeoutSeconds":1`},
		{"probes HTTP with admin.tls", func() problems {
			return checkProbes(edit(adminTLSValues, func(r *rendered) { bridge(r).ReadinessProbe.HTTPGet.Scheme = corev1.URISchemeHTTP }), 8088, corev1.URISchemeHTTPS)
		}, `readiness probe {"httpGet":{"path":"/readyz","port":"admin","scheme":"HTTP"}`},
		{"probes HTTPS without admin.tls", func() problems {
			return checkProbes(mustRender(t, ""), 8088, corev1.URISchemeHTTPS)
		}, "config admin.tls set = false, but the probes are wanted over HTTPS"},
		{"probes HTTP wanted with admin.tls", func() problems {
			return checkProbes(mustRender(t, adminTLSValues), 8088, corev1.URISchemeHTTP)
		}, `liveness probe {"httpGet":{"path":"/healthz","port":"admin","scheme":"HTTPS"}`},
		{"admin port", func() problems {
			return checkProbes(mustRender(t, "config: {admin: {listen: \"0.0.0.0:9090\"}}\n"), 8088, corev1.URISchemeHTTP)
		}, "container ports"},
		{"service type", func() problems {
			return checkProbes(mustRender(t, "service: {type: NodePort}\n"), 8088, corev1.URISchemeHTTP)
		}, "Service NodePort"},
		{"service selector", func() problems {
			return checkProbes(edit("", func(r *rendered) { r.service.Spec.Selector = map[string]string{"app": "x"} }), 8088, corev1.URISchemeHTTP)
		}, "the Service selects map[app:x], not the Deployment's pods"},

		{"grace equal", func() problems {
			return checkGrace(edit("", func(r *rendered) { g := int64(30); r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds = &g }))
		}, "terminationGracePeriodSeconds 30 is not longer than shutdown_timeout 30s"},
		{"grace behind a longer timeout", func() problems {
			return checkGrace(edit("", func(r *rendered) {
				r.configMap.Data["bridge.yaml"] = strings.Replace(r.configMap.Data["bridge.yaml"], "shutdown_timeout: 30s", "shutdown_timeout: 2m", 1)
			}))
		}, "terminationGracePeriodSeconds 45 is not longer than shutdown_timeout 2m0s"},
		{"grace unset", func() problems {
			return checkGrace(edit("", func(r *rendered) { r.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds = nil }))
		}, "terminationGracePeriodSeconds not set"},

		{"writable root", func() problems {
			return checkSecurity(mustRender(t, "securityContext: {readOnlyRootFilesystem: false}\n"))
		}, "readOnlyRootFilesystem = false, want true"},
		{"privilege escalation", func() problems {
			return checkSecurity(mustRender(t, "securityContext: {allowPrivilegeEscalation: null}\n"))
		}, "allowPrivilegeEscalation = unset, want false"},
		{"capabilities", func() problems {
			return checkSecurity(mustRender(t, "securityContext: {capabilities: {drop: [NET_RAW]}}\n"))
		}, "want drop [ALL]"},
		{"root", func() problems {
			return checkSecurity(mustRender(t, "podSecurityContext: {runAsUser: 0, runAsNonRoot: false}\n"))
		}, "pod runAsUser = 0, want 65532"},
		{"fsGroup", func() problems { return checkSecurity(mustRender(t, "podSecurityContext: {fsGroup: null}\n")) }, "pod fsGroup = unset, want 65532"},
		{"seccomp", func() problems {
			return checkSecurity(mustRender(t, "podSecurityContext: {seccompProfile: {type: Unconfined}}\n"))
		}, "want RuntimeDefault"},

		{"affinity replaced", func() problems {
			return checkAntiAffinity(mustRender(t, "affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, preference: {matchExpressions: [{key: a, operator: Exists}]}}]}}\n"))
		}, "no pod anti-affinity"},
		{"affinity topology", func() problems {
			return checkAntiAffinity(edit("", func(r *rendered) {
				r.deployment.Spec.Template.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey = "topology.kubernetes.io/zone"
			}))
		}, "want weight 100 on kubernetes.io/hostname"},

		{"no PDB", func() problems { return checkPDB(mustRender(t, "podDisruptionBudget: {enabled: false}\n")) }, "no PodDisruptionBudget for 2 replicas"},
		{"PDB of 2", func() problems { return checkPDB(mustRender(t, "podDisruptionBudget: {maxUnavailable: 2}\n")) }, "want maxUnavailable 1 or minAvailable 1"},
		{"PDB selector", func() problems {
			return checkPDB(edit("", func(r *rendered) { r.pdb.Spec.Selector.MatchLabels = map[string]string{"app": "x"} }))
		}, "not the Deployment's pods"},
		{"PDB for one replica", func() problems {
			return checkPDB(edit("", func(r *rendered) { one := int32(1); r.deployment.Spec.Replicas = &one }))
		}, "a PodDisruptionBudget for 1 replica"},

		{"existingSecret name", func() problems { return checkSecretEnv(mustRender(t, "existingSecret: other\n"), "jetbridge-env", nil) }, `envFrom ["secret other"], want secret "jetbridge-env"`},
		{"chart-made Secret unexpected", func() problems { return checkSecretEnv(mustRender(t, secretEnvValues), "jetbridge", nil) }, "the chart created Secret jetbridge"},
		{"chart-made Secret missing", func() problems {
			return checkSecretEnv(mustRender(t, "existingSecret: jetbridge\n"), "jetbridge", []string{"NATS_URL"})
		}, "the chart did not create Secret jetbridge"},
		{"chart-made Secret keys", func() problems {
			return checkSecretEnv(mustRender(t, secretEnvValues), "jetbridge", []string{"NATS_URL"})
		}, `with keys ["DESTINATION_URL" "NATS_URL"], want jetbridge (Opaque) with keys ["NATS_URL"]`},
		{"no secret at all", func() problems { return checkSecretEnv(mustRender(t, ""), "jetbridge-env", nil) }, `envFrom [], want secret "jetbridge-env"`},

		{"token mounted", func() problems {
			return checkServiceAccount(edit("", func(r *rendered) { yes := true; r.deployment.Spec.Template.Spec.AutomountServiceAccountToken = &yes }))
		}, "pod automountServiceAccountToken = true, want false"},
		{"ServiceAccount token", func() problems {
			return checkServiceAccount(edit("", func(r *rendered) { r.serviceAccount.AutomountServiceAccountToken = nil }))
		}, "ServiceAccount automountServiceAccountToken = unset, want false"},
		{"no ServiceAccount", func() problems { return checkServiceAccount(mustRender(t, "serviceAccount: {create: false}\n")) }, "no Deployment or no ServiceAccount"},
		{"another ServiceAccount", func() problems {
			return checkServiceAccount(edit("", func(r *rendered) { r.deployment.Spec.Template.Spec.ServiceAccountName = "default" }))
		}, `the pods run as "default", not ServiceAccount "jetbridge"`},

		{"resources", func() problems {
			return checkResources(mustRender(t, "resources: {requests: {cpu: 200m}}\n"), defaults)
		}, "resources requests cpu=200m memory=128Mi limits cpu=1 memory=512Mi, want requests cpu=100m memory=128Mi"},
		{"no limits", func() problems {
			return checkResources(mustRender(t, "resources: {limits: null}\n"), resources("100m", "128Mi", "0", "0"))
		}, "no cpu limit"},

		{"object label", func() problems {
			return checkLabels(edit("", func(r *rendered) { delete(r.objects[0].labels, "app.kubernetes.io/part-of") }), "v0.1.0")
		}, `label app.kubernetes.io/part-of = "", want "jetbridge"`},
		{"pod label", func() problems {
			return checkLabels(edit("", func(r *rendered) { delete(r.deployment.Spec.Template.Labels, "app.kubernetes.io/version") }), "v0.1.0")
		}, `the pod template: label app.kubernetes.io/version = "", want "v0.1.0"`},

		{"checksum unchanged with the config", func() problems {
			return checkChecksum(mustRender(t, ""), mustRender(t, ""), true)
		}, "checksum/config changed = false, want true"},
		{"checksum changed without the config", func() problems {
			return checkChecksum(mustRender(t, ""), mustRender(t, "config: {log: {level: warn}}\n"), false)
		}, "checksum/config changed = true, want false"},
		{"checksum frozen", func() problems {
			base := mustRender(t, "")
			return checkChecksum(base, edit("config: {log: {level: warn}}\n", func(r *rendered) {
				r.deployment.Spec.Template.Annotations[checksumKey] = base.deployment.Spec.Template.Annotations[checksumKey]
			}), true)
		}, "checksum/config is not the sha256 of the rendered ConfigMap's bridge.yaml"},
		{"checksum missing", func() problems {
			return checkChecksum(mustRender(t, ""), edit("", func(r *rendered) { delete(r.deployment.Spec.Template.Annotations, checksumKey) }), true)
		}, `pod template annotation checksum/config = "", not a sha256`},

		{"monitoring off", func() problems { return checkMonitoring(mustRender(t, ""), mon, alerts) }, "ServiceMonitor false, PrometheusRule false, Service true: want all three"},
		{"monitoring on by default", func() problems { return checkMonitoring(mustRender(t, customValues), nil, nil) }, "want neither"},
		{"only the ServiceMonitor", func() problems {
			return checkMonitoring(mustRender(t, "serviceMonitor: {enabled: true}\n"), mon, alerts)
		}, "ServiceMonitor true, PrometheusRule false"},
		{"scrape interval", func() problems { return checkMonitoring(mustRender(t, customValues), mon, alerts) }, `"interval":"15s","scrapeTimeout":"10s"}, want {"port":"admin","path":"/metrics","scheme":"http","interval":"30s"`},
		{"monitoring labels", func() problems {
			return checkMonitoring(mustRender(t, "serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n"), &monitoring{interval: "30s", labels: map[string]string{"release": "prom"}}, alerts)
		}, "label release=prom missing"},
		{"ServiceMonitor port", func() problems {
			return checkMonitoring(edit("serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n", func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].Port = "http" }), mon, alerts)
		}, `ServiceMonitor endpoint {"port":"http","path":"/metrics"`},
		{"scrape without the token", func() problems {
			return checkMonitoring(edit(tokenValues, func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].Authorization = nil }), tokenMon, alerts)
		}, `ServiceMonitor endpoint {"port":"admin","path":"/metrics","scheme":"http","interval":"30s","scrapeTimeout":"10s"}, want {"port":"admin","path":"/metrics","scheme":"http","interval":"30s","scrapeTimeout":"10s","authorization":{"type":"Bearer","credentials":{"name":"jetbridge-env","key":"ADMIN_TOKEN"}}}`},
		{"token wanted without admin.token", func() problems {
			return checkMonitoring(mustRender(t, monValues+"existingSecret: jetbridge-env\n"), tokenMon, alerts)
		}, "config admin.token set = false, but the wanted endpoint sends credentials = true"},
		{"no token wanted with admin.token", func() problems { return checkMonitoring(mustRender(t, tokenValues), mon, alerts) }, "config admin.token set = true, but the wanted endpoint sends credentials = false"},
		{"token from another Secret", func() problems {
			other := *tokenMon
			other.tokenSecret = "other"
			return checkMonitoring(edit(tokenValues, func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].Authorization.Credentials.Name = "other" }), &other, alerts)
		}, `the ServiceMonitor's credentials name Secret "other", not the pods' environment Secret "jetbridge-env"`},
		{"token key not in the chart's Secret", func() problems {
			values := monValues + secretEnvValues + "  ADMIN_TOKEN: " + testAdminToken + "\nconfig: {admin: {token: \"${file:/run/secrets/admin-token}\"}}\n"
			other := &monitoring{interval: "30s", tokenSecret: "jetbridge", tokenKey: "OTHER"}
			return checkMonitoring(edit(values, func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].Authorization.Credentials.Key = "OTHER" }), other, alerts)
		}, "the chart's Secret jetbridge has no key OTHER, which the ServiceMonitor sends"},
		{"token key not the variable", func() problems {
			other := *tokenMon
			other.tokenKey = "OTHER"
			return checkMonitoring(edit(tokenValues, func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].Authorization.Credentials.Key = "OTHER" }), &other, alerts)
		}, "config admin.token reads ${ADMIN_TOKEN}, but the ServiceMonitor sends key OTHER"},
		{"scrape over http with admin.tls", func() problems {
			return checkMonitoring(edit(tlsValues, func(r *rendered) {
				http := monitoringv1.Scheme("http")
				r.serviceMonitor.Spec.Endpoints[0].Scheme = &http
			}), tlsMon, alerts)
		}, `ServiceMonitor endpoint {"port":"admin","path":"/metrics","scheme":"http"`},
		{"scrape without tlsConfig", func() problems {
			return checkMonitoring(edit(tlsValues, func(r *rendered) { r.serviceMonitor.Spec.Endpoints[0].TLSConfig = nil }), tlsMon, alerts)
		}, `"authorization":{"type":"Bearer","credentials":{"name":"jetbridge-env","key":"ADMIN_TOKEN"}}}, want`},
		{"scrape for another server name", func() problems {
			other := *tlsMon
			other.serverName = "jetbridge.other.svc"
			return checkMonitoring(mustRender(t, tlsValues), &other, alerts)
		}, `"serverName":"jetbridge.events.svc"}}, want`},
		{"scrape with another CA", func() problems {
			other := *tlsMon
			other.ca = &monitoringv1.SecretOrConfigMap{ConfigMap: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "jetbridge-admin-tls"}, Key: "ca.crt"}}
			return checkMonitoring(mustRender(t, tlsValues), &other, alerts)
		}, `"tlsConfig":{"ca":{"secret":{"name":"jetbridge-admin-tls","key":"ca.crt"}}`},
		{"https wanted without admin.tls", func() problems { return checkMonitoring(mustRender(t, tokenValues), tlsMon, alerts) }, "config admin.tls set = false, but the wanted endpoint is https = true"},
		{"config", func() problems { return compareConfig(mustRender(t, "config: {log: {level: warn}}\n"), defaultConfig) }, "the ConfigMap's bridge.yaml is"},
		{"config lost", func() problems {
			return compareConfig(edit("", func(r *rendered) { r.configMap.Data = map[string]string{"config.yaml": "{}"} }), defaultConfig)
		}, "the ConfigMap must hold exactly bridge.yaml"},
		{"job name", func() problems {
			return checkMonitoring(mustRender(t, "nameOverride: bridge\nserviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n"), mon, alerts)
		}, `ServiceMonitor jobLabel "app.kubernetes.io/name" gives job "bridge", want "jetbridge"`},
		{"no job label", func() problems {
			return checkMonitoring(edit("serviceMonitor: {enabled: true}\nprometheusRule: {enabled: true}\n", func(r *rendered) { r.serviceMonitor.Spec.JobLabel = "" }), mon, alerts)
		}, `ServiceMonitor jobLabel "" gives job ""`},
		{"rules differ", func() problems {
			return compareGroups(mustRender(t, "prometheusRule: {enabled: true}\n"), editFirstRule(t, alerts, "expr", "vector(1)"))
		}, "the PrometheusRule's spec.groups differ from the rules file's groups"},
		{"rules file not the operator's", func() problems {
			return compareGroups(mustRender(t, "prometheusRule: {enabled: true}\n"), editFirstRule(t, alerts, "fro", "5m"))
		}, `unknown field "groups[0].rules[0].fro"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.check()
			if len(p) == 0 {
				t.Fatalf("the check passed a broken render (%s)", c.name)
			}
			if !strings.Contains(strings.Join(p, "\n"), c.want) {
				t.Errorf("the check reported:\n  %s\nwant a problem containing %q", strings.Join(p, "\n  "), c.want)
			}
		})
	}
}

// editFirstRule returns a rules file with key set to value in its first
// group's first rule.
func editFirstRule(t *testing.T, rulesFile []byte, key, value string) []byte {
	t.Helper()
	var f struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(rulesFile, &f); err != nil || len(f.Groups) == 0 {
		t.Fatalf("the rules file: %v (%d groups)", err, len(f.Groups))
	}
	rules, _ := f.Groups[0]["rules"].([]any)
	if len(rules) == 0 {
		t.Fatal("the rules file's first group has no rule")
	}
	rules[0].(map[string]any)[key] = value
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
