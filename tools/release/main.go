// Command release builds jetbridge's release archives:
//
//	go run ./tools/release [-out DIR] [-platforms os/arch,...]
//
// For each platform it builds cmd/bridge, cmd/publish and cmd/sotercare
// (CGO_ENABLED=0, -trimpath, -buildvcs=true, -ldflags "-s -w -buildid=")
// into DIR/<os>_<arch>/, writes DIR/<os>_<arch>/THIRD_PARTY_LICENSES (the
// licence files of every module linked into the binaries, and the Go
// standard library's), then DIR/jetbridge_<version>_<os>_<arch>.tar.gz
// holding the binaries, LICENSE, README.md, CHANGELOG.md and
// THIRD_PARTY_LICENSES, and finally DIR/SHA256SUMS.
//
// <version> is the main module version the Go toolchain stamped into the
// bridge binary: the tag in a tagged checkout (git tag v0.1.0), else a
// pseudo-version; "+dirty" when the work tree has uncommitted changes (a
// warning then). The same commit gives byte-identical archives: entries
// sorted by name, modification time the commit time, owner 0:0 without
// names, fixed modes, a gzip header without name or time.
//
// Errors are one line on stderr and exit 1; bad flags exit 2.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// commands are the programs every archive holds, in build order.
var commands = []string{"bridge", "publish", "sotercare"}

// docs are the repository files every archive holds besides the binaries
// and THIRD_PARTY_LICENSES; a missing one is skipped with a warning.
var docs = []string{"LICENSE", "README.md", "CHANGELOG.md"}

const defaultPlatforms = "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64"

// usageError is a bad command line: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	err := release(args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "release: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "release: %v\n", err)
		return 1
	}
}

// platform is one GOOS/GOARCH pair.
type platform struct{ goos, goarch string }

func (p platform) String() string { return p.goos + "/" + p.goarch }
func (p platform) dir() string    { return p.goos + "_" + p.goarch }
func (p platform) exe() string {
	if p.goos == "windows" {
		return ".exe"
	}
	return ""
}

func release(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "dist", "output `directory`")
	platforms := fs.String("platforms", defaultPlatforms, "comma-separated `os/arch` list (see go tool dist list)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: go run ./tools/release [-out DIR] [-platforms os/arch,...]\n\n"+
			"Builds bridge, publish and sotercare for each platform and writes\n"+
			"DIR/jetbridge_<version>_<os>_<arch>.tar.gz and DIR/SHA256SUMS.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()} // the flag package printed the usage
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q (flags only)", fs.Arg(0))}
	}
	if *out == "" {
		return usageError{"-out: empty directory"}
	}
	plats, err := parsePlatforms(*platforms)
	if err != nil {
		return usageError{"-platforms: " + err.Error()}
	}

	root, err := moduleRoot()
	if err != nil {
		return err
	}
	known, err := goOutput(root, nil, "tool", "dist", "list")
	if err != nil {
		return err
	}
	for _, p := range plats {
		if !slices.Contains(strings.Fields(known), p.String()) {
			return usageError{fmt.Sprintf("-platforms: %s is not a Go platform (see go tool dist list)", p)}
		}
	}
	outDir, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	if err := checkRepository(root); err != nil {
		return err
	}
	mtime, err := commitTime(root)
	if err != nil {
		return err
	}
	head, err := gitOutput(root, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	goroot, err := goOutput(root, nil, "env", "GOROOT")
	if err != nil {
		return err
	}
	goroot = strings.TrimSpace(goroot)

	// Archives of an earlier run would sit next to a SHA256SUMS that does
	// not list them: remove them (only the release tool's own file names).
	stale, err := filepath.Glob(filepath.Join(outDir, "jetbridge_*_*_*.tar.gz"))
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(outDir, "SHA256SUMS")); err == nil {
		stale = append(stale, filepath.Join(outDir, "SHA256SUMS"))
	}
	for _, f := range stale {
		if err := os.Remove(f); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "removed %s (an earlier run's)\n", filepath.Join(*out, filepath.Base(f)))
	}

	var archives []string
	version := ""
	for _, p := range plats {
		dir := filepath.Join(outDir, p.dir())
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		env := []string{"GOOS=" + p.goos, "GOARCH=" + p.goarch, "CGO_ENABLED=0"}
		pkgs := make([]string, len(commands))
		for i, c := range commands {
			pkgs[i] = "./cmd/" + c
		}
		build := append([]string{"build", "-trimpath", "-buildvcs=true", "-ldflags=-s -w -buildid=", "-o", dir + string(filepath.Separator)}, pkgs...)
		if err := goRun(root, env, stderr, build...); err != nil {
			return fmt.Errorf("go build for %s: %v", p, err)
		}
		v, goVersion, err := stampedVersion(filepath.Join(dir, "bridge"+p.exe()), head)
		if err != nil {
			return err
		}
		if version == "" {
			version = v
			if strings.HasSuffix(v, "+dirty") {
				fmt.Fprintf(stderr, "release: warning: the work tree has uncommitted changes: version %s; commit (and tag) before releasing\n", v)
			}
		} else if v != version {
			return fmt.Errorf("%s: the binaries say version %s, the earlier platforms %s", p, v, version)
		}

		licences, err := thirdPartyLicences(root, env, goroot, goVersion, pkgs, version, p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "THIRD_PARTY_LICENSES"), licences, 0o644); err != nil {
			return err
		}

		var files []archiveFile
		for _, c := range commands {
			files = append(files, archiveFile{Name: c + p.exe(), Path: filepath.Join(dir, c+p.exe()), Mode: 0o755})
		}
		files = append(files, archiveFile{Name: "THIRD_PARTY_LICENSES", Path: filepath.Join(dir, "THIRD_PARTY_LICENSES"), Mode: 0o644})
		for _, d := range docs {
			path := filepath.Join(root, d)
			if _, err := os.Stat(path); err != nil {
				fmt.Fprintf(stderr, "release: warning: %s is missing: the archives leave it out\n", d)
				continue
			}
			files = append(files, archiveFile{Name: d, Path: path, Mode: 0o644})
		}
		name := fmt.Sprintf("jetbridge_%s_%s_%s.tar.gz", version, p.goos, p.goarch)
		if err := writeFileAtomic(filepath.Join(outDir, name), func(w io.Writer) error { return writeArchive(w, files, mtime) }); err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
		archives = append(archives, name)
	}

	sums, err := checksums(outDir, archives)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(outDir, "SHA256SUMS"), func(w io.Writer) error { _, err := w.Write(sums); return err }); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "version %s (commit time %s)\n", version, mtime.UTC().Format(time.RFC3339))
	for _, p := range plats {
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*out, p.dir())+string(filepath.Separator))
	}
	for _, a := range archives {
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*out, a))
	}
	fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*out, "SHA256SUMS"))
	return nil
}

// parsePlatforms reads "os/arch,os/arch".
func parsePlatforms(s string) ([]platform, error) {
	var out []platform
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		goos, goarch, ok := strings.Cut(f, "/")
		if !ok || goos == "" || goarch == "" || strings.Contains(goarch, "/") {
			return nil, fmt.Errorf("%q is not os/arch", f)
		}
		p := platform{goos, goarch}
		if slices.Contains(out, p) {
			return nil, fmt.Errorf("%s is listed twice", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// moduleRoot is the directory of the main module's go.mod.
func moduleRoot() (string, error) {
	gomod, err := goOutput("", nil, "env", "GOMOD")
	if err != nil {
		return "", err
	}
	gomod = strings.TrimSpace(gomod)
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the jetbridge module: run from the repository")
	}
	root := filepath.Dir(gomod)
	if _, err := os.Stat(filepath.Join(root, "cmd", "bridge")); err != nil {
		return "", fmt.Errorf("%s has no cmd/bridge: run from the jetbridge repository", root)
	}
	return root, nil
}

// checkRepository refuses what the Go toolchain cannot stamp: a
// directory outside git, and a linked worktree (git worktree add), whose
// .git is a file that cmd/go does not take for a repository
// (golang/go#58218): it would stamp no version, or an enclosing
// repository's.
func checkRepository(root string) error {
	top, err := gitOutput(root, "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-dir", "--git-common-dir")
	if err != nil {
		return fmt.Errorf("%v (a release is built from a git clone)", err)
	}
	f := strings.Fields(top)
	if len(f) != 3 {
		return fmt.Errorf("git rev-parse: unexpected output %q", top)
	}
	if f[1] != f[2] {
		return fmt.Errorf("%s is a linked git worktree: Go records no version there (golang/go#58218); release from a clone (git clone %s DIR)", f[0], f[2])
	}
	if filepath.Clean(f[0]) != filepath.Clean(root) {
		return fmt.Errorf("the module root %s is not the top of its git repository %s", root, f[0])
	}
	return nil
}

// commitTime is the time of HEAD, the archives' entries' mtime.
func commitTime(root string) (time.Time, error) {
	out, err := gitOutput(root, "log", "-1", "--format=%ct")
	if err != nil {
		return time.Time{}, err
	}
	sec, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("git log -1 --format=%%ct: %q is not a time", out)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// gitOutput runs git in dir and returns its trimmed standard output.
func gitOutput(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, firstLine(errb.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// stampedVersion reads the main module version and the Go version the
// toolchain recorded in a binary, and checks it recorded head.
func stampedVersion(path, head string) (version, goVersion string, err error) {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return "", "", fmt.Errorf("reading the build information of %s: %v", path, err)
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		return "", "", fmt.Errorf("%s records no module version (%q): Go found no git repository", path, v)
	}
	revision := ""
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	if revision != head {
		return "", "", fmt.Errorf("%s records revision %q, not HEAD %s", path, revision, head)
	}
	return v, info.GoVersion, nil
}

// listedPackage is the part of `go list -json` output used here.
type listedPackage struct {
	ImportPath string
	Standard   bool
	Module     *listedModule
}

type listedModule struct {
	Path    string
	Version string
	Main    bool
	Dir     string
	Replace *listedModule
}

// thirdPartyLicences is the THIRD_PARTY_LICENSES file: the Go standard
// library's licence, then every module linked into the binaries, by path,
// with its licence files.
func thirdPartyLicences(root string, env []string, goroot, goVersion string, pkgs []string, version string, p platform) ([]byte, error) {
	out, err := goOutput(root, env, append([]string{"list", "-deps", "-json"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	modules := map[string]*listedModule{}
	dec := json.NewDecoder(strings.NewReader(out))
	for {
		var pkg listedPackage
		if err := dec.Decode(&pkg); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list -deps -json: %v", err)
		}
		if pkg.Standard || pkg.Module == nil || pkg.Module.Main {
			continue
		}
		modules[pkg.Module.Path] = pkg.Module
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "Third-party licences of jetbridge %s for %s\n\n", version, p)
	fmt.Fprintf(&b, "The programs bridge, publish and sotercare are statically linked with the\n"+
		"Go standard library and runtime and with the modules listed below. Each\n"+
		"heading is a module path and version; the licence files of the module follow.\n")
	if err := appendLicences(&b, "std (the Go standard library and runtime, "+goVersion+")", goroot); err != nil {
		return nil, err
	}
	for _, path := range slices.Sorted(maps.Keys(modules)) {
		m := modules[path]
		heading := m.Path + " " + m.Version
		dir := m.Dir
		if r := m.Replace; r != nil {
			heading += " => " + strings.TrimSpace(r.Path+" "+r.Version)
			dir = r.Dir
		}
		if dir == "" {
			return nil, fmt.Errorf("module %s has no directory (go mod download)", m.Path)
		}
		if err := appendLicences(&b, heading, dir); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

// appendLicences writes a heading and the licence files at the top of dir
// (LICENSE, LICENCE, COPYING, NOTICE, PATENTS, with any suffix); none is
// an error: a module shipped without its licence is not releasable.
func appendLicences(b *bytes.Buffer, heading, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		up := strings.ToUpper(e.Name())
		if !e.Type().IsRegular() {
			continue
		}
		for _, prefix := range []string{"LICENSE", "LICENCE", "COPYING", "NOTICE", "PATENTS"} {
			if strings.HasPrefix(up, prefix) {
				names = append(names, e.Name())
				break
			}
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: no licence file in %s", heading, dir)
	}
	slices.Sort(names)
	fmt.Fprintf(b, "\n\n%s\n## %s\n%s\n", strings.Repeat("=", 79), heading, strings.Repeat("=", 79))
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(b, "\n--- %s ---\n\n", n)
		b.Write(bytes.TrimRight(data, "\n"))
		b.WriteString("\n")
	}
	return nil
}

// archiveFile is one entry of an archive.
type archiveFile struct {
	Name string // in the archive
	Path string // on disk
	Mode int64
}

// writeArchive writes a gzip-compressed tar of files, reproducibly:
// entries sorted by name, every mtime the given time, uid and gid 0, no
// user or group names, the given modes, and a gzip header without a file
// name or time.
func writeArchive(w io.Writer, files []archiveFile, mtime time.Time) error {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b archiveFile) int { return strings.Compare(a.Name, b.Name) })
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		data, err := os.ReadFile(f.Path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     f.Name,
			Size:     int64(len(data)),
			Mode:     f.Mode,
			ModTime:  mtime.UTC().Truncate(time.Second),
			Format:   tar.FormatUSTAR,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %v", f.Name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// checksums is a SHA256SUMS file (sha256sum's format) for names in dir,
// sorted by name.
func checksums(dir string, names []string) ([]byte, error) {
	names = slices.Sorted(slices.Values(names))
	var b bytes.Buffer
	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(h.Sum(nil)), n)
	}
	return b.Bytes(), nil
}

// writeFileAtomic writes path through a temporary file in its directory.
func writeFileAtomic(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// goRun runs the go command in dir with extra environment, its output
// going to stderr.
func goRun(dir string, env []string, stderr io.Writer, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = stderr
	cmd.Stderr = stderr
	return cmd.Run()
}

// goOutput runs the go command and returns its standard output; a failure
// is an error naming the command and the first line of its stderr.
func goOutput(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, firstLine(errb.String()))
	}
	return string(out), nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
