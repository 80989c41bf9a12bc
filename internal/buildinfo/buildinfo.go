// Package buildinfo reports what a jetbridge binary was built from, as Go
// recorded it at build time (runtime/debug.ReadBuildInfo): the module
// version, the VCS revision and commit time, and whether the work tree was
// modified. It invents nothing: a value Go did not record is empty, and the
// version of a binary built without module information is "(devel)".
//
// What Go records depends on how the binary was built (see docs/deploy.md,
// "Release archives and versions"):
//
//   - go build in a tagged git checkout: the tag, the revision and its time;
//   - go build in any other checkout: a pseudo-version and the revision
//     (with "+dirty" and Modified when the tree has changes);
//   - go install ...@vX.Y.Z: the tag, and no revision (the module zip has
//     no VCS data);
//   - go run, or a build with -buildvcs=false: "(devel)" and no revision.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Info is what a binary knows of its build. Its JSON keys are those of
// `bridge version --json`.
type Info struct {
	// Version is the main module's version: a tag, a pseudo-version, or
	// "(devel)".
	Version string `json:"version"`
	// Revision is the VCS revision (a full commit hash), or "".
	Revision string `json:"revision"`
	// Time is the commit time of Revision in RFC 3339, or "".
	Time string `json:"time"`
	// Modified is true when the work tree had uncommitted changes.
	Modified bool `json:"modified"`
	// Go is the toolchain version that built the binary.
	Go string `json:"go"`
}

// Read returns the running binary's build information.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return from(bi)
}

// from reads the fields of bi; a nil bi (no module information) gives
// "(devel)".
func from(bi *debug.BuildInfo) Info {
	info := Info{Version: "(devel)", Go: runtime.Version()}
	if bi == nil {
		return info
	}
	if bi.Main.Version != "" {
		info.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		info.Go = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			if t, err := time.Parse(time.RFC3339, s.Value); err == nil {
				info.Time = t.UTC().Format(time.RFC3339)
			}
		case "vcs.modified":
			info.Modified, _ = strconv.ParseBool(s.Value)
		}
	}
	return info
}

// Short is the revision's first 12 characters, as Go's pseudo-versions
// show it, or "".
func (i Info) Short() string {
	if len(i.Revision) > 12 {
		return i.Revision[:12]
	}
	return i.Revision
}

// String is one line for --version and logs: "v0.1.0 (revision
// 0123456789ab, 2026-12-03T10:00:00Z, modified)"; the parenthesis holds
// only what is known.
func (i Info) String() string {
	s := i.Version
	var parts []string
	if i.Revision != "" {
		parts = append(parts, "revision "+i.Short())
	}
	if i.Time != "" {
		parts = append(parts, i.Time)
	}
	if i.Modified {
		parts = append(parts, "modified")
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}
