package main

import (
	"testing"
)

// bridge check and bridge run report every problem of a file at once, in
// line order, unknown keys with the nearest known key: decoding problems
// (unknown keys, a bad duration) do not hide the validation problems of
// the rest of the file (an unknown destination, an ack_wait too short).
func TestCheckReportsEveryProblem(t *testing.T) {
	setCheckEnv(t)
	const f = "testdata/many_problems.yaml"
	want := "bridge: " + f + ":4: stream.subjcts: unknown key \"subjcts\"; did you mean \"subjects\"?\n" +
		"bridge: " + f + ":5: stream.duplicate_window: invalid duration \"2x\": want a Go duration such as 250ms or 2m\n" +
		"bridge: " + f + ":9: destinations.caregiver.timout: unknown key \"timout\"; did you mean \"timeout\"?\n" +
		"bridge: " + f + ":13: routes[0].destination: unknown destination \"nobody\" (defined: caregiver)\n" +
		"bridge: " + f + ":14: routes[0].max_delivr: unknown key \"max_delivr\"; did you mean \"max_deliver\"?\n" +
		"bridge: " + f + ":15: routes[0].ack_wait: must be at least 1s, got 10ms\n"
	for _, args := range [][]string{{"check", "--config", f}, {"run", "--config", f}, {"--config", f}} {
		r := runBridge(t, args...)
		if r.code != 2 || r.stdout != "" || r.stderr != want {
			t.Errorf("bridge %q: want exit 2 and\n%s\ngot %s", args, want, r)
		}
	}
	r := runBridge(t, "check", "--json", "--config", f)
	wantJSON := `{"ok":false,"errors":["` + f + `:4: stream.subjcts: unknown key \"subjcts\"; did you mean \"subjects\"?","` +
		f + `:5: stream.duplicate_window: invalid duration \"2x\": want a Go duration such as 250ms or 2m","` +
		f + `:9: destinations.caregiver.timout: unknown key \"timout\"; did you mean \"timeout\"?","` +
		f + `:13: routes[0].destination: unknown destination \"nobody\" (defined: caregiver)","` +
		f + `:14: routes[0].max_delivr: unknown key \"max_delivr\"; did you mean \"max_deliver\"?","` +
		f + `:15: routes[0].ack_wait: must be at least 1s, got 10ms"],"warnings":[]}` + "\n"
	if r.code != 2 || r.stdout != wantJSON {
		t.Errorf("check --json: want exit 2 and\n%s\ngot %s", wantJSON, r)
	}
}
