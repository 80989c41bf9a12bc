package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixtureEnv is the environment every fixture is loaded with.
var fixtureEnv = map[string]string{
	"CAREGIVER_KEY":    "caregiver-api-key",
	"CAREGIVER_SECRET": "whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1ub3BxcnN0dXY=",
}

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}
}

func loadFixture(t *testing.T, path string) (*Config, error) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return loadWith(data, path, lookupIn(fixtureEnv))
}

func TestGoodFixtures(t *testing.T) {
	files, _ := filepath.Glob("testdata/good/*.yaml")
	if len(files) < 3 {
		t.Fatalf("found %d good fixtures, want at least 3", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if _, err := loadFixture(t, f); err != nil {
				t.Fatalf("load: %v", err)
			}
		})
	}
}

// TestBadFixtures loads every file in testdata/bad. Each starts with
//
//	# want: <text that one line of the error contains>
//	# line: <the line that error line names, or ->
func TestBadFixtures(t *testing.T) {
	files, _ := filepath.Glob("testdata/bad/*.yaml")
	if len(files) == 0 {
		t.Fatal("no bad fixtures")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			want, line := fixtureWant(t, f)
			_, err := loadFixture(t, f)
			if err == nil {
				t.Fatalf("load succeeded, want an error containing %q", want)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T is not a *ValidationError: %v", err, err)
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if !strings.Contains(l, want) {
					continue
				}
				if line != "-" && !strings.HasPrefix(l, f+":"+line+": ") {
					t.Fatalf("error line %q does not start with %q", l, f+":"+line+": ")
				}
				return
			}
			t.Fatalf("error does not contain %q:\n%v", want, err)
		})
	}
}

func fixtureWant(t *testing.T, path string) (want, line string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(string(data), "\n", 3)
	want, ok1 := strings.CutPrefix(lines[0], "# want: ")
	line, ok2 := strings.CutPrefix(lines[1], "# line: ")
	if !ok1 || !ok2 || want == "" {
		t.Fatalf("%s must start with '# want: TEXT' and '# line: N|-'", path)
	}
	return want, line
}

func TestSecretsFromFilesFixture(t *testing.T) {
	c, err := loadFixture(t, "testdata/good/secrets_from_files.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NATS.Password.Value(); got != "nats-password-from-file" {
		t.Errorf("password %q", got)
	}
	if got := c.Destinations["hook"].Headers["X-Api-Key"].Value(); got != "api-key-from-file" {
		t.Errorf("X-Api-Key %q", got)
	}
}
