package config

import (
	"cmp"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// This file makes Load report every problem of a file at once: the
// decoding problems (unknown keys, with the nearest known key; values of
// the wrong type) and the validation problems of what did decode, each
// with its file and line (docs/configuration.md#checking-a-file).

// withValidation adds to the decoding problems of a file the validation
// problems of the rest of it, when decoding went through the whole file
// (err is a *yaml.TypeError: yaml.v3 records such errors and goes on; a
// syntax error stops it). yaml.v3 drops a route or destination that has a
// decoding problem, which would move the others' paths and lines, so what
// is validated is the file without the keys that have a problem (each
// then has its default), decoded again; when that cannot be done safely
// (a problem without a path, a whole list item that is wrong), only the
// decoding problems are reported. A validation problem about a key that
// has a decoding problem of its own, or about the key an unknown key is
// a misspelling of, is left out: it says the same thing again. The
// problems are in line order.
func (d *document) withValidation(decoded []*FieldError, err error, source string) []*FieldError {
	var te *yaml.TypeError
	if !errors.As(err, &te) || len(decoded) == 0 || d.root == nil {
		return decoded
	}
	covered := map[string]bool{}
	for _, fe := range decoded {
		if fe.Path == "" {
			return decoded
		}
		covered[fe.Path] = true
	}
	pruned, ok := pruneKeys(d.root, "", covered)
	if !ok {
		return decoded
	}
	cfg := defaultConfig()
	if pruned.Decode(&cfg) != nil {
		return decoded
	}
	for name, dst := range cfg.Destinations {
		if dst != nil {
			dst.Name = name
		}
	}
	if len(d.idx.from) > 0 {
		cfg.from = d.idx.from
	}
	verr, ok := cfg.validate(d.idx, source).(*ValidationError)
	if !ok || verr == nil {
		return decoded
	}
	for _, fe := range decoded {
		if _, suggestion, ok := strings.Cut(fe.Msg, didYouMeanText); ok {
			parent, _ := splitKeyPath(fe.Path)
			covered[joinKeyPath(parent, strings.Trim(suggestion, `"?`))] = true
		}
	}
	out := slices.Clone(decoded)
	for _, fe := range verr.Errors {
		if !coveredPath(covered, fe.Path) {
			out = append(out, fe)
		}
	}
	slices.SortStableFunc(out, func(a, b *FieldError) int {
		switch {
		case a.Line == 0 && b.Line != 0:
			return 1
		case b.Line == 0 && a.Line != 0:
			return -1
		}
		return cmp.Compare(a.Line, b.Line)
	})
	return out
}

// pruneKeys is a copy of the tree n, found at path, without the mapping
// keys whose paths are in remove (index.walk's paths); false when a list
// item itself is to be removed (the items after it would move).
func pruneKeys(n *yaml.Node, path string, remove map[string]bool) (*yaml.Node, bool) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.MappingNode, yaml.SequenceNode:
	default:
		return n, true
	}
	c := *n
	c.Content = make([]*yaml.Node, 0, len(n.Content))
	switch n.Kind {
	case yaml.DocumentNode:
		for _, x := range n.Content {
			px, ok := pruneKeys(x, path, remove)
			if !ok {
				return nil, false
			}
			c.Content = append(c.Content, px)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				c.Content = append(c.Content, k, v)
				continue
			}
			p := joinKeyPath(path, k.Value)
			if remove[p] {
				continue
			}
			pv, ok := pruneKeys(v, p, remove)
			if !ok {
				return nil, false
			}
			c.Content = append(c.Content, k, pv)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := path + "[" + strconv.Itoa(i) + "]"
			if remove[p] {
				return nil, false
			}
			pi, ok := pruneKeys(item, p, remove)
			if !ok {
				return nil, false
			}
			c.Content = append(c.Content, pi)
		}
	}
	return &c, true
}

// coveredPath reports whether path, or a key above it, is in covered.
func coveredPath(covered map[string]bool, path string) bool {
	for path != "" {
		if covered[path] {
			return true
		}
		cut := strings.LastIndexAny(path, ".[")
		if cut < 0 {
			return false
		}
		path = path[:cut]
	}
	return false
}

// didYouMeanText starts the suggestion an unknown key's message ends with.
const didYouMeanText = "; did you mean "

// didYouMean is the suggestion for the unknown key at path (such as
// routes[0].max_delivr): `; did you mean "max_deliver"?` when a key known
// at that place is close to it, else "".
func didYouMean(path string) string {
	parent, key := splitKeyPath(path)
	if s := nearestKey(key, knownKeys(parent)); s != "" {
		return didYouMeanText + `"` + s + `"?`
	}
	return ""
}

// splitKeyPath splits a key path into its parent and its last key:
// "routes[0].max_delivr" is "routes[0]" and "max_delivr".
func splitKeyPath(path string) (parent, key string) {
	cut := strings.LastIndexByte(path, '.')
	if cut < 0 {
		return "", path
	}
	return path[:cut], path[cut+1:]
}

func joinKeyPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

// knownKeys lists the keys a mapping at path may hold, from the yaml tags
// of the configuration types; nil when path is not a mapping of fixed keys
// (the names under destinations, a header map) or not a place in the file.
func knownKeys(path string) []string {
	t := reflect.TypeOf(Config{})
	for _, seg := range keySegments(path) {
		t = deref(t)
		switch t.Kind() {
		case reflect.Struct:
			f, ok := fieldByKey(t, seg)
			if !ok {
				return nil
			}
			t = f.Type
		case reflect.Map, reflect.Slice:
			t = t.Elem() // a map key (a destination's name) or [i]
		default:
			return nil
		}
	}
	t = deref(t)
	if t.Kind() != reflect.Struct {
		return nil
	}
	return structKeys(t)
}

// keySegments splits a key path into keys and [i] indexes:
// "routes[0].backoff" is "routes", "[0]", "backoff".
func keySegments(path string) []string {
	var out []string
	for _, part := range strings.Split(path, ".") {
		if part == "" {
			continue
		}
		for {
			i := strings.IndexByte(part, '[')
			if i < 0 {
				out = append(out, part)
				break
			}
			if i > 0 {
				out = append(out, part[:i])
			}
			j := strings.IndexByte(part[i:], ']')
			if j < 0 {
				out = append(out, part[i:])
				break
			}
			out = append(out, part[i:i+j+1])
			part = part[i+j+1:]
			if part == "" {
				break
			}
		}
	}
	return out
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// yamlKey is the key of field f in a file: its yaml tag's name, "" for a
// field that is not in the file, and inline reporting `yaml:",inline"`.
func yamlKey(f reflect.StructField) (key string, inline bool) {
	if !f.IsExported() {
		return "", false
	}
	tag := f.Tag.Get("yaml")
	name, opts, _ := strings.Cut(tag, ",")
	if name == "-" {
		return "", false
	}
	if strings.Contains(","+opts+",", ",inline,") {
		return "", true
	}
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name, false
}

// fieldByKey finds the field of struct t (inline fields included) whose
// key is key.
func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, inline := yamlKey(f)
		if inline {
			if g, ok := fieldByKey(deref(f.Type), key); ok {
				return g, true
			}
			continue
		}
		if name != "" && name == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// structKeys lists the keys of struct t, inline fields' included, in
// declaration order.
func structKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, inline := yamlKey(f)
		switch {
		case inline:
			out = append(out, structKeys(deref(f.Type))...)
		case name != "":
			out = append(out, name)
		}
	}
	return out
}

// nearestKey is the known key closest to key: the same once case, "_"
// and "-" are ignored (maxInFlight for max_in_flight), else within an
// edit distance of 1 for keys of up to 4 characters and 2 for longer
// ones; "" when none is that close. Ties go to the first in known.
func nearestKey(key string, known []string) string {
	norm := func(s string) string {
		return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s))
	}
	limit := 2
	if utf8.RuneCountInString(key) <= 4 {
		limit = 1
	}
	best, bestD := "", limit+1
	for _, k := range known {
		d := editDistance(key, k)
		if norm(key) == norm(k) {
			d = 0
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
