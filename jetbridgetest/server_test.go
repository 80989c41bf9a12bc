package jetbridgetest_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
)

// Every auth method: the kit's connections and a bridge use the generated
// credentials; a client without them is refused (the negative control
// that the server really requires them).
func TestAuthMethods(t *testing.T) {
	t.Parallel()
	for _, m := range []jetbridgetest.AuthMethod{
		jetbridgetest.AuthToken, jetbridgetest.AuthUserPassword, jetbridgetest.AuthNKey,
		jetbridgetest.AuthJWT, jetbridgetest.AuthTLS, jetbridgetest.AuthMutualTLS,
	} {
		t.Run(string(m), func(t *testing.T) {
			t.Parallel()
			srv := jetbridgetest.NewServer(t, jetbridgetest.WithAuth(m))
			if c := srv.Credentials(); c.Method != m || len(c.Options()) == 0 {
				t.Fatalf("credentials %+v for %s", c, m)
			}
			rec := jetbridgetest.NewReceiver(t)
			b := jetbridgetest.StartBridge(t, srv, routeYAML(rec.URL(), ""))
			srv.Publish(t, producer.Event{ID: "a-1", Type: "t", Payload: []byte(`{}`)})
			if s := b.WaitEvent(t, "a-1"); s.Outcome != bridge.OutcomeDelivered {
				t.Fatalf("settled %s", s.Outcome)
			}

			nc, err := nats.Connect(srv.URL(), nats.Timeout(2*time.Second), nats.NoReconnect())
			if err == nil {
				nc.Close()
				t.Fatalf("%s: a client without credentials was accepted", m)
			}
		})
	}
}

// RotateCredentials: the old credentials are refused afterwards, the new
// ones work (the kit's connection uses them), the store survives.
func TestRotateCredentials(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t, jetbridgetest.WithAuth(jetbridgetest.AuthUserPassword))
	old := srv.Credentials()
	jetbridgetest.Provision(t, srv, routeYAML("http://127.0.0.1:1", ""))
	srv.Publish(t, producer.Event{ID: "before", Type: "t", Payload: []byte(`{}`)})
	before := srv.Rejections()

	c := srv.RotateCredentials(t)
	if c.Password == old.Password {
		t.Fatal("rotation kept the password")
	}
	if nc, err := nats.Connect(srv.URL(), append(old.Options(), nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("the old credentials were accepted after the rotation")
	}
	if srv.Rejections() <= before {
		t.Fatalf("rejections %d, want more than %d", srv.Rejections(), before)
	}
	// The kit's own connection now uses the new credentials.
	srv.Publish(t, producer.Event{ID: "after", Type: "t", Payload: []byte(`{}`)})
	if n := len(srv.Messages(t, "EVENTS")); n != 2 {
		t.Fatalf("the stream holds %d events after the rotation, want both", n)
	}
}

// A 3-node cluster with R3 streams delivers, and keeps delivering while
// one node is down.
func TestCluster(t *testing.T) {
	t.Parallel()
	srv := jetbridgetest.NewServer(t, jetbridgetest.WithCluster())
	if srv.Nodes() != 3 {
		t.Fatalf("%d nodes", srv.Nodes())
	}
	rec := jetbridgetest.NewReceiver(t)
	b := jetbridgetest.StartBridge(t, srv, "stream: {replicas: 3}\ndead_letter: {replicas: 3}\n"+routeYAML(rec.URL(), ""))
	srv.Publish(t, producer.Event{ID: "c-1", Type: "t", Payload: []byte(`{}`)})
	b.WaitEvent(t, "c-1")
	srv.ShutdownNode(t, 2)
	srv.Publish(t, producer.Event{ID: "c-2", Type: "t", Payload: []byte(`{}`)})
	b.WaitEvent(t, "c-2")
	srv.RestartNode(t, 2)
	if a, b := len(rec.Events("c-1")), len(rec.Events("c-2")); a == 0 || b == 0 {
		t.Fatalf("%d requests for c-1, %d for c-2; want both delivered", a, b)
	}
}
