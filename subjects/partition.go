package subjects

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// This file computes the subject transforms of an ordered route's
// partitioned copy (docs/configuration.md#routes): each message of the
// route's filters is copied with the subject <partition>.<original
// subject>, where the partition is computed by the NATS server's
// {{partition(N, wildcards...)}} function from the message's key. The
// same key always lands in the same partition, whichever of the route's
// filters it comes through.
//
// How the server computes it (nats-server subject_transform.go): FNV-1a
// 32 of the selected wildcard tokens concatenated without a separator,
// modulo N; {{partition(N)}} without tokens hashes the whole subject.
// Only wildcards of the transform's source can be selected, so:
//
//   - a key token under a trailing ">" is reached by expanding the filter
//     into filters of exact lengths (prefix.*, prefix.*.*, ...) up to the
//     highest key token, plus prefix.*...*.> for longer subjects;
//   - a key token that is a literal in a filter is left out of the hash
//     (its value is the same for every message of the filter), and a key
//     token beyond the end of a filter without ">" is missing (empty):
//     both are consistent only if no other filter of the route has a
//     wildcard there (KeyTokenError);
//   - a filter where no key token is a wildcard puts all its messages in
//     one partition, the one of the empty key.

// MaxKeyToken bounds the token positions of a partition key.
const MaxKeyToken = 32

// ErrKey is matched by every error of NewPartitioner.
var ErrKey = errors.New("invalid partition key")

// KeyTokenError reports a key token that is a literal in one of a route's
// filters and a wildcard in another: messages of the same key would be
// hashed differently through the two, and land in different partitions.
// Literal and Wildcard index the filters.
type KeyTokenError struct {
	Token             int // 1-based position
	Literal, Wildcard int
}

func (e *KeyTokenError) Error() string {
	return fmt.Sprintf("%v: token %d is a literal in filter %d and a wildcard in filter %d", ErrKey, e.Token, e.Literal+1, e.Wildcard+1)
}

// Unwrap makes the error match ErrKey.
func (e *KeyTokenError) Unwrap() error { return ErrKey }

// Transform is one subject transform of a stream source: messages whose
// subject matches Source are stored under Destination (a NATS mapping
// destination).
type Transform struct {
	Source      string
	Destination string
}

// Partitioner places the messages of a route's filters into partitions by
// their key. Its methods are safe for concurrent use.
type Partitioner struct {
	n      int
	tokens []int // 1-based; nil: the whole subject
	forms  []form
}

// form is one filter of the copy's source after expansion.
type form struct {
	filter []string // tokens; the last may be ">"
	hashed []int    // 0-based positions of the key tokens hashed, in key order
	// wild is the 1-based wildcard index of each hashed position.
	wild []int
}

// NewPartitioner checks a route's filters and key and returns its
// partitioner: n partitions (at least 1), key the whole subject when
// tokens is nil, else the subject tokens at those 1-based positions
// (distinct, 1 to MaxKeyToken). Errors match ErrKey (or ErrInvalid for a
// bad filter); see KeyTokenError.
func NewPartitioner(filters []string, n int, tokens []int) (*Partitioner, error) {
	if n < 1 {
		return nil, fmt.Errorf("%w: %d partitions, want at least 1", ErrKey, n)
	}
	if len(filters) == 0 {
		return nil, fmt.Errorf("%w: no filters", ErrKey)
	}
	if tokens != nil && len(tokens) == 0 {
		return nil, fmt.Errorf("%w: no key tokens", ErrKey)
	}
	maxTok := 0
	for i, t := range tokens {
		if t < 1 || t > MaxKeyToken {
			return nil, fmt.Errorf("%w: token %d is not from 1 to %d", ErrKey, t, MaxKeyToken)
		}
		for _, u := range tokens[:i] {
			if u == t {
				return nil, fmt.Errorf("%w: token %d is repeated", ErrKey, t)
			}
		}
		maxTok = max(maxTok, t)
	}
	for _, f := range filters {
		if err := ValidateFilter(f); err != nil {
			return nil, err
		}
	}
	p := &Partitioner{n: n}
	if tokens != nil {
		p.tokens = append([]int(nil), tokens...)
		if err := checkKeyKinds(filters, tokens); err != nil {
			return nil, err
		}
	}
	for _, f := range filters {
		toks := strings.Split(f, ".")
		last := len(toks) - 1
		if tokens == nil || toks[last] != ">" || last >= maxTok {
			// No key token under ">": the filter as it is.
			p.forms = append(p.forms, p.newForm(toks))
			continue
		}
		prefix := toks[:last]
		for l := last + 1; l <= maxTok; l++ {
			exact := append(append([]string(nil), prefix...), stars(l-last)...)
			p.forms = append(p.forms, p.newForm(exact))
		}
		tail := append(append(append([]string(nil), prefix...), stars(maxTok-last)...), ">")
		p.forms = append(p.forms, p.newForm(tail))
	}
	return p, nil
}

func stars(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = "*"
	}
	return s
}

// checkKeyKinds refuses a key token that is a literal in one filter and a
// wildcard (a "*", or a position under ">") in another.
func checkKeyKinds(filters []string, tokens []int) error {
	for _, t := range tokens {
		lit, wild := -1, -1
		for i, f := range filters {
			toks := strings.Split(f, ".")
			last := len(toks) - 1
			switch {
			case toks[last] == ">" && t-1 >= last, t-1 <= last && toks[t-1] == "*":
				if wild < 0 {
					wild = i
				}
			case t-1 <= last:
				if lit < 0 {
					lit = i
				}
			}
		}
		if lit >= 0 && wild >= 0 {
			return &KeyTokenError{Token: t, Literal: lit, Wildcard: wild}
		}
	}
	return nil
}

func (p *Partitioner) newForm(toks []string) form {
	f := form{filter: toks}
	if p.tokens == nil {
		return f
	}
	for _, t := range p.tokens {
		if t-1 >= len(toks) || toks[t-1] != "*" {
			continue // a literal, or missing: not hashed
		}
		w := 0
		for _, tok := range toks[:t] {
			if tok == "*" {
				w++
			}
		}
		f.hashed = append(f.hashed, t-1)
		f.wild = append(f.wild, w)
	}
	return f
}

// Partitions is the number of partitions.
func (p *Partitioner) Partitions() int { return p.n }

// Transforms returns the stream-source transforms of the partitioned copy,
// one per filter after expansion, in the order of the filters.
func (p *Partitioner) Transforms() []Transform {
	out := make([]Transform, 0, len(p.forms))
	for _, f := range p.forms {
		out = append(out, Transform{Source: strings.Join(f.filter, "."), Destination: p.destination(f)})
	}
	return out
}

func (p *Partitioner) destination(f form) string {
	var b strings.Builder
	switch {
	case p.tokens == nil:
		fmt.Fprintf(&b, "{{partition(%d)}}", p.n)
	case len(f.hashed) == 0:
		b.WriteString(strconv.Itoa(hash(nil, p.n)))
	default:
		fmt.Fprintf(&b, "{{partition(%d", p.n)
		for _, w := range f.wild {
			fmt.Fprintf(&b, ",%d", w)
		}
		b.WriteString(")}}")
	}
	w := 0
	for _, tok := range f.filter {
		b.WriteByte('.')
		if tok == "*" {
			w++
			fmt.Fprintf(&b, "{{wildcard(%d)}}", w)
			continue
		}
		b.WriteString(tok)
	}
	return b.String()
}

// Key returns the key of a subject: the subject itself, or its key tokens
// joined with "." (a token beyond the subject's end is empty).
//
// It runs for every message of an ordered route: one key token is a
// substring of subject (no allocation), several are joined into one.
func (p *Partitioner) Key(subject string) string {
	if p.tokens == nil {
		return subject
	}
	if len(p.tokens) == 1 {
		return token(subject, p.tokens[0])
	}
	var b strings.Builder
	b.Grow(len(subject))
	for i, t := range p.tokens {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(token(subject, t))
	}
	return b.String()
}

// token is the t-th (1-based) token of subject, "" beyond its end.
func token(subject string, t int) string {
	for ; t > 1; t-- {
		i := strings.IndexByte(subject, '.')
		if i < 0 {
			return ""
		}
		subject = subject[i+1:]
	}
	if i := strings.IndexByte(subject, '.'); i >= 0 {
		return subject[:i]
	}
	return subject
}

// Partition returns the partition the copy stores subject in, as the
// server computes it; false when no filter of the route matches subject.
func (p *Partitioner) Partition(subject string) (int, bool) {
	toks := strings.Split(subject, ".")
	for _, f := range p.forms {
		if !Match(strings.Join(f.filter, "."), subject) {
			continue
		}
		if p.tokens == nil {
			return hash([]string{subject}, p.n), true
		}
		sel := make([]string, len(f.hashed))
		for i, pos := range f.hashed {
			sel[i] = toks[pos]
		}
		return hash(sel, p.n), true
	}
	return 0, false
}

// hash is the server's partition function: FNV-1a 32 of the tokens
// concatenated, modulo n.
func hash(tokens []string, n int) int {
	h := fnv.New32a()
	for _, t := range tokens {
		_, _ = h.Write([]byte(t))
	}
	return int(h.Sum32() % uint32(n))
}

// CopySubject is the subject a message of partition p is stored under in
// the partitioned copy.
func CopySubject(p int, subject string) string { return strconv.Itoa(p) + "." + subject }

// SplitCopySubject returns the partition and the original subject of a
// subject of the partitioned copy; false when it is not one.
func SplitCopySubject(s string) (p int, subject string, ok bool) {
	head, rest, found := strings.Cut(s, ".")
	if !found || rest == "" || head == "" || len(head) > 3 {
		return 0, "", false
	}
	n, err := strconv.Atoi(head)
	if err != nil || n < 0 || strconv.Itoa(n) != head {
		return 0, "", false
	}
	return n, rest, true
}
