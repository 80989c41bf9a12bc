package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// runbookBase is where every alert's runbook_url points, followed by
// "#" and the anchor of the alert's section in docs/alerts.md.
const runbookBase = "https://github.com/sotercare/jetbridge/blob/main/docs/alerts.md"

// rule is one rule of alerts.yml, as far as these tests read it.
type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

// loadRules parses a rules file.
func loadRules(data []byte) ([]rule, error) {
	var f ruleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

func readRules(t *testing.T) []rule {
	t.Helper()
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := loadRules(data)
	if err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	return rules
}

func TestPromtoolCheckRules(t *testing.T) {
	promtool := tool(t, "promtool")
	out, err := runTool(t, ".", 2*time.Minute, promtool, "check", "rules", "alerts.yml")
	if err != nil {
		t.Fatalf("promtool check rules alerts.yml: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(readRules(t))); !strings.Contains(out, want) {
		t.Errorf("promtool check rules: want %q in:\n%s", want, out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	promtool := tool(t, "promtool")
	out, err := runTool(t, ".", 2*time.Minute, promtool, "test", "rules", "alerts_test.yml")
	if err != nil {
		t.Fatalf("promtool test rules alerts_test.yml: %v\n%s", err, out)
	}
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: no SUCCESS in:\n%s", out)
	}
}

// TestAlertsConventions: one group named jetbridge; every alert has a
// severity of page or ticket, a summary, a description that uses $labels,
// and a runbook_url whose anchor is a section of docs/alerts.md headed by
// the alert's name.
func TestAlertsConventions(t *testing.T) {
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Groups) != 1 || f.Groups[0].Name != "jetbridge" {
		t.Fatalf("want one group named jetbridge, got %d groups", len(f.Groups))
	}
	anchors := docAnchors(t, filepath.Join("..", "..", "docs", "alerts.md"))
	seen := map[string]bool{}
	for _, r := range f.Groups[0].Rules {
		if r.Alert == "" {
			t.Errorf("a rule without alert: (recording rules belong elsewhere): %q", r.Record)
			continue
		}
		if seen[r.Alert] {
			t.Errorf("%s: defined twice", r.Alert)
		}
		seen[r.Alert] = true
		if s := r.Labels["severity"]; s != "page" && s != "ticket" {
			t.Errorf("%s: severity %q, want page or ticket", r.Alert, s)
		}
		if r.Annotations["summary"] == "" {
			t.Errorf("%s: no summary", r.Alert)
		}
		if !strings.Contains(r.Annotations["description"], "$labels.") {
			t.Errorf("%s: the description does not use $labels: %q", r.Alert, r.Annotations["description"])
		}
		anchor := strings.ToLower(r.Alert)
		if got, want := r.Annotations["runbook_url"], runbookBase+"#"+anchor; got != want {
			t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
		}
		if !anchors[anchor] {
			t.Errorf("%s: docs/alerts.md has no section with the anchor #%s (a heading \"## %s\")", r.Alert, anchor, r.Alert)
		}
	}
	for _, want := range []string{
		"JetbridgeTargetDown", "JetbridgeNatsDisconnected", "JetbridgeNotReady",
		"JetbridgeCircuitBreakerOpen", "JetbridgeConsumerLagGrowing", "JetbridgeIdempotencyStoreFailing",
		"JetbridgeDeadLettersIncreasing", "JetbridgeHighRedeliveryRate", "JetbridgeTraceSpansDropped",
	} {
		if !seen[want] {
			t.Errorf("alerts.yml has no alert %s", want)
		}
	}
}

// docAnchors returns the anchors GitHub gives the headings of a Markdown
// file: lower case, punctuation dropped, spaces as hyphens.
func docAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N}_ -]`)
	out := map[string]bool{}
	inCode := false
	for l := range strings.SplitSeq(string(data), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
	}
	return out
}

// TestEveryAlertUnitTested: alerts_test.yml has, for every alert of
// alerts.yml, a case where it fires and one where it does not.
func TestEveryAlertUnitTested(t *testing.T) {
	data, err := os.ReadFile("alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.RuleFiles, []string{"alerts.yml"}) {
		t.Errorf("rule_files %q, want [alerts.yml]", f.RuleFiles)
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname]++
			} else {
				quiet[a.Alertname]++
			}
		}
	}
	for _, r := range readRules(t) {
		if firing[r.Alert] == 0 {
			t.Errorf("%s: no promtool case where it fires", r.Alert)
		}
		if quiet[r.Alert] == 0 {
			t.Errorf("%s: no promtool case where it does not fire", r.Alert)
		}
	}
}
