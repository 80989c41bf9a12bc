package monitoring

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// shortFor is the for: of every alert in the end-to-end test's copy of
// alerts.yml.
const shortFor = "3s"

var forLine = regexp.MustCompile(`(?m)^(\s+)for: \S+$`)

// shortenFor returns alerts.yml with every for: duration set to shortFor
// and nothing else changed.
func shortenFor(rules []byte) []byte {
	header := "# A copy of alerts.yml for the end-to-end test: ONLY the for: durations are\n" +
		"# shortened (to " + shortFor + "); the expressions, labels and annotations are verbatim.\n"
	return append([]byte(header), forLine.ReplaceAll(rules, []byte("${1}for: "+shortFor))...)
}

func TestShortenForChangesOnlyFor(t *testing.T) {
	orig, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	a, err := loadRules(orig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadRules(shortenFor(orig))
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("%d rules, the copy has %d", len(a), len(b))
	}
	withFor := 0
	for i := range a {
		if a[i].For != "" {
			withFor++
			if b[i].For != shortFor {
				t.Errorf("%s: for %q in the copy, want %s", a[i].Alert, b[i].For, shortFor)
			}
		}
		if b[i].For != "" && a[i].For == "" {
			t.Errorf("%s: the copy has a for: the original has not", a[i].Alert)
		}
		if a[i].Alert != b[i].Alert || a[i].Expr != b[i].Expr || !maps.Equal(a[i].Labels, b[i].Labels) || !maps.Equal(a[i].Annotations, b[i].Annotations) {
			t.Errorf("%s: the copy differs beyond for:", a[i].Alert)
		}
	}
	if n := len(forLine.FindAll(orig, -1)); n != withFor || n == 0 {
		t.Errorf("%d for: lines rewritten, %d rules have a for:", n, withFor)
	}
}

// promAlert is one alert of GET /api/v1/alerts.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

// promServer is a Prometheus child process and its HTTP API.
type promServer struct {
	*child
	base string
}

func (p *promServer) get(path string, query url.Values, into any) error {
	u := p.base + path
	if query != nil {
		u += "?" + query.Encode()
	}
	code, body, err := httpGet(u)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, body)
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("GET %s: status %q: %s", path, env.Status, body)
	}
	return json.Unmarshal(env.Data, into)
}

// alerts returns the active (pending or firing) alerts named name.
func (p *promServer) alerts(name string) ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(data.Alerts, func(a promAlert) bool { return a.Labels["alertname"] != name }), nil
}

// query runs an instant query and returns how many series it returned.
func (p *promServer) query(q string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	err := p.get("/api/v1/query", url.Values{"query": {q}}, &data)
	return len(data.Result), err
}

// rule returns the state and health of an alerting rule, and the time of
// its group's last evaluation.
func (p *promServer) rule(name string) (state, health string, last time.Time, err error) {
	var data struct {
		Groups []struct {
			Rules []struct {
				Name           string    `json:"name"`
				State          string    `json:"state"`
				Health         string    `json:"health"`
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get("/api/v1/rules", nil, &data); err != nil {
		return "", "", time.Time{}, err
	}
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			if r.Name == name {
				return r.State, r.Health, r.LastEvaluation, nil
			}
		}
	}
	return "", "", time.Time{}, fmt.Errorf("no rule %s", name)
}

// startPrometheus starts a Prometheus server that scrapes target as job
// jetbridge every second and evaluates rules (a file) every second.
func startPrometheus(t *testing.T, target, rules string) *promServer {
	t.Helper()
	exe := tool(t, "prometheus")
	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: jetbridge
    static_configs:
      - targets: ["%s"]
`, rules, target)
	path := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	p := &promServer{base: "http://" + addr}
	p.child = startChild(t, "prometheus", dir, childEnv(), exe,
		"--config.file="+path,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	waitFor(t, "Prometheus /-/ready", 60*time.Second, []*child{p.child}, func() (bool, string) {
		code, body, err := httpGet(p.base + "/-/ready")
		return err == nil && code == http.StatusOK, fmt.Sprintf("%d %s %v", code, body, err)
	})
	return p
}

// TestBreakerAlertEndToEnd: a real Prometheus scrapes a real bridge and
// evaluates alerts.yml (for: shortened); JetbridgeCircuitBreakerOpen is
// inactive while the destination answers, fires for the destination once
// it answers 503 and the breaker opens, and resolves once it answers again.
func TestBreakerAlertEndToEnd(t *testing.T) {
	tool(t, "prometheus")
	const alert = "JetbridgeCircuitBreakerOpen"
	dest := startDestination(t)
	b := startBridge(t, dest.URL, startCollector(t))

	orig, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(t.TempDir(), "alerts-short-for.yml")
	if err := os.WriteFile(rules, shortenFor(orig), 0o600); err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, b.admin, rules)
	alive := []*child{b.child, prom.child}

	// Healthy: events delivered, scraped, and the rules evaluated after
	// that scrape; the alert is inactive.
	for range 3 {
		b.publish(t)
	}
	delivered := `bridge_messages_total{job="jetbridge",route="e2e",outcome="delivered"} >= 3`
	waitFor(t, "Prometheus to scrape 3 deliveries", 60*time.Second, alive, func() (bool, string) {
		n, err := prom.query(delivered)
		return err == nil && n == 1, fmt.Sprintf("%d series, %v", n, err)
	})
	seen := time.Now()
	waitFor(t, "an evaluation of the rules after that scrape", 30*time.Second, alive, func() (bool, string) {
		_, _, last, err := prom.rule(alert)
		return err == nil && last.After(seen), fmt.Sprintf("last evaluation %s, %v", last, err)
	})
	if state, health, _, err := prom.rule(alert); err != nil || state != "inactive" || health != "ok" {
		t.Fatalf("before the outage: %s is %q (health %q, %v), want inactive and ok", alert, state, health, err)
	}
	if active, err := prom.alerts(alert); err != nil || len(active) != 0 {
		t.Fatalf("before the outage: active alerts %+v (%v), want none", active, err)
	}
	if n, err := prom.query(`bridge_circuit_state{job="jetbridge",destination="hook"} == 0`); err != nil || n != 1 {
		t.Fatalf("before the outage: bridge_circuit_state of hook is not 0 in Prometheus (%d series, %v)", n, err)
	}

	// The destination answers 503: the breaker opens, the held messages
	// probe it and fail, and the alert fires.
	dest.down.Store(true)
	for range 4 {
		b.publish(t)
	}
	var firing promAlert
	states := map[string]bool{}
	waitFor(t, alert+" firing", 60*time.Second, alive, func() (bool, string) {
		active, err := prom.alerts(alert)
		for _, a := range active {
			states[a.State] = true
			if a.State == "firing" {
				firing = a
				return true, ""
			}
		}
		return false, fmt.Sprintf("active %+v, %v; the destination answered 503 %d times", active, err, dest.bad.Load())
	})
	wantLabels := map[string]string{
		"alertname":   alert,
		"destination": "hook",
		"instance":    b.admin,
		"job":         "jetbridge",
		"severity":    "page",
	}
	if !maps.Equal(firing.Labels, wantLabels) {
		t.Errorf("firing labels %v, want %v", firing.Labels, wantLabels)
	}
	wantAnnotations := map[string]string{
		"summary":     "Circuit breaker open for destination hook",
		"description": "jetbridge " + b.admin + " has held every request to destination hook for 5 minutes (circuit breaker open, probes failing): its routes deliver nothing and their messages wait.",
		"runbook_url": runbookBase + "#jetbridgecircuitbreakeropen",
	}
	if !maps.Equal(firing.Annotations, wantAnnotations) {
		t.Errorf("firing annotations %v, want %v", firing.Annotations, wantAnnotations)
	}
	t.Logf("states seen while the destination was down: %v; it answered 503 %d times", slices.Sorted(maps.Keys(states)), dest.bad.Load())

	// The destination answers again: a probe succeeds, the breaker closes,
	// and the alert resolves. Events keep coming meanwhile.
	okBefore := dest.ok.Load()
	dest.down.Store(false)
	lastPublish := time.Time{}
	waitFor(t, alert+" resolved", 60*time.Second, alive, func() (bool, string) {
		if time.Since(lastPublish) >= time.Second {
			b.publish(t)
			lastPublish = time.Now()
		}
		active, err := prom.alerts(alert)
		return err == nil && len(active) == 0, fmt.Sprintf("active %+v, %v", active, err)
	})
	if n, err := prom.query(`bridge_circuit_state{job="jetbridge",destination="hook"} == 0`); err != nil || n != 1 {
		t.Errorf("after the outage: bridge_circuit_state of hook is not 0 in Prometheus (%d series, %v)", n, err)
	}
	if dest.ok.Load() <= okBefore {
		t.Errorf("no delivery succeeded after the destination came back")
	}
}

// TestMetricsExported: every metric the dashboard and the alerts read is
// exported by a running bridge after traffic (up aside: Prometheus makes
// it); and the check reports a misspelled name, exactly.
func TestMetricsExported(t *testing.T) {
	dest := startDestination(t)
	b := startBridge(t, dest.URL, startCollector(t))
	b.publish(t)
	waitFor(t, "a delivery", 60*time.Second, []*child{b.child}, func() (bool, string) {
		return dest.ok.Load() >= 1, fmt.Sprintf("%d delivered", dest.ok.Load())
	})
	exposition := b.metrics(t)
	exported, series := exportedNames(exposition), exportedSeries(exposition)

	dashboard, err := os.ReadFile(filepath.Join("..", "grafana", "jetbridge.json"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	check := func(t *testing.T, kind string, data []byte) []string {
		t.Helper()
		var exprs []string
		var except []string
		var err error
		if kind == "dashboard" {
			exprs, err = dashboardExprs(data)
		} else {
			exprs, err = ruleExprs(data)
			except = []string{"up"} // Prometheus makes it, per target
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(exprs) == 0 {
			t.Fatalf("no expression in the %s", kind)
		}
		missing, err := missingMetrics(exprs, exported, except...)
		if err != nil {
			t.Fatal(err)
		}
		return missing
	}
	// checkLabels: the labels the selectors match on are the metrics'.
	checkLabels := func(t *testing.T, exprs []string, err error) []string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if len(exprs) == 0 {
			t.Fatal("no expression")
		}
		missing, err := missingLabels(exprs, series)
		if err != nil {
			t.Fatal(err)
		}
		return missing
	}
	t.Run("dashboard", func(t *testing.T) {
		if missing := check(t, "dashboard", dashboard); len(missing) != 0 {
			t.Errorf("the dashboard reads metrics the bridge does not export: %q", missing)
		}
		list, err := dashboardExprs(dashboard)
		if missing := checkLabels(t, list, err); len(missing) != 0 {
			t.Errorf("the dashboard selects on labels the metrics do not have: %q", missing)
		}
	})
	t.Run("alerts", func(t *testing.T) {
		if missing := check(t, "rules", rules); len(missing) != 0 {
			t.Errorf("alerts.yml reads metrics the bridge does not export: %q", missing)
		}
		list, err := ruleExprs(rules)
		if missing := checkLabels(t, list, err); len(missing) != 0 {
			t.Errorf("alerts.yml selects on labels the metrics do not have: %q", missing)
		}
	})
	t.Run("a label the metric does not have is caught", func(t *testing.T) {
		// bridge_dead_letters_stored counts every route together.
		bad := `max by (route) (bridge_dead_letters_stored{job=~"$job",route=~"$route"}) + on() group_left sum(bridge_in_flight{route=~"$route"})`
		if missing := checkLabels(t, []string{bad}, nil); !slices.Equal(missing, []string{"bridge_dead_letters_stored{route}"}) {
			t.Errorf("the label check reported %q, want [bridge_dead_letters_stored{route}]", missing)
		}
	})
	t.Run("a misspelled metric is caught", func(t *testing.T) {
		for _, c := range []struct {
			kind       string
			data       []byte
			name, typo string
		}{
			{"dashboard", dashboard, "bridge_in_flight", "bridge_in_fligth"},
			{"rules", rules, "bridge_circuit_state", "bridge_circuit_sate"},
		} {
			if !strings.Contains(string(c.data), c.name) {
				t.Fatalf("the %s does not use %s", c.kind, c.name)
			}
			broken := []byte(strings.ReplaceAll(string(c.data), c.name, c.typo))
			if missing := check(t, c.kind, broken); !slices.Equal(missing, []string{c.typo}) {
				t.Errorf("the %s with %s misspelled %s: the check reported %q, want [%s]", c.kind, c.name, c.typo, missing, c.typo)
			}
		}
	})
}
