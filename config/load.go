package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds a configuration file. A real one is a few KiB.
const MaxFileSize = 4 << 20

// Errors of LoadFile about the file itself (not its content). Match them
// with errors.Is; the message names the file.
var (
	// ErrFileTooLarge: the file is larger than MaxFileSize.
	ErrFileTooLarge = errors.New("larger than the 4 MiB limit")
	// ErrNotRegularFile: the path is a directory, a device, a socket or
	// anything else that is neither a regular file nor a named pipe.
	ErrNotRegularFile = errors.New("not a regular file or named pipe")
)

// LoadFile reads the file at path and loads it with Load, using path as the
// source name in error messages. A file that cannot be read gives the
// *fs.PathError from the operating system.
//
// The file must be a regular file or a named pipe (so that /dev/stdin and
// process substitution work; a pipe is read until its writer closes it, so
// LoadFile blocks while a pipe has no writer). Directories, devices such as
// /dev/zero and sockets are refused with ErrNotRegularFile, and more than
// MaxFileSize bytes with ErrFileTooLarge, before anything is parsed. See
// docs/security.md.
func LoadFile(path string) (*Config, error) {
	data, err := ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Load(data, path)
}

// ReadFile reads the configuration file at path as LoadFile does: a
// regular file or a named pipe of at most MaxFileSize bytes. A caller that
// keeps the bytes (their digest, say) reads them once with ReadFile and
// parses them with Load, so that what it keeps is what is in force.
func ReadFile(path string) ([]byte, error) {
	return readBounded(path, MaxFileSize, configFileMode)
}

// configFileMode reports whether a file of mode m may be read as a
// configuration file: a regular file or a named pipe.
func configFileMode(m fs.FileMode) bool {
	return m.IsRegular() || m.Type() == fs.ModeNamedPipe
}

// readBounded reads at most limit bytes from the file at path, whose mode
// (checked before it is opened, and again once open) must satisfy allowed.
// Reading stops at limit+1 bytes, so a pipe or a growing file cannot
// exceed it either.
func readBounded(path string, limit int64, allowed func(fs.FileMode) bool) ([]byte, error) {
	check := func(fi fs.FileInfo) error {
		if !allowed(fi.Mode()) {
			return fmt.Errorf("config file %s: %s, %w", path, describeMode(fi.Mode()), ErrNotRegularFile)
		}
		if fi.Mode().IsRegular() && fi.Size() > limit {
			return fmt.Errorf("config file %s: %d bytes, %w", path, fi.Size(), ErrFileTooLarge)
		}
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := check(fi); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if err := check(fi); err != nil { // replaced since the first look
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("config file %s: more than %d bytes, %w", path, limit, ErrFileTooLarge)
	}
	return data, nil
}

// describeMode names the kind of file of m.
func describeMode(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m.IsRegular():
		return "a regular file"
	}
	return "an irregular file"
}

// Load decodes data strictly over the defaults, resolving ${VAR} and
// ${file:PATH} references in its scalar values, and validates the result.
// source names the file in error messages, and its directory is the base
// of a relative ${file:PATH}. Any problem is reported as a
// *ValidationError listing all of them.
func Load(data []byte, source string) (*Config, error) {
	return loadWith(data, source, os.LookupEnv)
}

func loadWith(data []byte, source string, lookup func(string) (string, bool)) (*Config, error) {
	doc := &document{
		cfg: defaultConfig(),
		idx: newIndex(source, &expander{lookup: lookup, dir: filepath.Dir(source)}),
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(doc)
	idx := doc.idx
	if len(idx.problems) > 0 {
		return nil, &ValidationError{Errors: idx.problems}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, &ValidationError{Errors: doc.withValidation(idx.decodeErrors(err, source, data), err, source)}
	}
	cfg := doc.cfg
	for name, d := range cfg.Destinations {
		if d != nil {
			d.Name = name
		}
	}
	if len(idx.from) > 0 {
		cfg.from = idx.from
	}
	if err := cfg.validate(idx, source); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// document is the whole file, decoded in two steps by one strict decoder:
// UnmarshalYAML first takes the parsed tree, resolves the references in
// its scalar values (in place) and indexes it, then decodes the same tree
// into cfg. Resolving references in the parsed tree, never in the text,
// is what keeps a value from changing the YAML structure; decoding it with
// the decoder of the text, rather than with yaml.Node.Decode, is what keeps
// unknown keys errors (yaml.Node.Decode is not strict).
type document struct {
	cfg  Config
	idx  *index
	root *yaml.Node // the resolved tree, for withValidation
}

// errExpansion stops decoding after a reference could not be resolved;
// the problems are in the index.
var errExpansion = errors.New("unresolved references")

// UnmarshalYAML resolves, indexes and decodes the tree. The tree is the
// decoder's own (see rootNode): resolving its scalars in place is what the
// second call of unmarshal decodes.
func (d *document) UnmarshalYAML(unmarshal func(any) error) error {
	var root rootNode
	if err := unmarshal(&root); err != nil {
		return err
	}
	d.idx.walk(root.n, "")
	d.root = root.n
	if len(d.idx.problems) > 0 {
		return errExpansion
	}
	return unmarshal(&d.cfg)
}

// rootNode takes the node it is decoded from: yaml.v3 hands an Unmarshaler
// the decoder's node itself, where decoding into a yaml.Node would give a
// copy. TestReferencesAreResolvedBeforeDecoding fails if that changes.
type rootNode struct{ n *yaml.Node }

func (r *rootNode) UnmarshalYAML(n *yaml.Node) error {
	r.n = n
	return nil
}

var (
	syntaxRe  = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	lineRe    = regexp.MustCompile(`(?s)^line (\d+): (.*)$`)
	unknownRe = regexp.MustCompile(`(?s)^field (\S+) not found in type .+$`)
	dupRe     = regexp.MustCompile(`^mapping key "(.*)" already defined at line \d+$`)
	typeRe    = regexp.MustCompile("(?s)^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
	quotedRe  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	// backquotedRe is a value as yaml.v3 quotes it in some of its errors.
	backquotedRe = regexp.MustCompile("`[^`]*`")
)

// syntaxError turns a yaml.v3 syntax error into a FieldError, with the
// parser's message made plainer where it is known to mislead: a tab in an
// indentation is named (and its line found), and an unclosed flow
// collection, which yaml.v3 reports one line before the line that opens
// it, points at that line. data is only searched for tabs, never quoted.
func syntaxError(err error, source string, data []byte) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	m := syntaxRe.FindStringSubmatch(err.Error())
	if m == nil {
		return &FieldError{File: source, Msg: msg}
	}
	line, _ := strconv.Atoi(m[1])
	fe := &FieldError{File: source, Line: line, Msg: m[2]}
	switch {
	case strings.HasPrefix(fe.Msg, "found character that cannot start any token"):
		if tab := tabIndented(data, line); tab > 0 {
			fe.Line, fe.Msg = tab, "a tab in the indentation: YAML indents with spaces only"
		}
	case strings.HasPrefix(fe.Msg, "did not find expected ',' or ']'"):
		fe.Line, fe.Msg = line+1, "a [ list is not closed (did not find the expected ',' or ']')"
	case strings.HasPrefix(fe.Msg, "did not find expected ',' or '}'"):
		fe.Line, fe.Msg = line+1, "a { mapping is not closed (did not find the expected ',' or '}')"
	}
	if flowReference(data, fe.Line) {
		fe.Msg += `; inside [ ] or { }, quote a reference: "${VAR}"`
	}
	return fe
}

// flowReference reports whether line (1-based) holds a ${ after a [ or a
// {: in a flow collection an unquoted ${VAR} is a YAML syntax error, since
// { and } are flow indicators there (references are resolved after
// parsing). data is only searched, never quoted.
func flowReference(data []byte, line int) bool {
	lines := strings.Split(string(data), "\n")
	if line < 1 || line > len(lines) {
		return false
	}
	l := lines[line-1]
	ref := strings.Index(l, "${")
	return ref > 0 && strings.ContainsAny(l[:ref], "[{")
}

// tabIndented is the line (1-based), among line and the one after it,
// whose indentation holds a tab; 0 when neither does.
func tabIndented(data []byte, line int) int {
	lines := strings.Split(string(data), "\n")
	for _, n := range []int{line, line + 1} {
		if n < 1 || n > len(lines) {
			continue
		}
		l := lines[n-1]
		indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if strings.Contains(indent, "\t") {
			return n
		}
	}
	return 0
}

// decodeErrors turns yaml.v3's type errors ("line N: ...") into FieldErrors
// with the key path found through idx. Messages are rewritten so that they
// never quote a value that could be a secret, and never a value that came
// from a reference: such a value is named by its reference instead.
func (idx *index) decodeErrors(err error, source string, data []byte) []*FieldError {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		fe := syntaxError(err, source, data)
		if len(idx.nodes) > 0 { // yaml.v3 may quote a value in `...`
			fe.Msg = backquotedRe.ReplaceAllString(fe.Msg, "a value")
		}
		return []*FieldError{fe}
	}
	out := make([]*FieldError, 0, len(te.Errors))
	for _, s := range te.Errors {
		fe := &FieldError{File: source, Msg: s}
		if m := lineRe.FindStringSubmatch(s); m != nil {
			fe.Line, _ = strconv.Atoi(m[1])
			fe.Msg = m[2]
		}
		var (
			key, value, want, plain string
			kind                    yaml.Kind
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
			want = typeName(m[3])
			fe.Msg = fmt.Sprintf("want %s, got %s", want, tagName(m[1]))
			plain = fe.Msg
		case strings.HasPrefix(fe.Msg, "cannot unmarshal"):
			fe.Msg = "wrong type"
		default: // our own messages (typeError) quote the offending value
			if q := quotedRe.FindString(fe.Msg); q != "" {
				kind = yaml.ScalarNode
				value, _ = strconv.Unquote(q)
				want = "a Go duration such as 250ms or 2m"
				plain = strings.Replace(fe.Msg, " "+q, "", 1)
			}
		}
		p, fromRef := idx.pathAt(fe.Line, key, kind, value)
		fe.Path = p.path
		if key != "" && strings.HasPrefix(fe.Msg, "unknown key ") {
			fe.Msg += didYouMean(fe.Path)
		}
		switch {
		case fromRef && p.from != "":
			fe.Msg = p.from + " is not " + want
		case fromRef:
			fe.Msg = plain // the value may be one from a reference: not quoted
		}
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
	case t == "config.OrderingKey":
		return "subject or {tokens: [i, j, ...]}"
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
// parsed file, and back. Built by walk, which also resolves the references
// in scalar values (see expander) and records where each resolved value
// came from.
type index struct {
	lines  map[string]int
	byLine map[int][]position
	// from describes, for each key path whose value holds a resolved
	// reference, where it came from ("the value of ${N}"); a path under a
	// recorded one (an alias or a merge of resolved values) counts too.
	from     map[string]string
	nodes    map[*yaml.Node]string // the same, by resolved scalar node
	refs     map[*yaml.Node]string // the references of a resolved scalar node
	under    map[*yaml.Node]string // memo of firstRef
	x        *expander
	source   string
	problems []*FieldError // references that could not be resolved
}

type position struct {
	path  string
	key   string    // the mapping key, "" for a list item
	kind  yaml.Kind // the kind of the value node
	value string    // the value, when kind is yaml.ScalarNode
	from  string    // where a resolved value came from; "" for literal text
}

// newIndex returns an empty index whose walk resolves references with x.
func newIndex(source string, x *expander) *index {
	return &index{
		lines: map[string]int{}, byLine: map[int][]position{},
		from: map[string]string{}, nodes: map[*yaml.Node]string{},
		refs: map[*yaml.Node]string{}, under: map[*yaml.Node]string{},
		x: x, source: source,
	}
}

func (idx *index) add(path string, line int, key string, v *yaml.Node) {
	if _, ok := idx.lines[path]; !ok {
		idx.lines[path] = line
	}
	p := position{path: path, key: key, kind: v.Kind, from: idx.fromOf(path)}
	if v.Kind == yaml.ScalarNode {
		p.value = v.Value
	}
	idx.byLine[line] = append(idx.byLine[line], p)
	if v.Line != line {
		p.key = ""
		idx.byLine[v.Line] = append(idx.byLine[v.Line], p)
	}
}

// walk indexes n, found at path, resolving the references of the scalar
// values under it first. Keys are never resolved.
func (idx *index) walk(n *yaml.Node, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) > 0 {
			idx.walk(n.Content[0], path)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Tag == "!!merge" {
				if v.Kind != yaml.AliasNode {
					idx.walk(v, path)
				}
				idx.taint(path, idx.aliasFrom(v))
				continue
			}
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			idx.resolveNode(v, p)
			idx.add(p, k.Line, k.Value, v)
			idx.walk(v, p)
		}
	case yaml.SequenceNode:
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			idx.resolveNode(item, p)
			idx.add(p, item.Line, "", item)
			idx.walk(item, p)
		}
	}
}

// resolveNode resolves the references of v, the value at path, when it is
// a scalar, and records an alias of resolved values as coming from them.
func (idx *index) resolveNode(v *yaml.Node, path string) {
	switch {
	case v.Kind == yaml.AliasNode:
		idx.taint(path, idx.aliasFrom(v))
		return
	case v.Kind != yaml.ScalarNode || !strings.Contains(v.Value, "${"):
		return
	}
	val, refs, problems := idx.x.scalar(v.Value)
	for _, msg := range problems {
		idx.problems = append(idx.problems, &FieldError{File: idx.source, Line: v.Line, Path: path, Msg: msg})
	}
	whole := len(refs) == 1 && refs[0] == v.Value
	v.Value = val
	if len(refs) == 0 { // only $${ escapes: literal text
		return
	}
	desc := "the value of " + refs[0]
	if !whole {
		desc = "a value built from " + joinAnd(refs)
	}
	idx.nodes[v] = desc
	idx.refs[v] = joinAnd(refs)
	idx.from[path] = desc
	if v.Style&yaml.TaggedStyle != 0 && v.Tag != "!" && v.ShortTag() != "!!str" {
		// yaml.v3 would quote the value in its error if it did not fit the
		// tag; a plain reference already gets the type the key wants.
		idx.problems = append(idx.problems, &FieldError{File: idx.source, Line: v.Line, Path: path,
			Msg: fmt.Sprintf("the tag %s on a value with a ${...} reference is not supported (only !!str is): remove it", v.ShortTag())})
		return
	}
	if v.Style == 0 {
		// A plain scalar without a tag: the value is read as YAML reads a
		// plain scalar's text (5 an integer, true a boolean), never as
		// YAML syntax. Only an empty value is null, as for "key:"; a
		// value such as ~ or null stays that text.
		switch val {
		case "~", "null", "Null", "NULL":
			v.Tag = "!!str"
		default:
			v.Tag = ""
		}
	}
}

// aliasFrom describes the resolved values that v, an alias or the value
// of a merge key, brings in; "" when there are none.
func (idx *index) aliasFrom(v *yaml.Node) string {
	t := v
	if t.Kind == yaml.AliasNode {
		t = t.Alias
	}
	if d, ok := idx.nodes[t]; ok {
		return d
	}
	if ref := idx.firstRef(t); ref != "" {
		return "a value from an alias or merge that holds " + ref
	}
	return ""
}

// firstRef is the references of the first resolved scalar in the tree of
// n, following aliases; "" when there is none. Memoized, so that a file
// of many aliases costs one visit per node.
func (idx *index) firstRef(n *yaml.Node) string {
	if n == nil {
		return ""
	}
	if ref, ok := idx.under[n]; ok {
		return ref
	}
	idx.under[n] = "" // also stops a cycle
	ref := idx.refs[n]
	if n.Kind == yaml.AliasNode {
		ref = idx.firstRef(n.Alias)
	}
	for _, c := range n.Content {
		if ref != "" {
			break
		}
		ref = idx.firstRef(c)
	}
	idx.under[n] = ref
	return ref
}

func (idx *index) taint(path, desc string) {
	if desc != "" {
		if _, ok := idx.from[path]; !ok {
			idx.from[path] = desc
		}
	}
}

// fromOf is where the value at path came from, "" when it is literal text.
func (idx *index) fromOf(path string) string { return originOf(idx.from, path) }

// originOf looks path and its ancestors up in from.
func originOf(from map[string]string, path string) string {
	if len(from) == 0 {
		return ""
	}
	for {
		if d, ok := from[path]; ok {
			return d
		}
		cut := strings.LastIndexAny(path, ".[")
		if cut < 0 {
			return from[""]
		}
		path = path[:cut]
	}
}

// joinAnd joins refs as "a, b and c".
func joinAnd(refs []string) string {
	if len(refs) == 1 {
		return refs[0]
	}
	return strings.Join(refs[:len(refs)-1], ", ") + " and " + refs[len(refs)-1]
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
// "..."); else the only path on that line. The position's path is "" when
// unsure. fromRef reports that the error's value may have come from a
// reference, so that it must not be quoted: then the position is the one
// of that resolved value when there is exactly one candidate.
func (idx *index) pathAt(line int, key string, kind yaml.Kind, value string) (p position, fromRef bool) {
	cands := idx.byLine[line]
	if key != "" {
		for _, p := range cands {
			if p.key == key {
				return p, false
			}
		}
	}
	if kind == yaml.MappingNode || kind == yaml.SequenceNode {
		for i := len(cands) - 1; i >= 0; i-- {
			if cands[i].kind == kind {
				return cands[i], false
			}
		}
	}
	if kind == yaml.ScalarNode {
		prefix, short := strings.CutSuffix(value, "...")
		var match []position
		for _, p := range cands {
			if p.kind == yaml.ScalarNode && (p.value == value || short && strings.HasPrefix(p.value, prefix)) {
				match = append(match, p)
			}
		}
		anyRef := slices.ContainsFunc(cands, func(p position) bool { return p.from != "" })
		switch {
		case len(match) > 0 && !slices.ContainsFunc(match, func(q position) bool { return q.path != match[0].path }):
			return match[0], match[0].from != ""
		case len(match) > 0 && !slices.ContainsFunc(match, func(q position) bool { return q.from != "" }):
			return match[0], false
		case len(match) > 0 || anyRef:
			// Unsure which value it is, and one of them came from a
			// reference: quote none.
			return position{}, true
		}
	}
	if len(cands) > 0 && !slices.ContainsFunc(cands, func(p position) bool { return p.path != cands[0].path }) {
		return cands[0], false
	}
	return position{}, false
}
