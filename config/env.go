package config

import (
	"fmt"
	"strings"
)

// expand replaces ${VAR} and ${VAR:-default} with values from lookup. It
// works on the raw text, before YAML parsing, so a variable may stand for
// any scalar (a number, a duration, a secret). Rules:
//
//   - ${VAR} is an error when VAR is unset; a set but empty VAR gives "".
//   - ${VAR:-default} gives default when VAR is unset or empty.
//   - $${ is a literal ${; any other $ is kept as it is, so a password such
//     as pa$$word survives.
//   - a line whose first non-blank character is # is a comment and is left
//     alone, so a commented-out ${VAR} needs no value.
//
// A value containing a line break is refused: it would change the YAML
// structure and every line number after it. Errors name the variable and
// line, never a value.
func expand(data []byte, source string, lookup func(string) (string, bool)) ([]byte, []*FieldError) {
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
		lineErrs := expandLine(&out, line, lookup)
		for _, msg := range lineErrs {
			errs = append(errs, &FieldError{File: source, Line: i + 1, Msg: msg})
		}
	}
	return []byte(out.String()), errs
}

func expandLine(out *strings.Builder, line string, lookup func(string) (string, bool)) []string {
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
			val, err := resolve(line[i+2:i+2+end], lookup)
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
func resolve(expr string, lookup func(string) (string, bool)) (string, string) {
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

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'A' && r <= 'Z', r >= 'a' && r <= 'z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
