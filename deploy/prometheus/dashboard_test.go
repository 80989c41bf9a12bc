package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestDashboardShape: the dashboard is a Grafana dashboard of schema 39
// with a Prometheus data-source variable and route and destination
// variables; every panel reads through the data-source variable; every
// expression parses (variables substituted), and between them the panels
// read every metric an operator needs.
func TestDashboardShape(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "grafana", "jetbridge.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Type  string `json:"type"`
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
			GridPos struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				Expr       string `json:"expr"`
				RefID      string `json:"refId"`
				Datasource *struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID != "jetbridge" || d.Title == "" || d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want uid jetbridge, a title, schema about 39", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Name == "datasource" && v.Query != "prometheus" {
			t.Errorf("the datasource variable selects %v, want prometheus", v.Query)
		}
	}
	for name, typ := range map[string]string{"datasource": "datasource", "job": "query", "route": "query", "destination": "query"} {
		if vars[name] != typ {
			t.Errorf("variable %s: type %q, want %q", name, vars[name], typ)
		}
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
			if strings.Contains(tg.Expr, "bridge_") && !strings.Contains(tg.Expr, `job=~"$job"`) {
				t.Errorf("panel %q: %s does not select the $job", p.Title, tg.Expr)
			}
		}
	}
	exprs, err := dashboardExprs(data)
	if err != nil {
		t.Fatal(err)
	}
	names, err := metricNames(exprs)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"bridge_messages_total", "bridge_http_requests_total", "bridge_delivery_duration_seconds_bucket",
		"bridge_circuit_state", "bridge_consumer_pending", "bridge_in_flight", "bridge_dead_letters_total",
		"bridge_dead_letters_stored", "bridge_ready", "bridge_nats_connected", "bridge_build_info",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("no panel reads %s", want)
		}
	}
}

// TestSubstitute: Grafana's variables become what Grafana puts there, so
// that the expressions parse.
func TestSubstitute(t *testing.T) {
	got := substitute(`rate(x{route=~"$route",d=~"${destination}",e=~"${destination:regex}"}[$__rate_interval])`)
	if want := `rate(x{route=~".*",d=~".*",e=~".*"}[5m])`; got != want {
		t.Errorf("substitute: %s, want %s", got, want)
	}
	names, err := metricNames([]string{`histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="$x"}[$__interval]))) / on() group_left b`, `{__name__="c"}`})
	if err != nil || !slices.Equal(names, []string{"a_bucket", "b", "c"}) {
		t.Errorf("metricNames: %q, %v", names, err)
	}
}

// TestExportedSeries: names and label names of an exposition, quotes,
// commas and escapes in values included.
func TestExportedSeries(t *testing.T) {
	got := exportedSeries([]byte("# HELP a x\n# TYPE a counter\n" +
		`a{route="r,1",reason="say \"hi\", \\ }"} 1` + "\n" +
		`a{route="r2",extra="e"} 2` + "\n" +
		"b 3\n" +
		`c_bucket{le="+Inf"} 4` + "\n"))
	want := map[string][]string{"a": {"extra", "reason", "route"}, "b": nil, "c_bucket": {"le"}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for name, labels := range want {
		var have []string
		for l := range got[name] {
			have = append(have, l)
		}
		slices.Sort(have)
		if got[name] == nil || !slices.Equal(have, labels) {
			t.Errorf("%s: labels %q, want %q", name, have, labels)
		}
	}
}
