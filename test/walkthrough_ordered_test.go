package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// The walkthrough "Try it: two replicas, kill one" (docs/delivery.md), run
// as written: its blocks, with the built binaries for bin/, free ports for
// the documented ones, absolute paths for the config and deliveries.jsonl,
// and the store in a temporary directory. The receiver, the JetStream
// process and the two replicas start; the 2,000 readings are published;
// the replicas own two partitions each (what the status lines show); the
// newest replica is killed by the block's pkill while deliveries go on;
// the block that checks the order prints 2000 delivered and 0 out of
// order. The check's own control: on deliveries with one reading before
// an earlier one of its device, it prints 1 out of order.
func TestOrderedWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("pkill"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("pkill is missing (Debian package procps)")
		}
		t.Skip("pkill is missing (Debian package procps)")
	}
	root := moduleRoot(t)
	bin := readmeBinaries(t)
	blocks := map[string]string{}
	for _, b := range readmeBlocks(t) {
		if b.file != "docs/delivery.md" || b.lang != "sh" {
			continue
		}
		for _, marker := range []string{"--no-delivery", "bin/publish --jsonl -", "pkill -9", "out of order"} {
			if strings.Contains(b.text, marker) {
				blocks[marker] = b.text
			}
		}
	}
	if len(blocks) != 4 {
		t.Fatalf("docs/delivery.md: found the blocks %v, want the walkthrough's 4", blocks)
	}
	work := t.TempDir()
	deliveries := filepath.Join(work, "deliveries.jsonl")
	recv, natsAddr, admin, a1, a2 := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	fix := strings.NewReplacer(
		"bin/", bin+"/",
		"config/ordered.yaml", filepath.Join(root, "config", "ordered.yaml"),
		"deliveries.jsonl", deliveries,
		"127.0.0.1:9090", recv, "127.0.0.1:4222", natsAddr,
		"127.0.0.1:8081", a1, "127.0.0.1:8082", a2,
	)
	env := []string{"JETBRIDGE_STORE_DIR=" + filepath.Join(work, "store"), "JETBRIDGE_NATS_LISTEN=" + natsAddr,
		"JETBRIDGE_ADMIN_LISTEN=" + admin, "JETBRIDGE_RECEIVER_URL=http://" + recv + "/events", "JETBRIDGE_LOG_FORMAT=json"}
	// publish's server: the docs' default, 127.0.0.1:4222, moved.
	shEnv := append(slices.Clone(env), "NATS_URL=nats://"+natsAddr)
	sh := func(script string) (string, int) {
		return runIn(work, shEnv, "bash", "-c", fix.Replace(script))
	}

	// The four processes, in order; go build is done (readmeBinaries).
	var serving []string
	for _, line := range strings.Split(blocks["--no-delivery"], "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "go build") {
			serving = append(serving, line)
		}
	}
	if len(serving) != 4 || !strings.Contains(serving[0], "receive") || !strings.Contains(serving[1], "--no-delivery") {
		t.Fatalf("the walkthrough's processes: %q", serving)
	}
	var procs []*child
	for i, line := range serving {
		// exec env: the program replaces the shell (killed in cleanup, named
		// by pkill), its variables set as the line sets them.
		c := startBridge(t, "bash", []string{"-c", "exec env " + fix.Replace(line)}, env...)
		procs = append(procs, c)
		switch i {
		case 0:
			natstest.Eventually(t, readyTimeout, func() error {
				c.failIfExited(t)
				// A connection, not a request: the receiver would count it.
				conn, err := net.DialTimeout("tcp", recv, time.Second)
				if err == nil {
					conn.Close()
				}
				return err
			})
		case 1:
			c.waitReady(t, "nats://"+natsAddr, "EVENTS")
		}
	}
	for _, a := range []string{a1, a2} {
		natstest.Eventually(t, readyTimeout, func() error {
			resp, err := http.Get("http://" + a + "/readyz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s/readyz: %d", a, resp.StatusCode)
			}
			return nil
		})
	}

	// Publish, as the block does (the curl lines are the status read below).
	pub, _, _ := strings.Cut(blocks["bin/publish --jsonl -"], "\ncurl")
	if out, code := sh(pub); code != 0 || !strings.Contains(out, "d4-0500") {
		t.Fatalf("publishing: exit %d\n%s", code, out)
	}
	owned := regexp.MustCompile(`"owned":\[[0-9,]*\]`)
	natstest.Eventually(t, 20*time.Second, func() error {
		var got []string
		for _, a := range []string{a1, a2} {
			resp, err := http.Get("http://" + a + "/status")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			flat := strings.NewReplacer(" ", "", "\n", "").Replace(string(body)) // tr -d ' \n'
			got = append(got, owned.FindString(flat))
		}
		for _, g := range got {
			if strings.Count(g, ",") != 1 { // two partitions: one comma
				return fmt.Errorf("owned %q, want two partitions each", got)
			}
		}
		return nil
	})

	// Kill the newest replica while deliveries go on.
	accepted := func() map[string]int {
		f, err := os.ReadFile(deliveries)
		if err != nil {
			return nil
		}
		ids := map[string]int{}
		id := regexp.MustCompile(`"event_id":"([^"]*)"`)
		sc := bufio.NewScanner(bytes.NewReader(f))
		for sc.Scan() {
			if strings.Contains(sc.Text(), `"status":202`) {
				if m := id.FindStringSubmatch(sc.Text()); m != nil {
					ids[m[1]]++
				}
			}
		}
		return ids
	}
	natstest.Eventually(t, 30*time.Second, func() error {
		if n := len(accepted()); n < 400 {
			return fmt.Errorf("%d readings accepted", n)
		}
		return nil
	})
	if out, code := sh(blocks["pkill -9"]); code != 0 {
		t.Fatalf("pkill: exit %d\n%s", code, out)
	}
	select {
	case <-procs[3].done:
	case <-time.After(5 * time.Second):
		t.Fatal("the replica of terminal 4 is still running after pkill")
	}
	if n := len(accepted()); n >= 2000 {
		t.Fatalf("every reading was accepted before the kill (%d): it was not killed while deliveries went on", n)
	}
	procs[2].failIfExited(t)

	natstest.Eventually(t, time.Minute, func() error {
		if n := len(accepted()); n != 2000 {
			return fmt.Errorf("%d of 2000 readings accepted", n)
		}
		return nil
	})
	want := regexp.MustCompile(`^2000 delivered, 0 out of order, [0-9]+ again\n$`)
	if out, code := sh(blocks["out of order"]); code != 0 || !want.MatchString(out) {
		t.Fatalf("the order check: exit %d, %q; want %s", code, out, want)
	} else {
		t.Logf("the order check printed %q", out)
	}

	// The check's control: one reading before an earlier one of its device.
	bad := `{"status":202,"event_id":"d1-0002"}` + "\n" + `{"status":202,"event_id":"d1-0001"}` + "\n"
	if err := os.WriteFile(deliveries, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(blocks["out of order"]); out != "2 delivered, 1 out of order, 0 again\n" {
		t.Fatalf("the order check on an inversion: %q, want 2 delivered, 1 out of order", out)
	}
}
