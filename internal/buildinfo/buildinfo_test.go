package buildinfo

import (
	"runtime/debug"
	"testing"
)

// What Go records is reported as is, for each way a binary is built.
func TestFrom(t *testing.T) {
	setting := func(kv ...string) []debug.BuildSetting {
		var out []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			out = append(out, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	for _, tt := range []struct {
		name string
		bi   *debug.BuildInfo
		want Info
		str  string
	}{
		{"no module information", nil, Info{Version: "(devel)", Go: "go1.26.8"}, "(devel)"},
		{"go run", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}},
			Info{Version: "(devel)", Go: "go1.26.8"}, "(devel)"},
		{"go build in a tagged checkout", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"},
			Settings: setting("vcs", "git", "vcs.revision", "0123456789abcdef0123456789abcdef01234567", "vcs.time", "2026-12-03T10:00:00Z", "vcs.modified", "false")},
			Info{Version: "v0.1.0", Revision: "0123456789abcdef0123456789abcdef01234567", Time: "2026-12-03T10:00:00Z", Go: "go1.26.8"},
			"v0.1.0 (revision 0123456789ab, 2026-12-03T10:00:00Z)"},
		{"a modified tree", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.1-0.20261203100000-0123456789ab+dirty"},
			Settings: setting("vcs.revision", "0123456789abcdef0123456789abcdef01234567", "vcs.time", "2026-12-03T11:00:00+01:00", "vcs.modified", "true")},
			Info{Version: "v0.1.1-0.20261203100000-0123456789ab+dirty", Revision: "0123456789abcdef0123456789abcdef01234567", Time: "2026-12-03T10:00:00Z", Modified: true, Go: "go1.26.8"},
			"v0.1.1-0.20261203100000-0123456789ab+dirty (revision 0123456789ab, 2026-12-03T10:00:00Z, modified)"},
		{"go install @version", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"}},
			Info{Version: "v0.1.0", Go: "go1.26.8"}, "v0.1.0"},
		{"an unparsable time is left out", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.1.0"},
			Settings: setting("vcs.time", "yesterday")},
			Info{Version: "v0.1.0", Go: "go1.26.8"}, "v0.1.0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := from(tt.bi)
			if tt.bi == nil {
				got.Go = "go1.26.8" // the running toolchain's
			}
			if got != tt.want {
				t.Errorf("from = %+v, want %+v", got, tt.want)
			}
			if s := got.String(); s != tt.str {
				t.Errorf("String = %q, want %q", s, tt.str)
			}
		})
	}
}
