package embedded_test

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/sotercare/jetbridge/internal/embedded"
)

// A store dir other users may write to (a mode 0777 volume) is reported by
// a warning naming it and its mode; the server still starts. Control: the
// same check on a 0700 dir warns nothing.
func TestStartWarnsAboutAStoreDirOthersCanWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode os.FileMode
		want []string
	}{
		{"0777", 0o777, []string{"store dir %[1]s is writable by other users (mode 0777): any user of this host can change the stored messages " +
			"or plant files in it; remove their write permission (chmod o-w %[1]s)"}},
		{"1777", 0o777 | os.ModeSticky, []string{"store dir %[1]s is writable by other users (mode 1777): any user of this host can change the stored messages " +
			"or plant files in it; remove their write permission (chmod o-w %[1]s)"}},
		{"0700", 0o700, nil},
		{"0770", 0o770, nil}, // the group is the owner's choice (e.g. a Kubernetes fsGroup)
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			s := start(t, embedded.Options{StoreDir: dir})
			var want []string
			for _, w := range tc.want {
				want = append(want, fmt.Sprintf(w, dir))
			}
			if got := s.Warnings(); !slices.Equal(got, want) {
				t.Fatalf("Warnings() = %q\nwant %q", got, want)
			}
		})
	}
}
