// Package subjects owns the subject scheme of jetbridge events and the
// grammar of NATS subjects and filters.
//
// The scheme is <root>.<severity>.<type tokens>, for example
// events.critical.sensor.fall. Every function here is pure: a subject or
// filter that passes validation is one the NATS server accepts, and Match,
// Covers and Overlap agree with the server's wildcard semantics ("*" is one
// token, ">" is one or more trailing tokens). Partitioner computes the
// subject transforms of an ordered route's partitioned copy and, for a
// subject, the same partition the server's {{partition(...)}} gives it.
package subjects

import (
	"errors"
	"fmt"
	"strings"
)

// Severity is an event severity as carried in the Event-Severity header.
type Severity string

// The three severities of the scheme.
const (
	Info     Severity = "INFO"
	Warning  Severity = "WARNING"
	Critical Severity = "CRITICAL"
)

// ErrInvalid is matched by every validation error of this package.
var ErrInvalid = errors.New("invalid subject")

// ParseSeverity accepts info, warning or critical in any case.
func ParseSeverity(s string) (Severity, error) {
	switch Severity(strings.ToUpper(s)) {
	case Info:
		return Info, nil
	case Warning:
		return Warning, nil
	case Critical:
		return Critical, nil
	}
	return "", fmt.Errorf("%w: severity %q is not one of info, warning, critical", ErrInvalid, s)
}

// Token is the lowercase subject token of the severity.
func (s Severity) Token() string { return strings.ToLower(string(s)) }

// ValidateToken checks one literal token: non-empty, no whitespace or
// control characters, no wildcards and no dot.
func ValidateToken(tok string) error {
	if tok == "" {
		return fmt.Errorf("%w: empty token", ErrInvalid)
	}
	for _, r := range tok {
		switch {
		case r == '*' || r == '>':
			return fmt.Errorf("%w: token %q contains a wildcard", ErrInvalid, tok)
		case r == '.':
			return fmt.Errorf("%w: token %q contains a dot", ErrInvalid, tok)
		case r <= ' ' || r == 0x7f:
			return fmt.Errorf("%w: token %q contains whitespace or a control character", ErrInvalid, tok)
		}
	}
	return nil
}

// ValidateSubject checks a literal subject, as used for publishing.
func ValidateSubject(s string) error {
	if s == "" {
		return fmt.Errorf("%w: empty subject", ErrInvalid)
	}
	for _, tok := range strings.Split(s, ".") {
		if err := ValidateToken(tok); err != nil {
			return fmt.Errorf("subject %q: %w", s, err)
		}
	}
	return nil
}

// ValidateFilter checks a subscription filter: literal tokens, "*" as a
// whole token, and ">" only as the last token.
func ValidateFilter(f string) error {
	if f == "" {
		return fmt.Errorf("%w: empty filter", ErrInvalid)
	}
	toks := strings.Split(f, ".")
	for i, tok := range toks {
		switch tok {
		case "*":
			continue
		case ">":
			if i != len(toks)-1 {
				return fmt.Errorf("%w: filter %q: \">\" must be the last token", ErrInvalid, f)
			}
			continue
		}
		if err := ValidateToken(tok); err != nil {
			return fmt.Errorf("filter %q: %w", f, err)
		}
	}
	return nil
}

// Match reports whether the literal subject matches the filter.
func Match(filter, subject string) bool {
	return Covers(filter, subject)
}

// Covers reports whether every subject matched by inner is also matched by
// outer. Both are filters (a literal subject is a filter matching itself).
func Covers(outer, inner string) bool {
	o, in := strings.Split(outer, "."), strings.Split(inner, ".")
	for i, ot := range o {
		if ot == ">" {
			return len(in) > i // ">" needs at least one token
		}
		if i >= len(in) {
			return false
		}
		switch it := in[i]; {
		case it == ">":
			return false // inner matches longer subjects than outer's fixed length
		case ot == "*":
			continue
		case it == "*" || ot != it:
			return false
		}
	}
	return len(in) == len(o)
}

// Overlap reports whether some subject matches both filters.
func Overlap(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; ; i++ {
		switch {
		case i == len(at) && i == len(bt):
			return true
		case i < len(at) && at[i] == ">":
			return len(bt) > i
		case i < len(bt) && bt[i] == ">":
			return len(at) > i
		case i == len(at) || i == len(bt):
			return false
		case at[i] == "*" || bt[i] == "*" || at[i] == bt[i]:
			continue
		default:
			return false
		}
	}
}

// Name builds <root>.<severity>.<eventType> and validates the result.
// eventType may have several tokens ("sensor.fall").
func Name(root string, sev Severity, eventType string) (string, error) {
	if _, err := ParseSeverity(string(sev)); err != nil {
		return "", err
	}
	if eventType == "" {
		return "", fmt.Errorf("%w: empty event type", ErrInvalid)
	}
	s := root + "." + sev.Token() + "." + eventType
	if err := ValidateSubject(s); err != nil {
		return "", err
	}
	return s, nil
}

// Describe derives the event type and severity from a subject that follows
// the scheme. A subject that does not (fewer than three tokens, or a second
// token that is not a severity) has itself as its type and severity INFO.
// The severity token is matched exactly (lowercase): nothing is allocated,
// as the bridge describes every message it receives.
func Describe(subject string) (eventType string, sev Severity) {
	_, rest, ok := strings.Cut(subject, ".")
	if !ok {
		return subject, Info
	}
	tok, typ, ok := strings.Cut(rest, ".")
	if !ok || typ == "" {
		return subject, Info
	}
	switch tok {
	case "info":
		return typ, Info
	case "warning":
		return typ, Warning
	case "critical":
		return typ, Critical
	}
	return subject, Info
}

// DeadLetter names the dead-letter subject of a message: <prefix>.<route>.<original>.
func DeadLetter(prefix, route, original string) string {
	return prefix + "." + route + "." + original
}

// Route is the routing part of a route: its name and subject filters.
type Route struct {
	Name     string
	Subjects []string
}

// Table answers which routes receive a subject.
type Table struct {
	routes []Route
}

// NewTable validates every filter and builds a table.
func NewTable(routes []Route) (*Table, error) {
	var errs []error
	for _, r := range routes {
		for _, f := range r.Subjects {
			if err := ValidateFilter(f); err != nil {
				errs = append(errs, fmt.Errorf("route %s: %w", r.Name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Table{routes: append([]Route(nil), routes...)}, nil
}

// Lookup returns the names of the routes whose filters match subject, in
// table order.
func (t *Table) Lookup(subject string) []string {
	var names []string
	for _, r := range t.routes {
		for _, f := range r.Subjects {
			if Match(f, subject) {
				names = append(names, r.Name)
				break
			}
		}
	}
	return names
}
