package monitoring

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
)

// The check of test c: every metric a dashboard panel, a dashboard
// variable or an alert reads is one the bridge exports.

// dashboardExprs returns the PromQL of a Grafana dashboard: every "expr"
// (panel targets, rows' panels included) and the query of every query
// variable (label_values(SELECTOR, label) and query_result(EXPR) reduced
// to their PromQL).
func dashboardExprs(data []byte) ([]string, error) {
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if e, ok := v["expr"].(string); ok {
				out = append(out, e)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(doc)
	root, _ := doc.(map[string]any)
	templating, _ := root["templating"].(map[string]any)
	list, _ := templating["list"].([]any)
	for _, v := range list {
		vv, _ := v.(map[string]any)
		if vv["type"] != "query" {
			continue
		}
		q, _ := vv["query"].(string)
		if qo, ok := vv["query"].(map[string]any); ok {
			q, _ = qo["query"].(string)
		}
		if q = variableQuery(q); q != "" {
			out = append(out, q)
		}
	}
	return out, nil
}

var (
	labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$`)
	queryResult = regexp.MustCompile(`^\s*query_result\((.*)\)\s*$`)
)

// variableQuery is the PromQL of a Grafana variable query, "" for one
// that reads no metric (label_values(label), label_names()).
func variableQuery(q string) string {
	if m := labelValues.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if m := queryResult.FindStringSubmatch(q); m != nil {
		return m[1]
	}
	if strings.HasPrefix(strings.TrimSpace(q), "label_values(") || strings.HasPrefix(strings.TrimSpace(q), "label_names(") {
		return ""
	}
	return q
}

// grafanaVar is a template variable in an expression: $name, ${name} or
// ${name:format}.
var grafanaVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[A-Za-z0-9_]+)?\}|\$([A-Za-z0-9_]+)`)

// substitute replaces Grafana's variables by what Grafana would put
// there: a duration for the interval variables, a regular expression
// matching anything for the others (they sit in =~ matchers).
func substitute(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		m := grafanaVar.FindStringSubmatch(v)
		switch m[1] + m[2] {
		case "__rate_interval", "__interval", "__range", "__range_s":
			return "5m"
		default:
			return ".*"
		}
	})
}

// ruleExprs returns the expression of every rule of a rules file.
func ruleExprs(data []byte) ([]string, error) {
	rules, err := loadRules(data)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rules {
		out = append(out, r.Expr)
	}
	return out, nil
}

// metricNames parses the expressions (after substitute) and returns the
// metric names their selectors read, sorted and without repeats.
func metricNames(exprs []string) ([]string, error) {
	p := parser.NewParser(parser.Options{})
	var names []string
	for _, e := range exprs {
		ast, err := p.ParseExpr(substitute(e))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", e, err)
		}
		var selErr error
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == "__name__" && name == "" {
					name = m.Value
				}
			}
			if name == "" {
				selErr = fmt.Errorf("%q: a selector without a metric name (%s)", e, vs)
			}
			names = append(names, name)
			return nil
		})
		if selErr != nil {
			return nil, selErr
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// exportedSeries returns the names of the samples of a Prometheus text
// exposition (a histogram's as NAME_bucket, NAME_sum and NAME_count), each
// with the label names its samples carry.
func exportedSeries(exposition []byte) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(exposition))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.IndexAny(l, "{ ")
		if i <= 0 {
			continue
		}
		name := l[:i]
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		if l[i] != '{' {
			continue
		}
		// label="value", with \\, \" and \n escapes in the value.
		for rest := l[i+1:]; ; {
			rest = strings.TrimLeft(rest, ", ")
			eq := strings.IndexByte(rest, '=')
			if rest == "" || rest[0] == '}' || eq < 0 || eq+1 >= len(rest) || rest[eq+1] != '"' {
				break
			}
			out[name][strings.TrimSpace(rest[:eq])] = true
			j := eq + 2
			for j < len(rest) && rest[j] != '"' {
				if rest[j] == '\\' {
					j++
				}
				j++
			}
			rest = rest[min(j+1, len(rest)):]
		}
	}
	return out
}

// exportedNames is the set of sample names of an exposition.
func exportedNames(exposition []byte) map[string]bool {
	out := map[string]bool{}
	for n := range exportedSeries(exposition) {
		out[n] = true
	}
	return out
}

// missingLabels is the check of labels: every label a selector matches on
// (job and instance aside: Prometheus adds them to every series) is one
// the exported metric carries. It reports metric{label} for each one that
// is not, sorted; metrics not exported at all are missingMetrics' to
// report.
func missingLabels(exprs []string, exported map[string]map[string]bool) ([]string, error) {
	p := parser.NewParser(parser.Options{})
	var missing []string
	for _, e := range exprs {
		ast, err := p.ParseExpr(substitute(e))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", e, err)
		}
		parser.Inspect(ast, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok || exported[vs.Name] == nil {
				return nil
			}
			for _, m := range vs.LabelMatchers {
				switch m.Name {
				case "__name__", "job", "instance":
				default:
					if !exported[vs.Name][m.Name] {
						missing = append(missing, vs.Name+"{"+m.Name+"}")
					}
				}
			}
			return nil
		})
	}
	slices.Sort(missing)
	return slices.Compact(missing), nil
}

// missingMetrics is the check: the metric names the expressions read
// that are not in exported, leaving out the names in except (up, which
// Prometheus makes itself).
func missingMetrics(exprs []string, exported map[string]bool, except ...string) ([]string, error) {
	names, err := metricNames(exprs)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, n := range names {
		if !exported[n] && !slices.Contains(except, n) {
			missing = append(missing, n)
		}
	}
	return missing, nil
}
