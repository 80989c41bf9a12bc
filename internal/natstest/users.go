package natstest

import (
	"net/url"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// User is a client login of a server started by StartUsers. It may
// subscribe to anything and publish to anything but DenyPublish (NATS
// subject patterns): a test takes one permission from one client, e.g.
// the writes to some keys of a bucket, and leaves the rest as it is.
type User struct {
	Name, Password string
	DenyPublish    []string
}

// UsersServer is an in-process nats-server with JetStream whose clients
// log in as one of its users.
type UsersServer struct {
	ns    *server.Server
	users []User
}

// StartUsers starts a server on 127.0.0.1 (random port, store dir
// t.TempDir()) for users (at least one; names unique); a client connecting
// without credentials is users[0]. It waits until JetStream answers and
// shuts the server down in t.Cleanup.
func StartUsers(t testing.TB, users ...User) *UsersServer {
	t.Helper()
	if len(users) == 0 {
		t.Fatal("natstest: StartUsers needs a user")
	}
	var su []*server.User
	for _, u := range users {
		perm := &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: u.DenyPublish}}
		su = append(su, &server.User{Username: u.Name, Password: u.Password, Permissions: perm})
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: uniqueName("natstest-users"),
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
		Users:      su,
		NoAuthUser: users[0].Name,
	})
	if err != nil {
		t.Fatalf("natstest: users server options: %v", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(startTimeout) || ns.Addr() == nil {
		ns.Shutdown()
		t.Fatalf("natstest: users server did not start within %s", startTimeout)
	}
	s := &UsersServer{ns: ns, users: users}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	waitJetStreamWith(t, s.URL(), nil, startTimeout)
	return s
}

// URL is "nats://127.0.0.1:PORT": a client connecting with it is users[0].
func (s *UsersServer) URL() string { return "nats://" + s.ns.Addr().String() }

// URLFor is the server's URL with the credentials of user name in it, so
// that a client connecting with it logs in as that user.
func (s *UsersServer) URLFor(t testing.TB, name string) string {
	t.Helper()
	for _, u := range s.users {
		if u.Name == name {
			return (&url.URL{Scheme: "nats", User: url.UserPassword(u.Name, u.Password), Host: s.ns.Addr().String()}).String()
		}
	}
	t.Fatalf("natstest: no user %q", name)
	return ""
}
