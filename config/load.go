package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// LoadFile reads the file at path and loads it with Load, using path as the
// source name in error messages. A file that cannot be read gives the
// *fs.PathError from os.ReadFile.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Load(data, path)
}

// Load expands environment variables in data, decodes it strictly over the
// defaults and validates the result. source names the file in error
// messages. Any problem is reported as a *ValidationError listing all of
// them.
func Load(data []byte, source string) (*Config, error) {
	return loadWith(data, source, os.LookupEnv)
}

func loadWith(data []byte, source string, lookup func(string) (string, bool)) (*Config, error) {
	data, errs := expand(data, source, lookup)
	if len(errs) > 0 {
		return nil, &ValidationError{Errors: errs}
	}

	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &ValidationError{Errors: []*FieldError{syntaxError(err, source)}}
	}
	idx := newIndex(&root)

	cfg := defaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, &ValidationError{Errors: idx.decodeErrors(err, source)}
	}
	for name, d := range cfg.Destinations {
		if d != nil {
			d.Name = name
		}
	}
	if err := cfg.validate(idx, source); err != nil {
		return nil, err
	}
	return &cfg, nil
}

var (
	syntaxRe  = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	lineRe    = regexp.MustCompile(`(?s)^line (\d+): (.*)$`)
	unknownRe = regexp.MustCompile(`(?s)^field (\S+) not found in type .+$`)
	dupRe     = regexp.MustCompile(`^mapping key "(.*)" already defined at line \d+$`)
	typeRe    = regexp.MustCompile("(?s)^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
	quotedRe  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
)

func syntaxError(err error, source string) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := syntaxRe.FindStringSubmatch(err.Error()); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &FieldError{File: source, Line: line, Msg: m[2]}
	}
	return &FieldError{File: source, Msg: msg}
}

// decodeErrors turns yaml.v3's type errors ("line N: ...") into FieldErrors
// with the key path found through idx. Messages are rewritten so that they
// never quote a value that could be a secret.
func (idx *index) decodeErrors(err error, source string) []*FieldError {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []*FieldError{syntaxError(err, source)}
	}
	out := make([]*FieldError, 0, len(te.Errors))
	for _, s := range te.Errors {
		fe := &FieldError{File: source, Msg: s}
		if m := lineRe.FindStringSubmatch(s); m != nil {
			fe.Line, _ = strconv.Atoi(m[1])
			fe.Msg = m[2]
		}
		var (
			key, value string
			kind       yaml.Kind
		)
		switch m := typeRe.FindStringSubmatch(fe.Msg); {
		case unknownRe.MatchString(fe.Msg):
			key = unknownRe.FindStringSubmatch(fe.Msg)[1]
			fe.Msg = fmt.Sprintf("unknown key %q", key)
		case dupRe.MatchString(fe.Msg):
			key = dupRe.FindStringSubmatch(fe.Msg)[1]
		case m != nil:
			switch m[1] {
			case "map":
				kind = yaml.MappingNode
			case "seq":
				kind = yaml.SequenceNode
			default:
				kind, value = yaml.ScalarNode, m[2]
			}
			fe.Msg = fmt.Sprintf("want %s, got %s", typeName(m[3]), tagName(m[1]))
		case strings.HasPrefix(fe.Msg, "cannot unmarshal"):
			fe.Msg = "wrong type"
		default: // our own messages (typeError) quote the offending value
			if q := quotedRe.FindString(fe.Msg); q != "" {
				kind = yaml.ScalarNode
				value, _ = strconv.Unquote(q)
			}
		}
		fe.Path = idx.pathAt(fe.Line, key, kind, value)
		out = append(out, fe)
	}
	return out
}

func typeName(t string) string {
	switch {
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "true or false"
	case t == "string", t == "config.Secret":
		return "a string"
	case t == "config.Duration":
		return "a duration such as 250ms or 2m"
	case t == "config.secretList":
		return "a string or a list of strings"
	}
	return "a mapping"
}

func tagName(tag string) string {
	switch tag {
	case "str":
		return "a string"
	case "int":
		return "an integer"
	case "float":
		return "a number"
	case "bool":
		return "a boolean"
	case "map":
		return "a mapping"
	case "seq":
		return "a list"
	case "null":
		return "null"
	}
	return "!!" + tag
}

// index maps key paths such as routes[1].destination to the lines of the
// parsed file, and back.
type index struct {
	lines  map[string]int
	byLine map[int][]position
}

type position struct {
	path  string
	key   string    // the mapping key, "" for a list item
	kind  yaml.Kind // the kind of the value node
	value string    // the value, when kind is yaml.ScalarNode
}

func newIndex(root *yaml.Node) *index {
	idx := &index{lines: map[string]int{}, byLine: map[int][]position{}}
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		idx.walk(root.Content[0], "")
	}
	return idx
}

func (idx *index) add(path string, line int, key string, v *yaml.Node) {
	if _, ok := idx.lines[path]; !ok {
		idx.lines[path] = line
	}
	p := position{path: path, key: key, kind: v.Kind}
	if v.Kind == yaml.ScalarNode {
		p.value = v.Value
	}
	idx.byLine[line] = append(idx.byLine[line], p)
	if v.Line != line {
		p.key = ""
		idx.byLine[v.Line] = append(idx.byLine[v.Line], p)
	}
}

func (idx *index) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				continue
			}
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx.add(p, k.Line, k.Value, v)
			idx.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			idx.add(p, item.Line, "", item)
			idx.walk(item, p)
		}
	}
}

// line returns the line of path, or of its nearest ancestor present in the
// file (a defaulted key has no line of its own); 0 when none is.
func (idx *index) line(path string) int {
	if idx == nil {
		return 0
	}
	for path != "" {
		if l, ok := idx.lines[path]; ok {
			return l
		}
		cut := strings.LastIndexAny(path, ".[")
		if cut < 0 {
			return 0
		}
		path = path[:cut]
	}
	return 0
}

// pathAt finds the key path of a decoding error reported at line, from what
// the error says: the key named key; else the value node of kind (the last
// one, as a flow mapping starts on the line of its parent); else the scalar
// whose value is value (yaml.v3 shortens long values to 7 characters and
// "..."); else the only path on that line. It returns "" when unsure.
func (idx *index) pathAt(line int, key string, kind yaml.Kind, value string) string {
	cands := idx.byLine[line]
	if key != "" {
		for _, p := range cands {
			if p.key == key {
				return p.path
			}
		}
	}
	if kind == yaml.MappingNode || kind == yaml.SequenceNode {
		for i := len(cands) - 1; i >= 0; i-- {
			if cands[i].kind == kind {
				return cands[i].path
			}
		}
	}
	if kind == yaml.ScalarNode {
		prefix, short := strings.CutSuffix(value, "...")
		for _, p := range cands {
			if p.kind == yaml.ScalarNode && (p.value == value || short && strings.HasPrefix(p.value, prefix)) {
				return p.path
			}
		}
	}
	if len(cands) > 0 && !slices.ContainsFunc(cands, func(p position) bool { return p.path != cands[0].path }) {
		return cands[0].path
	}
	return ""
}
