package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// bridge run logs a warning naming a store dir other users can write to
// and its mode, and runs. Control: a 0700 store dir gets no such warning.
func TestRunWarnsAboutAStoreDirOthersCanWrite(t *testing.T) {
	unsetenv(t, "NATS_URL")
	for _, tc := range []struct {
		mode os.FileMode
		want string // "" for none
	}{
		{0o777, "store dir %[1]s is writable by other users (mode 0777): any user of this host can change the stored messages " +
			"or plant files in it; remove their write permission (chmod o-w %[1]s)"},
		{0o700, ""},
	} {
		t.Run(fmt.Sprintf("%04o", tc.mode), func(t *testing.T) {
			store := t.TempDir()
			if err := os.Chmod(store, tc.mode); err != nil {
				t.Fatal(err)
			}
			admin := freePort(t)
			d := startDaemon(t, fmt.Sprintf(`nats:
  embedded: {listen: "%s", store_dir: "%s"}
admin: {listen: "%s"}
destinations:
  d: {url: "http://127.0.0.1:1/"}
routes:
  - {name: r, subjects: ["events.>"], destination: d}
`, freePort(t), store, admin))
			if err := waitFor(20*time.Second, func() error {
				if code, body := get(admin, "/readyz"); code != http.StatusOK {
					return fmt.Errorf("/readyz %d %s", code, body)
				}
				return nil
			}); err != nil {
				t.Fatalf("bridge not ready: %v", err)
			}
			var got []string
			for _, line := range lines(d.logs.String()) {
				var entry struct{ Level, Key, Message string }
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				if entry.Key == "nats.embedded.store_dir" || strings.Contains(entry.Message, "writable") {
					got = append(got, entry.Level+": "+entry.Message)
				}
			}
			var want []string
			if tc.want != "" {
				want = []string{"warn: " + fmt.Sprintf(tc.want, store)}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("store dir warnings %q\nwant %q", got, want)
			}
		})
	}
}
