package test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/config"
)

// docs/configuration.md documents every key of the configuration once:
// each key is a row of a table whose header's first cell is "key", and
// the row's first cell is the key's full path in backquotes, written as
// the config package's yaml tags spell it, with <name> for a map's key
// and [] for a list's item (`destinations.<name>.timeout`,
// `routes[].subjects`). The keys are every leaf of config.Config and
// every optional block (a pointer to a struct, such as
// destinations.<name>.status_retry, whose presence turns it on).
func TestConfigReferenceListsEveryKey(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := configKeys(reflect.TypeFor[config.Config]())
	if len(want) < 80 {
		t.Fatalf("found %d keys in config.Config: the walk lost them", len(want))
	}
	for _, p := range checkReference(string(data), want) {
		t.Error(p)
	}

	// Negative control: the same reference with one key's row removed,
	// one invented key added and one row repeated fails, naming each.
	removed := "`routes[].ack_wait`"
	broken := removeRow(t, string(data), removed)
	broken = strings.Replace(broken, "| `routes[].max_deliver` |",
		"| `routes[].max_delivery` | 5 | invented |\n| `stream.name` | again | repeated |\n| `routes[].max_deliver` |", 1)
	problems := checkReference(broken, want)
	for _, w := range []string{
		"routes[].ack_wait is not documented",
		"routes[].max_delivery is not a key",
		"stream.name is documented 2 times",
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("the check missed %q; it reported:\n%s", w, strings.Join(problems, "\n"))
		}
	}
	if len(problems) != 3 {
		t.Errorf("the control reported %d problems, want 3:\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// removeRow deletes the table row that starts with the backquoted key.
func removeRow(t *testing.T, text, key string) string {
	t.Helper()
	var out []string
	n := 0
	for l := range strings.Lines(text) {
		if strings.HasPrefix(l, "| "+key+" |") {
			n++
			continue
		}
		out = append(out, l)
	}
	if n != 1 {
		t.Fatalf("the control found %d rows for %s, want 1", n, key)
	}
	return strings.Join(out, "")
}

// checkReference compares the keys a reference documents with want.
func checkReference(text string, want []string) []string {
	got := referenceKeys(text)
	var problems []string
	for _, k := range want {
		switch got[k] {
		case 0:
			problems = append(problems, fmt.Sprintf("docs/configuration.md: %s is not documented", k))
		case 1:
		default:
			problems = append(problems, fmt.Sprintf("docs/configuration.md: %s is documented %d times", k, got[k]))
		}
	}
	for k := range got {
		if !slices.Contains(want, k) {
			problems = append(problems, fmt.Sprintf("docs/configuration.md: %s is not a key of package config", k))
		}
	}
	slices.Sort(problems)
	return problems
}

// keyCell is a row's first cell: one key path in backquotes.
var keyCell = regexp.MustCompile("^\\|\\s*`([^`]+)`\\s*\\|")

// referenceKeys counts the keys of the tables whose first column is
// "key", outside code blocks.
func referenceKeys(text string) map[string]int {
	got := map[string]int{}
	inCode, inKeys := false, false
	for l := range strings.Lines(text) {
		l = strings.TrimRight(l, "\n")
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			inKeys = false
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if strings.TrimSpace(cells[0]) == "key" {
			inKeys = true
			continue
		}
		if !inKeys {
			continue
		}
		if m := keyCell.FindStringSubmatch(l); m != nil {
			got[m[1]]++
		}
	}
	return got
}

// configKeys walks t through its yaml tags and returns the path of every
// leaf and optional block.
func configKeys(t reflect.Type) []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for f := range t.Fields() {
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("yaml")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" {
				continue
			}
			if strings.Contains(opts, "inline") {
				walk(f.Type, prefix)
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			path := name
			if prefix != "" {
				path = prefix + "." + name
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
				if isBlock(ft) {
					out = append(out, path) // an optional block: present or not
				}
			}
			switch {
			case isBlock(ft):
				walk(ft, path)
			case ft.Kind() == reflect.Map && isBlock(deref(ft.Elem())):
				walk(deref(ft.Elem()), path+".<name>")
			case ft.Kind() == reflect.Slice && isBlock(deref(ft.Elem())):
				walk(deref(ft.Elem()), path+"[]")
			default:
				out = append(out, path) // a leaf: a scalar, a list or map of scalars, a Duration, a Secret
			}
		}
	}
	walk(t, "")
	slices.Sort(out)
	return out
}

func deref(t reflect.Type) reflect.Type {
	if t.Kind() == reflect.Pointer {
		return t.Elem()
	}
	return t
}

// isBlock: a struct with yaml keys of its own. A struct type that decodes
// itself from a scalar (no yaml-tagged field) is a leaf.
func isBlock(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return false
	}
	for f := range t.Fields() {
		if f.IsExported() && f.Tag.Get("yaml") != "" {
			return true
		}
	}
	return false
}
