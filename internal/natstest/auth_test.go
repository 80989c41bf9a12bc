package natstest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Every method: the server's credentials connect and reach JetStream; the
// other credentials of NewCreds are refused, and accepted after a Restart
// with them, on the same port, with the stream still there.
func TestAuthServerMethods(t *testing.T) {
	for _, m := range AuthMethods {
		t.Run(string(m), func(t *testing.T) {
			s := StartAuth(t, m)
			good, other := s.Creds(), s.NewCreds(t)

			js := authConnect(t, s.URL(), good)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUTH", Subjects: []string{"auth.>"}}); err != nil {
				t.Fatalf("create stream: %v", err)
			}
			before := s.Rejections()
			if err := tryConnect(s.URL(), other); err == nil {
				t.Fatal("the server accepted credentials it was not started with")
			} else {
				t.Logf("refused as it should: %v", err)
			}
			if m != AuthTLS && m != AuthMutualTLS && s.Rejections() != before+1 {
				t.Errorf("Rejections %d after one refused client, want %d", s.Rejections(), before+1)
			}

			s.Restart(t, other)

			if err := tryConnect(s.URL(), good); err == nil {
				t.Fatal("after Restart the server still accepts the old credentials")
			}
			js = authConnect(t, s.URL(), other)
			if m == AuthJWT {
				return // another account: JetStream state is per account
			}
			if _, err := js.Stream(ctx, "AUTH"); err != nil {
				t.Fatalf("stream after restart: %v", err)
			}
		})
	}
}

// Without credentials, every method refuses a client.
func TestAuthServerRefusesAnonymous(t *testing.T) {
	for _, m := range AuthMethods {
		t.Run(string(m), func(t *testing.T) {
			s := StartAuth(t, m)
			err := tryConnect(s.URL(), Creds{})
			if err == nil {
				t.Fatal("anonymous client accepted")
			}
			if !errors.Is(err, nats.ErrAuthorization) && m != AuthTLS && m != AuthMutualTLS {
				t.Fatalf("want an authorization violation, got %v", err)
			}
		})
	}
}

func authConnect(t *testing.T, url string, c Creds) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, c.Options()...)...)
	if err != nil {
		t.Fatalf("connect with %s credentials: %v", c.Method, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func tryConnect(url string, c Creds) error {
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(2 * time.Second)}, c.Options()...)...)
	if err != nil {
		return err
	}
	nc.Close()
	return nil
}
