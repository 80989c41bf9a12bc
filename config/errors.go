package config

import (
	"strconv"
	"strings"
)

// FieldError is one problem in a configuration file. File and Line are set
// when known; Path is the key path, such as routes[1].destination, and may
// be empty for a problem that concerns no key (a YAML syntax error). Msg
// never contains a secret.
type FieldError struct {
	File string
	Line int
	Path string
	Msg  string
}

// Error formats the problem as "FILE:LINE: path: message", leaving out the
// parts that are not known.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		if e.File != "" {
			b.WriteString(e.File)
			b.WriteByte(':')
		} else {
			b.WriteString("line ")
		}
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ValidationError lists every problem found in a configuration, in a
// stable order. Its Error has one line per problem.
type ValidationError struct {
	Errors []*FieldError
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Errors))
	for i, fe := range e.Errors {
		lines[i] = fe.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the individual problems, so errors.As finds a *FieldError.
func (e *ValidationError) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, fe := range e.Errors {
		errs[i] = fe
	}
	return errs
}
