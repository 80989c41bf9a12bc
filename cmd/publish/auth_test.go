package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
)

// credsFlags are the publish flags that carry c.
func credsFlags(c natstest.Creds) []string {
	var f []string
	add := func(flag, v string) {
		if v != "" {
			f = append(f, flag, v)
		}
	}
	add("--token", c.Token)
	add("--user", c.User)
	add("--password", c.Password)
	add("--nkey", c.NKeySeedFile)
	add("--creds", c.CredsFile)
	add("--tls-ca", c.CAFile)
	add("--tls-cert", c.CertFile)
	add("--tls-key", c.KeyFile)
	return f
}

// publish's authentication flags against a real server requiring each
// method in turn: the right credentials store the event; without them
// (TLS methods: trusting the CA but without a client certificate, or
// without the CA) publish exits 1 naming the cause, and no secret appears
// in what it prints.
func TestPublishAuthMethods(t *testing.T) {
	for _, method := range natstest.AuthMethods {
		t.Run(string(method), func(t *testing.T) {
			srv := natstest.StartAuth(t, method)
			creds := srv.Creds()
			nc, err := nats.Connect(srv.URL(), creds.Options()...)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}}); err != nil {
				t.Fatal(err)
			}

			args := append([]string{"--server", srv.URL(), "--type", "auth.check", "--id", "a1"}, credsFlags(creds)...)
			if o := runPublish(t, "", append(args, `{"n":1}`)...); o.code != 0 || !strings.HasPrefix(o.stdout, "stored events.info.auth.check id=a1 ") {
				t.Fatalf("with the right credentials: exit %d, stdout %q, stderr %q", o.code, o.stdout, o.stderr)
			}

			wrong := natstest.Creds{}
			switch method {
			case natstest.AuthMutualTLS:
				wrong.CAFile = creds.CAFile // trusts the server, has no client certificate
			}
			o := runPublish(t, "", append([]string{"--server", srv.URL(), "--type", "auth.check", "--id", "a2"}, append(credsFlags(wrong), `{"n":1}`)...)...)
			wantHint := "--token"
			if method == natstest.AuthTLS || method == natstest.AuthMutualTLS {
				wantHint = "--tls-ca"
			}
			if o.code != 1 || !strings.Contains(o.stderr, wantHint) || strings.Contains(o.stderr, "is it running") {
				t.Fatalf("without the credentials: exit %d, stderr %q; want 1 with the cause and what to check (%s)", o.code, o.stderr, wantHint)
			}
			for _, s := range creds.Secrets {
				if s != "" && (strings.Contains(o.stderr, s) || strings.Contains(o.stdout, s)) {
					t.Fatalf("a secret appears in the output: %q", o.stderr)
				}
			}
			t.Logf("without the credentials: %s", strings.TrimSpace(o.stderr))
		})
	}
}
