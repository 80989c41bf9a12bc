package release

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The unit and its example configuration, from test/release.
var (
	unitFile   = filepath.Join(repoRoot, "deploy", "systemd", "jetbridge.service")
	unitConfig = filepath.Join(repoRoot, "deploy", "systemd", "bridge.yaml")
)

// The paths that the unit names on the host.
const (
	installedBridge = "/usr/local/bin/bridge"
	unitExecStart   = installedBridge + " run --config /etc/jetbridge/bridge.yaml"
)

// maxExposure is the highest overall exposure level that
// `systemd-analyze security` may give the unit: "OK" is below 2.0 on its
// scale (0 to 10; 2.0 and above is "MEDIUM").
const maxExposure = 2.0

// systemdAnalyze returns the path of systemd-analyze. Without it, the test
// fails under CI (CI=true) and is skipped elsewhere.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("systemd-analyze")
	if err == nil {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("systemd-analyze is required under CI: %v (Debian package systemd)", err)
	}
	t.Skipf("systemd-analyze not found (%v): install the Debian package systemd", err)
	return ""
}

// unitSettings reads a unit file's Key=Value lines, in order, by key.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not Key=Value: %q", path, line)
		}
		out[k] = append(out[k], v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// testUnit writes a copy of the unit whose ExecStart runs a real bridge
// binary (the tagged build's), since systemd-analyze verify checks that the
// binary exists and is executable; edit may change the copy further. It is
// the only change: the copy's other lines are the unit's.
func testUnit(t *testing.T, edit func(string) string) string {
	t.Helper()
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	if n := strings.Count(unit, "="+installedBridge); n != 1 {
		t.Fatalf("%s sets %s %d times; want once, in ExecStart", unitFile, installedBridge, n)
	}
	bridge := filepath.Join(tagged(t).bin, "bridge")
	unit = strings.Replace(unit, "ExecStart="+installedBridge+" ", "ExecStart="+bridge+" ", 1)
	if !strings.Contains(unit, "ExecStart="+bridge+" ") {
		t.Fatalf("%s: no line ExecStart=%s", unitFile, unitExecStart)
	}
	if edit != nil {
		unit = edit(unit)
	}
	path := filepath.Join(t.TempDir(), "jetbridge.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// verify runs systemd-analyze verify on a unit file and returns its output
// lines that concern the unit, and all of its output.
func verify(t *testing.T, analyze, unit string) (aboutUnit []string, all string, err error) {
	t.Helper()
	cmd := exec.Command(analyze, "verify", unit)
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "jetbridge") || strings.Contains(l, unit) {
			aboutUnit = append(aboutUnit, l)
		}
	}
	return aboutUnit, string(out), err
}

// systemd-analyze verify finds nothing to say about the unit. Negative
// control: a misspelt key in a copy is reported, naming the unit.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := systemdAnalyze(t)
	unit := testUnit(t, nil)
	about, all, err := verify(t, analyze, unit)
	if err != nil || len(about) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, all)
	} else if all != "" {
		t.Logf("systemd-analyze verify, about other units:\n%s", all)
	}

	bad := testUnit(t, func(u string) string { return strings.Replace(u, "ProtectSystem=strict", "ProtectSytem=strict", 1) })
	about, all, _ = verify(t, analyze, bad)
	if len(about) != 1 || !strings.Contains(about[0], "ProtectSytem") {
		t.Errorf("a misspelt key: want one line about it, got:\n%s", all)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for jetbridge\.service: ([0-9.]+) (\S+)`)

// exposure runs systemd-analyze security --offline=true on a unit file and
// returns its overall exposure level and rating; ok is false when this
// systemd-analyze has no offline mode.
func exposure(t *testing.T, analyze, unit string) (level float64, rating string, ok bool) {
	t.Helper()
	cmd := exec.Command(analyze, "security", "--offline=true", "--no-pager", unit)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil && (strings.Contains(stderr.String(), "unrecognized option") || strings.Contains(stderr.String(), "Unknown command")) {
		t.Logf("this systemd-analyze has no offline security mode: %s", strings.TrimSpace(stderr.String()))
		return 0, "", false
	}
	if err != nil {
		t.Fatalf("systemd-analyze security --offline=true %s: %v\n%s%s", unit, err, stdout.Bytes(), stderr.Bytes())
	}
	m := exposureRE.FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("no overall exposure level in:\n%s", stdout.Bytes())
	}
	level, err = strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return level, m[2], true
}

// systemd-analyze security rates the unit's sandbox "OK", below
// maxExposure. It reads the unit file as it is: the offline mode does not
// look for the binary. Negative control: the same unit without its
// hardening block is rated far above.
func TestSystemdUnitExposure(t *testing.T) {
	analyze := systemdAnalyze(t)
	level, rating, ok := exposure(t, analyze, unitFile)
	if !ok {
		t.Skip("skipped: systemd-analyze security --offline=true is not supported here")
	}
	t.Logf("overall exposure level: %.1f %s", level, rating)
	if level >= maxExposure || rating != "OK" {
		t.Errorf("exposure level %.1f %s, want OK (below %.1f)", level, rating, maxExposure)
	}

	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	a, b := strings.Index(unit, "# Hardening."), strings.Index(unit, "[Install]")
	if a < 0 || b < a {
		t.Fatalf("%s: no \"# Hardening.\" block before [Install]", unitFile)
	}
	bare := filepath.Join(t.TempDir(), "jetbridge.service")
	if err := os.WriteFile(bare, []byte(unit[:a]+unit[b:]), 0o644); err != nil {
		t.Fatal(err)
	}
	if level, rating, _ := exposure(t, analyze, bare); level < maxExposure {
		t.Errorf("without the hardening block: exposure level %.1f %s, want %.1f or more", level, rating, maxExposure)
	} else {
		t.Logf("control, without the hardening block: %.1f %s", level, rating)
	}
}

// The unit says what the brief, the contract and docs/deploy.md rely on:
// one value per key where one is meant.
func TestSystemdUnitSettings(t *testing.T) {
	s := unitSettings(t, unitFile)
	want := map[string]string{
		"ExecStart":                unitExecStart,
		"ExecReload":               "/bin/kill -HUP $MAINPID",
		"Restart":                  "on-failure",
		"RestartPreventExitStatus": "2",
		"KillMode":                 "mixed",
		"DynamicUser":              "yes",
		"StateDirectory":           "jetbridge",
		"ConfigurationDirectory":   "jetbridge",
		"ProtectSystem":            "strict",
		"ProtectHome":              "yes",
		"PrivateTmp":               "yes",
		"PrivateDevices":           "yes",
		"NoNewPrivileges":          "yes",
		"ProtectKernelTunables":    "yes",
		"ProtectKernelModules":     "yes",
		"ProtectKernelLogs":        "yes",
		"ProtectControlGroups":     "yes",
		"ProtectClock":             "yes",
		"ProtectHostname":          "yes",
		"RestrictAddressFamilies":  "AF_INET AF_INET6 AF_UNIX",
		"RestrictNamespaces":       "yes",
		"LockPersonality":          "yes",
		"MemoryDenyWriteExecute":   "yes",
		"RestrictRealtime":         "yes",
		"RestrictSUIDSGID":         "yes",
		"SystemCallArchitectures":  "native",
		"CapabilityBoundingSet":    "",
		"UMask":                    "0077",
		"LimitNOFILE":              "65536",
		"Documentation":            "https://github.com/sotercare/jetbridge/blob/main/docs/deploy.md",
	}
	for k, v := range want {
		if got := s[k]; !slices.Equal(got, []string{v}) {
			t.Errorf("%s=%q, want %q", k, got, v)
		}
	}
	if got := s["SystemCallFilter"]; len(got) == 0 || got[0] != "@system-service" {
		t.Errorf("SystemCallFilter=%q, want @system-service first", got)
	}
	if got := s["RestartSec"]; len(got) != 1 {
		t.Errorf("RestartSec=%q, want one value", got)
	}

	// TimeoutStopSec leaves the drain its shutdown_timeout, and more.
	stop, err := time.ParseDuration(strings.Join(s["TimeoutStopSec"], ""))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	conf, err := os.ReadFile(unitConfig)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^shutdown_timeout: (\S+)`).FindSubmatch(conf)
	if m == nil {
		t.Fatalf("%s sets no shutdown_timeout", unitConfig)
	}
	drain, err := time.ParseDuration(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	if stop <= drain {
		t.Errorf("TimeoutStopSec=%s is not above shutdown_timeout %s", stop, drain)
	}

	// The credentials the unit loads are those the configuration reads, and
	// each comes from /etc/jetbridge/credentials/ID.
	var loaded []string
	for _, lc := range s["LoadCredential"] {
		id, path, _ := strings.Cut(lc, ":")
		if path != "/etc/jetbridge/credentials/"+id {
			t.Errorf("LoadCredential=%s: want %s:/etc/jetbridge/credentials/%s", lc, id, id)
		}
		loaded = append(loaded, id)
	}
	var read []string
	for _, m := range regexp.MustCompile(`(?m)^[^#]*\$\{file:\$\{CREDENTIALS_DIRECTORY\}/([^}]+)\}`).FindAllSubmatch(conf, -1) {
		read = append(read, string(m[1]))
	}
	slices.Sort(loaded)
	slices.Sort(read)
	if !slices.Equal(loaded, read) || len(read) != 2 {
		t.Errorf("credentials loaded by the unit %v, read by %s %v: want the same two", loaded, unitConfig, read)
	}
}

// The example configuration is valid for the bridge, with the credentials
// where systemd puts them ($CREDENTIALS_DIRECTORY); no secret is printed.
func TestSystemdConfigChecks(t *testing.T) {
	bridge := filepath.Join(tagged(t).bin, "bridge")
	creds := t.TempDir()
	secrets := map[string]string{"nats-password": "pw-4b1d9e7c", "caregiver-key": "key-93ac6f02"}
	for id, v := range secrets {
		if err := os.WriteFile(filepath.Join(creds, id), []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bridge, "check", "--config", unitConfig)
	cmd.Env = append(os.Environ(), "CREDENTIALS_DIRECTORY="+creds)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bridge check --config %s: %v\n%s", unitConfig, err, out)
	}
	if !strings.HasPrefix(string(out), "configuration OK\n") {
		t.Errorf("bridge check: want configuration OK first:\n%s", out)
	}
	for id, v := range secrets {
		if strings.Contains(string(out), v) {
			t.Errorf("bridge check printed the %s credential", id)
		}
	}
}
