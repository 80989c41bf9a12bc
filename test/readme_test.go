package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The code blocks of the README and of every page under docs/ are checked
// as a newcomer would use them, by
// copying:
//
//   - every command of a ```sh block, and every "$ " line of an output
//     block, that runs one of our programs (go run ./cmd/X, bin/X) names a
//     real command with valid flags (the same line with --help exits 0),
//     and the files it names exist (or are made earlier in its block);
//   - a ```sh block whose first line is not a "# needs ..." comment (a
//     running bridge, several terminals) runs for real: each command exits
//     0, except those that serve until stopped (bridge run, receive, demo,
//     sotercare, go test), which are only checked as above. Such a block
//     may not use a command that needs a server (publish, bridge dlq);
//   - go build and go test name packages that exist;
//   - every ```go block that is a whole file compiles as pasted, and the
//     one of "Publishing events" (docs/testing.md) is, line for line,
//     producer/example_readme_test.go's tested program; a block without a
//     package clause is an excerpt whose every part is, as written, in the
//     file or directory named in the paragraph before it (a link is
//     relative to its page).

// readmeBlock is one fenced code block of the README or of a page under
// docs/.
type readmeBlock struct {
	file   string // README.md, docs/deploy.md...
	lang   string
	line   int // of the opening fence
	text   string
	before string // the paragraph before the block
}

func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	var out []readmeBlock
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(filepath.Join("..", file))
		if err != nil {
			t.Fatal(err)
		}
		blocks, err := parseBlocks(string(data))
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		for i := range blocks {
			blocks[i].file = file
		}
		out = append(out, blocks...)
	}
	return out
}

// docFiles are the pages users read: README.md and every page under
// docs/, as paths from the repository root.
func docFiles(t testing.TB) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, p := range pages {
		out = append(out, filepath.ToSlash(strings.TrimPrefix(p, ".."+string(filepath.Separator))))
	}
	return out
}

// parseBlocks returns the fenced code blocks of a Markdown text.
func parseBlocks(data string) ([]readmeBlock, error) {
	var out []readmeBlock
	var cur *readmeBlock
	var para, last []string // the paragraph being read, the last one ended
	for i, l := range strings.Split(data, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			if para == nil {
				para = last
			}
			cur = &readmeBlock{lang: strings.TrimSpace(strings.TrimPrefix(l, "```")), line: i + 1, before: strings.Join(para, "\n")}
			para, last = nil, nil
		case cur == nil && strings.TrimSpace(l) == "":
			if para != nil {
				last, para = para, nil
			}
		case cur == nil:
			para = append(para, l)
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: unclosed code block", cur.line)
	}
	return out, nil
}

// readmeBinaries builds bridge, publish and sotercare into a temporary
// directory.
func readmeBinaries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./cmd/bridge", "./cmd/publish", "./cmd/sotercare")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}

// shellWords splits a command line into words and operators (|, ||, &&,
// &, ;, >, >>, <), with quotes and backslashes as sh reads them, and drops
// a comment.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, w.String())
			w.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", line)
			}
			w.WriteString(line[i+1 : i+1+j])
			inWord, i = true, i+1+j
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				w.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("unclosed \" in %q", line)
			}
			inWord = true
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			flush()
			return words, nil
		case strings.IndexByte("|&;<>", c) >= 0:
			flush()
			op := string(c)
			if i+1 < len(line) && (line[i+1] == c) && c != ';' && c != '<' {
				op += string(c)
				i++
			}
			words = append(words, op)
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, nil
}

// readmeCommand is one simple command of a README line.
type readmeCommand struct {
	env     []string // VAR=value before it
	argv    []string
	creates []string // files its output is redirected to
}

// commands splits a line into its simple commands.
func commands(line string) ([]readmeCommand, error) {
	words, err := shellWords(line)
	if err != nil {
		return nil, err
	}
	var out []readmeCommand
	cur := readmeCommand{}
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch w {
		case "|", "||", "&&", "&", ";":
			out = append(out, cur)
			cur = readmeCommand{}
		case ">", ">>":
			if i+1 < len(words) {
				cur.creates = append(cur.creates, words[i+1])
				i++
			}
		case "<":
			i++ // its file is checked like an argument
			if i < len(words) {
				cur.argv = append(cur.argv, words[i])
			}
		default:
			if len(cur.argv) == 0 && strings.Contains(w, "=") && !strings.HasPrefix(w, "-") {
				cur.env = append(cur.env, w)
				continue
			}
			cur.argv = append(cur.argv, w)
		}
	}
	out = append(out, cur)
	return slices.DeleteFunc(out, func(c readmeCommand) bool { return len(c.argv) == 0 }), nil
}

// joinContinued joins lines that end with a backslash.
func joinContinued(text string) []string {
	var out []string
	var cur string
	for l := range strings.Lines(text) {
		l = strings.TrimRight(l, "\n")
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	return out
}

// ourProgram maps a command to one of our binaries and its arguments.
func ourProgram(argv []string) (prog string, args []string, ok bool) {
	switch {
	case len(argv) >= 3 && argv[0] == "go" && argv[1] == "run" && strings.HasPrefix(argv[2], "./cmd/"):
		return strings.TrimPrefix(argv[2], "./cmd/"), argv[3:], true
	case strings.HasPrefix(argv[0], "bin/"):
		return strings.TrimPrefix(argv[0], "bin/"), argv[1:], true
	}
	return "", nil, false
}

// servesUntilStopped: commands that run until Ctrl-C.
func servesUntilStopped(prog string, args []string) bool {
	if slices.Contains(args, "--help") || slices.Contains(args, "-h") {
		return false
	}
	if prog == "sotercare" {
		return true
	}
	if prog != "bridge" {
		return false
	}
	first := firstArg(args)
	return first == "" || first == "run" || first == "receive" || first == "demo" || strings.HasPrefix(first, "config/")
}

// needsServer: commands that talk to a running NATS server.
func needsServer(prog string, args []string) bool {
	if slices.Contains(args, "--help") || slices.Contains(args, "-h") {
		return false
	}
	return prog == "publish" || (prog == "bridge" && firstArg(args) == "dlq")
}

// firstArg is the first argument that is not a flag.
func firstArg(args []string) string {
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

// looksLikeFile is an argument that names a file of the repository.
func looksLikeFile(a string) bool {
	if strings.HasPrefix(a, "-") || strings.Contains(a, "://") || strings.HasPrefix(a, "{") {
		return false
	}
	for _, suffix := range []string{".yaml", ".json", ".jsonl"} {
		if strings.HasSuffix(a, suffix) {
			return true
		}
	}
	return false
}

func TestREADMECommandBlocks(t *testing.T) {
	bin := readmeBinaries(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	checked, ran := checkCommandBlocks(readmeBlocks(t), bin, root, t.Errorf)
	if checked < 30 || ran < 5 {
		t.Errorf("checked %d commands and ran %d: the README parser lost its blocks", checked, ran)
	}

	// Negative control: a README with each kind of mistake; every one
	// must be caught.
	broken := "```sh\n" +
		"go run ./cmd/bridge check --confg config/quickstart.yaml\n" + // a mistyped flag
		"go run ./cmd/publish --jsonl examples/nothing-here.jsonl\n" + // a missing file, a server needed
		"go run ./cmd/bridge check --config config/testdata/bad/no_routes.yaml\n" + // fails as pasted
		"go build ./cmd/nothing\n" + // no such package
		"```\n"
	blocks, err := parseBlocks(broken)
	if err != nil {
		t.Fatal(err)
	}
	var caught []string
	checkCommandBlocks(blocks, bin, root, func(format string, args ...any) { caught = append(caught, fmt.Sprintf(format, args...)) })
	for _, want := range []string{"--confg", "nothing-here.jsonl does not exist", "needs a running server", "exit 2 as pasted", "./cmd/nothing"} {
		if !slices.ContainsFunc(caught, func(c string) bool { return strings.Contains(c, want) }) {
			t.Errorf("the check missed a broken command (%q); it reported:\n%s", want, strings.Join(caught, "\n"))
		}
	}
}

// checkCommandBlocks checks the blocks' commands (see the top of this
// file) and reports each problem through errorf; it returns how many
// commands it checked and how many it ran.
func checkCommandBlocks(blocks []readmeBlock, bin, root string, errorf func(string, ...any)) (checked, ran int) {
	for _, b := range blocks {
		var lines []string
		marked := false
		switch b.lang {
		case "sh":
			lines = joinContinued(b.text)
			marked = len(lines) > 0 && strings.HasPrefix(lines[0], "# needs ")
		case "", "console":
			for _, l := range joinContinued(b.text) {
				if cmd, ok := strings.CutPrefix(l, "$ "); ok {
					lines = append(lines, cmd)
				}
			}
			marked = true // a transcript: its commands are shown, not run here
		default:
			continue
		}
		created := map[string]bool{}
		for _, line := range lines {
			cmds, err := commands(line)
			if err != nil {
				errorf("%s:%d: %v", b.file, b.line, err)
				continue
			}
			for _, c := range cmds {
				where := fmt.Sprintf("%s:%d: %s", b.file, b.line, strings.Join(c.argv, " "))
				for _, f := range c.creates {
					created[f] = true
				}
				if c.argv[0] == "go" && len(c.argv) > 1 && (c.argv[1] == "build" || c.argv[1] == "test") {
					checkPackages(where, root, c.argv[2:], errorf)
					checked++
					continue
				}
				prog, args, ok := ourProgram(c.argv)
				if !ok {
					continue // curl, seq, awk, grep, kill...
				}
				checked++
				for _, a := range args {
					if looksLikeFile(a) && !created[a] {
						if _, err := os.Stat(filepath.Join(root, a)); err != nil {
							errorf("%s: the file %s does not exist (%v)", where, a, err)
						}
					}
				}
				exe := filepath.Join(bin, prog)
				if out, code := runIn(root, c.env, exe, append(slices.Clone(args), "--help")...); code != 0 || !strings.Contains(out, "Usage:") {
					errorf("%s: not a valid command line (with --help: exit %d):\n%s", where, code, out)
					continue
				}
				switch {
				case marked || servesUntilStopped(prog, args):
				case needsServer(prog, args):
					errorf("%s: needs a running server; mark its block with a first line \"# needs ...\"", where)
				default:
					ran++
					if out, code := runIn(root, c.env, exe, args...); code != 0 {
						errorf("%s: exit %d as pasted:\n%s", where, code, out)
					}
				}
			}
		}
	}
	return checked, ran
}

// runIn runs exe in dir with the README's environment (no $NATS_URL or
// $BRIDGE_CONFIG from the test's) plus env; it returns the combined output
// and the exit code.
func runIn(dir string, env []string, exe string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Dir = dir
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "NATS_URL=") || strings.HasPrefix(kv, "BRIDGE_CONFIG=")
	})
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		return string(out) + err.Error(), -1
	}
	return string(out), 0
}

// checkPackages checks that the package arguments of go build or go test
// exist.
func checkPackages(where, root string, args []string, errorf func(string, ...any)) {
	var pkgs []string
	for _, a := range args {
		if strings.HasPrefix(a, "./") {
			pkgs = append(pkgs, a)
		}
	}
	if out, code := runIn(root, nil, "go", append([]string{"list"}, pkgs...)...); code != 0 {
		errorf("%s: go list %s: exit %d\n%s", where, strings.Join(pkgs, " "), code, out)
	}
}

func TestREADMEGoBlocks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "go" {
			continue
		}
		n++
		if !strings.HasPrefix(b.text, "package ") {
			checkExcerpt(root, b, t.Errorf)
			continue
		}
		if out, code := compileGo(t, root, b.text); code != 0 {
			t.Errorf("%s:%d: the Go block does not compile as pasted:\n%s", b.file, b.line, out)
		}
		if strings.Contains(b.text, "producer.NewPublisher") {
			checkSameAsExample(t, b)
		}
	}
	if n == 0 {
		t.Error("no Go block in the README")
	}
	// Negative controls: an excerpt that is not in its source, one that
	// names none, and a snippet that is not a program are caught.
	var caught []string
	collect := func(format string, args ...any) { caught = append(caught, fmt.Sprintf(format, args...)) }
	checkExcerpt(root, readmeBlock{text: "func NotInTheModule() {}\n", before: "from [examples/producer-test](examples/producer-test)"}, collect)
	checkExcerpt(root, readmeBlock{text: "func X() {}\n", before: "some code:"}, collect)
	if len(caught) != 2 || !strings.Contains(caught[0], "not in examples/producer-test") || !strings.Contains(caught[1], "without the file") {
		t.Errorf("the excerpt check missed a broken excerpt: %q", caught)
	}
	if _, code := compileGo(t, root, "res, err := producer.NewPublisher(js, \"events\")\n"); code == 0 {
		t.Error("a fragment compiled: the check cannot catch a snippet that does not compile as pasted")
	}
}

// excerptSource finds the file or directory a Go excerpt is said to come
// from in the paragraph before it: a Markdown link target or a path.
var excerptSource = regexp.MustCompile(`\]\(([\w./-]+)\)|([\w./-]+\.go)`)

// checkExcerpt: a Go block that is not a whole file is an excerpt; the
// paragraph before it names the file (or directory) it comes from, and
// each of its declarations is in that file as written (that code is
// compiled and run by its own tests).
func checkExcerpt(root string, b readmeBlock, errorf func(string, ...any)) {
	m := excerptSource.FindStringSubmatch(b.before)
	if m == nil {
		errorf("%s:%d: a Go excerpt (no package clause) without the file it comes from in the paragraph before it; make it a whole program or name its source", b.file, b.line)
		return
	}
	// A link is relative to its page; a bare path is from the root.
	src := filepath.Join(root, m[2])
	if m[1] != "" {
		src = filepath.Join(root, filepath.Dir(b.file), m[1])
	}
	var sources strings.Builder
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".go") {
			data, rerr := os.ReadFile(path)
			sources.Write(data)
			return rerr
		}
		return err
	})
	if err != nil {
		errorf("%s:%d: the excerpt's source %s: %v", b.file, b.line, m[1]+m[2], err)
		return
	}
	for part := range strings.SplitSeq(strings.TrimSpace(b.text), "\n\n") {
		if !strings.HasPrefix(part, "import ") && !strings.Contains(sources.String(), part) {
			errorf("%s:%d: this part of the excerpt is not in %s:\n%s", b.file, b.line, m[1]+m[2], part)
		}
	}
}

// compileGo builds text as the main.go of a program in this module.
func compileGo(t *testing.T, root, text string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return runIn(root, nil, "go", "build", "-o", filepath.Join(dir, "prog"), file)
}

// checkSameAsExample: the body of main in the README's publisher program
// is the tested example's, nats.DefaultURL aside.
func checkSameAsExample(t *testing.T, b readmeBlock) {
	t.Helper()
	_, body, ok := strings.Cut(b.text, "func main() {\n")
	if !ok {
		t.Errorf("%s:%d: no func main", b.file, b.line)
		return
	}
	body = strings.TrimSuffix(strings.TrimRight(body, "\n"), "}")
	data, err := os.ReadFile(filepath.Join("..", "producer", "example_readme_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, ex, _ := strings.Cut(string(data), "// README begin\n")
	ex, _, _ = strings.Cut(ex, "\t// README end")
	norm := func(s string) []string {
		var out []string
		for l := range strings.Lines(s) {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	got, want := norm(strings.ReplaceAll(body, "nats.DefaultURL", "url")), norm(ex)
	if !slices.Equal(got, want) {
		t.Errorf("%s:%d: the program differs from producer/example_readme_test.go's readmeMain:\n--- README:\n%s\n--- example:\n%s",
			b.file, b.line, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// The README is the front page: at most 400 lines, and it links every
// page under docs/ (the rest of the documentation lives there).
func TestReadmeIsShortAndLinksEveryPage(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkFrontPage(string(data), docFiles(t)[1:]) {
		t.Error(p)
	}

	// Negative control: a README too long that links no page fails on
	// both counts.
	long := strings.Repeat("line\n", 401)
	if got := checkFrontPage(long, []string{"docs/delivery.md"}); len(got) != 2 {
		t.Errorf("the check reported %q for a 401-line README without links, want the length and the missing link", got)
	}
}

// checkFrontPage reports a README longer than 400 lines and each page it
// does not link to.
func checkFrontPage(readme string, pages []string) []string {
	var problems []string
	if n := strings.Count(readme, "\n"); n > 400 {
		problems = append(problems, fmt.Sprintf("README.md has %d lines, at most 400: move the detail to a page under docs/", n))
	}
	for _, p := range pages {
		if !strings.Contains(readme, "]("+p+")") && !strings.Contains(readme, "]("+p+"#") {
			problems = append(problems, fmt.Sprintf("README.md does not link %s", p))
		}
	}
	return problems
}
