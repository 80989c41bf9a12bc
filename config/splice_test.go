package config

import (
	"fmt"
	"strings"
)

// This file keeps, for negative controls only, the expansion that jetbridge
// used before the security review: ${VAR} spliced into the raw text, before
// YAML parsing, so that a value could change the YAML structure. Tests load
// the same malicious values both ways and assert that the checker they use
// catches the splice: a test that could not fail would prove nothing.

// loadSpliced is loadWith as it was: splice, then parse and decode.
func loadSpliced(data []byte, source string, lookup func(string) (string, bool)) (*Config, error) {
	data, errs := spliceEnv(data, source, lookup)
	if len(errs) > 0 {
		return nil, &ValidationError{Errors: errs}
	}
	return loadWith(data, source, func(string) (string, bool) { return "", false })
}

// spliceEnv is the old expand: it replaces ${VAR} and ${VAR:-default} in the
// raw text, line by line, skipping comment lines.
func spliceEnv(data []byte, source string, lookup func(string) (string, bool)) ([]byte, []*FieldError) {
	var (
		out  strings.Builder
		errs []*FieldError
	)
	out.Grow(len(data))
	for i, line := range strings.SplitAfter(string(data), "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "#") {
			out.WriteString(line)
			continue
		}
		lineErrs := spliceLine(&out, line, lookup)
		for _, msg := range lineErrs {
			errs = append(errs, &FieldError{File: source, Line: i + 1, Msg: msg})
		}
	}
	return []byte(out.String()), errs
}

func spliceLine(out *strings.Builder, line string, lookup func(string) (string, bool)) []string {
	var errs []string
	for i := 0; i < len(line); {
		switch {
		case strings.HasPrefix(line[i:], "$${"):
			out.WriteString("${")
			i += 3
		case strings.HasPrefix(line[i:], "${"):
			end := strings.IndexByte(line[i+2:], '}')
			if end < 0 {
				errs = append(errs, "unterminated ${ (write $${ for a literal ${)")
				out.WriteString(line[i:])
				return errs
			}
			val, err := spliceResolve(line[i+2:i+2+end], lookup)
			if err != "" {
				errs = append(errs, err)
			}
			out.WriteString(val)
			i += end + 3
		default:
			out.WriteByte(line[i])
			i++
		}
	}
	return errs
}

// resolve evaluates the inside of ${...}; it returns the value or an error
// message.
func spliceResolve(expr string, lookup func(string) (string, bool)) (string, string) {
	name, def, hasDef := strings.Cut(expr, ":-")
	if !validEnvName(name) {
		return "", fmt.Sprintf("invalid variable name %q in ${...}", name)
	}
	if strings.Contains(def, "${") {
		return "", fmt.Sprintf("nested ${ in the default of %s is not supported", name)
	}
	val, ok := lookup(name)
	switch {
	case ok && (val != "" || !hasDef):
	case hasDef:
		val = def
	default:
		return "", fmt.Sprintf("environment variable %s is not set", name)
	}
	if strings.ContainsAny(val, "\r\n") {
		return "", fmt.Sprintf("environment variable %s contains a line break", name)
	}
	return val, ""
}
