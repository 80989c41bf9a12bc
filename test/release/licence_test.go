package release

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/licensecheck"
)

// allowedLicences is the licence allow-list, in one place: the licensecheck
// identifiers (SPDX ids) that a module linked into the released binaries may
// carry. Each is compatible with distributing the binaries under
// Apache-2.0 (notices kept). Add one only when a dependency needs it, with
// the reason beside it.
var allowedLicences = []string{
	"Apache-2.0",
	"MIT",
	"BSD-2-Clause",
	"BSD-3-Clause",
	"ISC",
}

// minCoverage is the share of a licence file (in percent of its words)
// that recognised licences must cover: below it, the file holds text that
// licensecheck does not know (extra terms, another licence) and a person
// must read it.
const minCoverage = 75

// releasedPackages are the binaries of a release.
var releasedPackages = []string{"./cmd/bridge", "./cmd/publish", "./cmd/sotercare"}

// repoRoot is the root of the jetbridge module, from test/release.
const repoRoot = "../.."

// linkedModule is a module that provides packages linked into a binary.
type linkedModule struct {
	Path    string
	Version string
	Dir     string // its directory: the module cache, or a replacement
}

func (m linkedModule) String() string {
	if m.Version == "" {
		return m.Path
	}
	return m.Path + "@" + m.Version
}

// linkedModules lists the modules, other than the main one, whose packages
// go into the released binaries, sorted by path.
func linkedModules(t *testing.T) []linkedModule {
	t.Helper()
	args := append([]string{"list", "-deps", "-json=ImportPath,Standard,Module"}, releasedPackages...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	type module struct {
		Path, Version, Dir string
		Main               bool
		Replace            *module
	}
	seen := map[string]linkedModule{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Standard   bool
			Module     *module
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Standard {
			continue
		}
		if p.Module == nil {
			t.Fatalf("package %s belongs to no module", p.ImportPath)
		}
		if p.Module.Main {
			continue
		}
		m := linkedModule{Path: p.Module.Path, Version: p.Module.Version, Dir: p.Module.Dir}
		if r := p.Module.Replace; r != nil {
			m.Dir = r.Dir
		}
		if m.Dir == "" {
			t.Fatalf("module %s (of %s) has no directory: not downloaded?", m, p.ImportPath)
		}
		seen[m.Path] = m
	}
	var mods []linkedModule
	for _, m := range seen {
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b linkedModule) int { return strings.Compare(a.Path, b.Path) })
	return mods
}

// licenceFiles returns the names of the licence files at the top of a
// module directory: LICENSE*, LICENCE*, COPYING* in any case.
func licenceFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		up := strings.ToUpper(e.Name())
		if e.Type().IsRegular() && (strings.HasPrefix(up, "LICENSE") || strings.HasPrefix(up, "LICENCE") || strings.HasPrefix(up, "COPYING")) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// licenceFile is one classified licence file.
type licenceFile struct {
	Name     string
	IDs      []string // the licences found, sorted, without repeats
	Coverage float64  // percent of the text that they cover
}

func (f licenceFile) String() string {
	ids := "no known licence"
	if len(f.IDs) > 0 {
		ids = strings.Join(f.IDs, " + ")
	}
	return fmt.Sprintf("%s: %s (%.0f%% of the text)", f.Name, ids, f.Coverage)
}

// classify reads and classifies the licence files of a module directory.
func classify(dir string) ([]licenceFile, error) {
	names, err := licenceFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []licenceFile
	for _, name := range names {
		text, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		cov := licensecheck.Scan(text)
		f := licenceFile{Name: name, Coverage: cov.Percent}
		for _, m := range cov.Match {
			if !slices.Contains(f.IDs, m.ID) {
				f.IDs = append(f.IDs, m.ID)
			}
		}
		slices.Sort(f.IDs)
		out = append(out, f)
	}
	return out, nil
}

// licenceProblem is a module whose licences are not acceptable.
type licenceProblem struct {
	Module string // path@version
	Found  string // the licence files and what they hold, or why none
}

func (p licenceProblem) String() string { return p.Module + ": " + p.Found }

// checkLicences classifies each module's licence files and returns the
// modules that have none, or a licence outside the allow-list, or text that
// no known licence covers (below minCoverage), with what was found. The
// second result is what was found for every module, for the log.
func checkLicences(mods []linkedModule) (problems []licenceProblem, found []string, err error) {
	for _, m := range mods {
		files, err := classify(m.Dir)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", m, err)
		}
		if len(files) == 0 {
			problems = append(problems, licenceProblem{m.String(), "no licence file (LICENSE*, LICENCE*, COPYING*) in " + m.Dir})
			found = append(found, m.String()+": no licence file")
			continue
		}
		var desc []string
		bad := false
		for _, f := range files {
			desc = append(desc, f.String())
			if len(f.IDs) == 0 || f.Coverage < minCoverage {
				bad = true
			}
			for _, id := range f.IDs {
				if !slices.Contains(allowedLicences, id) {
					bad = true
				}
			}
		}
		line := strings.Join(desc, "; ")
		found = append(found, m.String()+": "+line)
		if bad {
			problems = append(problems, licenceProblem{m.String(), line})
		}
	}
	return problems, found, nil
}

// Every module linked into bridge, publish and sotercare has a licence file
// whose licences are all on the allow-list.
func TestLicencesOfLinkedModules(t *testing.T) {
	mods := linkedModules(t)
	if len(mods) == 0 {
		t.Fatal("go list found no module besides the main one")
	}
	problems, found, err := checkLicences(mods)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d modules linked into %s:\n%s", len(mods), strings.Join(releasedPackages, " "), strings.Join(found, "\n"))
	for _, p := range problems {
		t.Errorf("licence not allowed: %s (allowed: %s)", p, strings.Join(allowedLicences, ", "))
	}
}

// Negative control: the same check, on two modules made here (one under
// GPL-3.0, one without a licence file) beside an MIT one, reports exactly
// the first two, naming each and what it holds.
func TestLicenceCheckRefuses(t *testing.T) {
	gpl, err := os.ReadFile(filepath.Join("testdata", "GPL-3.0.txt"))
	if err != nil {
		t.Fatal(err)
	}
	mit, err := os.ReadFile(filepath.Join("testdata", "MIT.txt"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	mkmod := func(name string, files map[string][]byte) linkedModule {
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files["go.mod"] = []byte("module example.com/" + name + "\n")
		for f, data := range files {
			if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return linkedModule{Path: "example.com/" + name, Version: "v1.0.0", Dir: dir}
	}
	mods := []linkedModule{
		mkmod("copyleft", map[string][]byte{"COPYING": gpl}),
		mkmod("mit", map[string][]byte{"LICENSE": mit}),
		mkmod("nolicence", map[string][]byte{"README": []byte("no licence here\n")}),
	}
	problems, _, err := checkLicences(mods)
	if err != nil {
		t.Fatal(err)
	}
	want := []licenceProblem{
		{"example.com/copyleft@v1.0.0", "COPYING: GPL-3.0 (100% of the text)"},
		{"example.com/nolicence@v1.0.0", "no licence file (LICENSE*, LICENCE*, COPYING*) in " + mods[2].Dir},
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%v\nwant:\n%v", problems, want)
	}
}

// The repository's own LICENSE is the Apache License 2.0, whole.
func TestOwnLicence(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(repoRoot, "LICENSE"))
	if errors.Is(err, os.ErrNotExist) {
		t.Fatal("the repository has no LICENSE file")
	} else if err != nil {
		t.Fatal(err)
	}
	cov := licensecheck.Scan(text)
	var ids []string
	for _, m := range cov.Match {
		ids = append(ids, m.ID)
	}
	if !slices.Equal(ids, []string{"Apache-2.0"}) || cov.Percent < 99 {
		t.Errorf("LICENSE: %v, %.1f%% of the text; want Apache-2.0 alone, whole", ids, cov.Percent)
	}
}
