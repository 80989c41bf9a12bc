package test

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// Every link users can follow resolves: in the README and the pages under
// docs/, each relative link names a file or directory of the repository
// and each #anchor a heading of its page; anywhere in the repository
// (code comments, alert rules, unit files, the chart), a link to this
// repository's files on GitHub (https://github.com/sotercare/jetbridge/
// blob/main/...) and a docs/<page>.md#<anchor> citation resolve the same
// way. Links to other sites are not followed (the tests run offline).
func TestLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	report := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	n := 0
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		n += checkMarkdownLinks(root, file, string(data), report)
	}
	for _, file := range trackedTextFiles(t, root) {
		if file == "test/links_test.go" {
			continue // its negative control cites broken links on purpose
		}
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		n += checkCitations(root, file, string(data), report)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if n < 20 {
		t.Errorf("checked %d links: the link parser lost them", n)
	}

	// Negative control: each kind of broken link is reported.
	var caught []string
	collect := func(format string, args ...any) { caught = append(caught, fmt.Sprintf(format, args...)) }
	checkMarkdownLinks(root, "docs/x.md", "# Title\n\nSee [a](#no-such-heading), [b](../nothing.md), [c](deploy.md#nowhere), [d](#title).\n", collect)
	checkCitations(root, "x.go", "// see docs/deploy.md#no-such-section and https://github.com/sotercare/jetbridge/blob/main/docs/nothing.md\n", collect)
	for _, want := range []string{"#no-such-heading", "../nothing.md", "deploy.md#nowhere", "docs/deploy.md#no-such-section", "docs/nothing.md"} {
		if !slices.ContainsFunc(caught, func(c string) bool { return strings.Contains(c, want) }) {
			t.Errorf("the link check missed %q; it reported:\n%s", want, strings.Join(caught, "\n"))
		}
	}
	if len(caught) != 5 {
		t.Errorf("the link check reported %d problems in the control, want 5:\n%s", len(caught), strings.Join(caught, "\n"))
	}
}

// Code comments that cite a README section by name (README "Delivery",
// the README's "Tracing", the README section "X", the README's Security
// section) name a heading the README has. Such citations are being
// replaced by docs/<page>.md#<anchor> links, which TestLinksResolve checks.
func TestReadmeCitationsResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := headingTitles(string(data))
	for _, file := range trackedTextFiles(t, root) {
		if !strings.HasSuffix(file, ".go") || file == "test/links_test.go" {
			continue // links_test.go cites broken ones in its control
		}
		text, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range checkReadmeCitations(file, string(text), headings) {
			t.Error(p)
		}
	}

	// Negative control: each form, naming a heading that does not exist,
	// is reported; one naming a real heading is not.
	control := "// (README \"No such\") and the README's \"Gone\" section;\n" +
		"// the README section \"Missing\", the README's Vanished\n" +
		"// section, README, \"Lost\"; README \"The two\n" +
		"// commands\" exists.\n"
	caught := checkReadmeCitations("x.go", control, headings)
	for _, want := range []string{`"No such"`, `"Gone"`, `"Missing"`, `"Vanished"`, `"Lost"`} {
		if !slices.ContainsFunc(caught, func(c string) bool { return strings.Contains(c, want) }) {
			t.Errorf("the citation check missed %s; it reported:\n%s", want, strings.Join(caught, "\n"))
		}
	}
	if len(caught) != 5 {
		t.Errorf("the citation check reported %d problems in the control, want 5:\n%s", len(caught), strings.Join(caught, "\n"))
	}
}

var (
	// readmeQuoted: README "X", README's "X", README section "X",
	// README, "X".
	readmeQuoted = regexp.MustCompile(`README(?:'s)?(?: section)?,? "([^"]+)"`)
	// readmeSection: the README's X section, the README's X and Y
	// sections.
	readmeSection = regexp.MustCompile(`README's ((?:[A-Za-z-]+ ){0,5}?)sections?\b`)
)

// checkReadmeCitations reports each README section a Go file's comments
// cite by name that is not one of headings. A citation may run on into
// the next comment line.
func checkReadmeCitations(file, text string, headings []string) []string {
	var problems []string
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if !strings.Contains(line, "README") {
			continue
		}
		joined := line
		if i+1 < len(lines) {
			if next, ok := strings.CutPrefix(strings.TrimSpace(lines[i+1]), "//"); ok {
				joined += " " + strings.TrimSpace(next)
			}
		}
		var names []string
		for _, m := range readmeQuoted.FindAllStringSubmatchIndex(joined, -1) {
			if m[0] < len(line) {
				names = append(names, joined[m[2]:m[3]])
			}
		}
		for _, m := range readmeSection.FindAllStringSubmatchIndex(joined, -1) {
			if m[0] < len(line) {
				names = append(names, strings.Split(strings.TrimSpace(joined[m[2]:m[3]]), " and ")...)
			}
		}
		for _, name := range names {
			if !slices.ContainsFunc(headings, func(h string) bool { return strings.EqualFold(h, name) }) {
				problems = append(problems, fmt.Sprintf("%s:%d: README %q: the README has no such heading (its content moved to docs/; cite docs/<page>.md#<anchor>)", file, i+1, name))
			}
		}
	}
	return problems
}

// headingTitles are the titles of a Markdown page's headings.
func headingTitles(text string) []string {
	var out []string
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), fenceStart) {
			inCode = !inCode
			continue
		}
		if !inCode && strings.HasPrefix(line, "#") {
			out = append(out, strings.TrimSpace(strings.TrimLeft(line, "#")))
		}
	}
	return out
}

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	repoURL    = regexp.MustCompile(`https://github\.com/sotercare/jetbridge/(?:blob|tree)/main/([\w./-]+)(#[\w-]+)?`)
	docsCite   = regexp.MustCompile(`(?:^|[\s(\x60"'])(docs/[\w-]+\.md)(#[\w-]+)?`)
	fenceStart = "```"
)

// checkMarkdownLinks checks the links of a Markdown page outside its code
// blocks; it returns how many it checked.
func checkMarkdownLinks(root, file, text string, report func(string, ...any)) int {
	n := 0
	inCode := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), fenceStart) {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				if r := repoURL.FindStringSubmatch(target); r != nil {
					n++
					checkTarget(root, fmt.Sprintf("%s:%d", file, i+1), r[1], strings.TrimPrefix(r[2], "#"), report)
				}
				continue
			}
			n++
			p, anchor, _ := strings.Cut(target, "#")
			if p == "" {
				if !slices.Contains(headingAnchors(text), anchor) {
					report("%s:%d: %s: no heading of this page has that anchor", file, i+1, target)
				}
				continue
			}
			p = path.Clean(path.Join(path.Dir(file), p))
			checkTarget(root, fmt.Sprintf("%s:%d: %s", file, i+1, target), p, anchor, report)
		}
	}
	return n
}

// checkCitations checks the links to this repository's files on GitHub
// and the docs/<page>.md#<anchor> citations of any text file.
func checkCitations(root, file, text string, report func(string, ...any)) int {
	n := 0
	for i, line := range strings.Split(text, "\n") {
		for _, m := range repoURL.FindAllStringSubmatch(line, -1) {
			n++
			checkTarget(root, fmt.Sprintf("%s:%d: %s", file, i+1, m[0]), m[1], strings.TrimPrefix(m[2], "#"), report)
		}
		if strings.HasSuffix(file, ".md") {
			continue // a page's own links are checked as Markdown
		}
		for _, m := range docsCite.FindAllStringSubmatch(line, -1) {
			n++
			checkTarget(root, fmt.Sprintf("%s:%d: %s%s", file, i+1, m[1], m[2]), m[1], strings.TrimPrefix(m[2], "#"), report)
		}
	}
	return n
}

// checkTarget reports a path (from the repository root) that does not
// exist, or an anchor that is no heading of that Markdown file.
func checkTarget(root, where, p, anchor string, report func(string, ...any)) {
	full := filepath.Join(root, filepath.FromSlash(p))
	if _, err := os.Stat(full); err != nil || strings.HasPrefix(p, "..") {
		report("%s: %s does not exist in the repository", where, p)
		return
	}
	if anchor == "" {
		return
	}
	data, err := os.ReadFile(full)
	if err != nil || !strings.HasSuffix(p, ".md") {
		report("%s: #%s: anchors are checked in Markdown files only", where, anchor)
		return
	}
	if !slices.Contains(headingAnchors(string(data)), anchor) {
		report("%s: %s has no heading with the anchor #%s", where, p, anchor)
	}
}

// headingAnchors are the anchors GitHub gives a page's headings: lower
// case, punctuation other than - and _ dropped, spaces as -, and -1, -2...
// after a repeated one.
func headingAnchors(text string) []string {
	var out []string
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), fenceStart) {
			inCode = !inCode
			continue
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if k := seen[a]; k > 0 {
			out = append(out, fmt.Sprintf("%s-%d", a, k))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// trackedTextFiles are the repository's files under version control,
// less the binary and generated ones.
func trackedTextFiles(t testing.TB, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch filepath.Ext(f) {
		case ".go", ".md", ".yaml", ".yml", ".json", ".service", ".tpl", ".txt", "":
			files = append(files, f)
		}
	}
	return files
}
