package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MaxSecretFileSize bounds the content of a file read by ${file:PATH}. A
// password, token or key is a few hundred bytes.
const MaxSecretFileSize = 64 << 10

// expander resolves the references in a scalar value of the parsed file:
// ${VAR} and ${VAR:-default} from the environment, ${file:PATH} from a
// file. It works on one scalar's text at a time, after YAML parsing, so a
// value is always data: it becomes the scalar's text and can never add a
// key, an anchor, a tag, a comment or a list item. Rules:
//
//   - ${VAR} is an error when VAR is unset; a set but empty VAR gives "".
//   - ${VAR:-default} gives default when VAR is unset or empty; the default
//     may not hold another ${.
//   - ${file:PATH} gives the content of the file PATH without one trailing
//     newline (\n or \r\n). PATH may hold ${VAR} and ${VAR:-default}
//     references; a relative PATH is relative to dir. The file must be a
//     regular file of at most MaxSecretFileSize bytes.
//   - $${ is a literal ${; any other $ is kept as it is, so a password such
//     as pa$$word survives.
//
// A value is never expanded again. Problems name the variable or the file,
// never a value or a file's content.
type expander struct {
	lookup func(string) (string, bool)
	dir    string
}

// scalar returns s with its references resolved, the references as written
// in s (nil when there are none) and the problems found.
func (x *expander) scalar(s string) (string, []string, []string) {
	return x.expand(s, true)
}

func (x *expander) expand(s string, files bool) (string, []string, []string) {
	if !strings.Contains(s, "${") {
		return s, nil, nil
	}
	var (
		out            strings.Builder
		refs, problems []string
	)
	for i := 0; i < len(s); {
		switch {
		case strings.HasPrefix(s[i:], "$${"):
			out.WriteString("${")
			i += 3
		case strings.HasPrefix(s[i:], "${"):
			end := closingBrace(s, i+2)
			if end < 0 {
				problems = append(problems, "unterminated ${ (write $${ for a literal ${)")
				return out.String(), refs, problems
			}
			refs = append(refs, s[i:end+1])
			val, why := x.resolve(s[i+2:end], files)
			if why != "" {
				problems = append(problems, why)
			}
			out.WriteString(val)
			i = end + 1
		default:
			out.WriteByte(s[i])
			i++
		}
	}
	return out.String(), refs, problems
}

// closingBrace returns the index of the } that closes the ${ whose inside
// starts at from, counting the ${ nested in it; -1 when there is none.
func closingBrace(s string, from int) int {
	depth := 1
	for j := from; j < len(s); j++ {
		switch {
		case strings.HasPrefix(s[j:], "${"):
			depth++
			j++
		case s[j] == '}':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// resolve evaluates the inside of ${...}; it returns the value or a problem.
func (x *expander) resolve(expr string, files bool) (string, string) {
	if path, ok := strings.CutPrefix(expr, "file:"); ok {
		if !files {
			return "", "a ${file:...} is not supported"
		}
		return x.file(path)
	}
	name, def, hasDef := strings.Cut(expr, ":-")
	if !validEnvName(name) {
		return "", fmt.Sprintf("invalid variable name %q in ${...}", name)
	}
	if strings.Contains(def, "${") {
		return "", fmt.Sprintf("nested ${ in the default of %s is not supported", name)
	}
	val, ok := x.lookup(name)
	switch {
	case ok && (val != "" || !hasDef):
	case hasDef:
		val = def
	default:
		return "", fmt.Sprintf("environment variable %s is not set", name)
	}
	return val, ""
}

// file reads the value of ${file:path}.
func (x *expander) file(path string) (string, string) {
	path, _, problems := x.expand(path, false)
	if len(problems) > 0 {
		return "", strings.Join(problems, "; ") + " (in the path of ${file:...})"
	}
	if path == "" {
		return "", "${file:} needs a path"
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(x.dir, path)
	}
	data, why := readSecretFile(path)
	if why != "" {
		return "", fmt.Sprintf("${file:%s}: %s", path, why)
	}
	if v, ok := strings.CutSuffix(string(data), "\n"); ok {
		return strings.TrimSuffix(v, "\r"), ""
	}
	return string(data), ""
}

// readSecretFile reads the regular file at path, at most
// MaxSecretFileSize bytes. Its problem says what is wrong with the file,
// never what it holds.
func readSecretFile(path string) ([]byte, string) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, osProblem(err)
	}
	check := func(fi fs.FileInfo) string {
		switch {
		case fi.IsDir():
			return "is a directory, not a file"
		case !fi.Mode().IsRegular():
			return "is " + describeMode(fi.Mode()) + ", not a regular file"
		case fi.Size() > MaxSecretFileSize:
			return fmt.Sprintf("is larger than the %d KiB limit", MaxSecretFileSize>>10)
		}
		return ""
	}
	if why := check(fi); why != "" {
		return nil, why
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, osProblem(err)
	}
	defer f.Close()
	if fi, err = f.Stat(); err != nil {
		return nil, osProblem(err)
	}
	if why := check(fi); why != "" { // replaced since the first look
		return nil, why
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxSecretFileSize+1))
	if err != nil {
		return nil, osProblem(err)
	}
	if len(data) > MaxSecretFileSize {
		return nil, fmt.Sprintf("is larger than the %d KiB limit", MaxSecretFileSize>>10)
	}
	return data, ""
}

// osProblem words an error of the operating system about a file whose
// path the caller names.
func osProblem(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "no such file"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
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
