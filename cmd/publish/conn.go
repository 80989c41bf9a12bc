package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/tracing"
)

// connName is the client connection name the server shows.
const connName = "jetbridge-publish"

// authFlags are the authentication and TLS flags.
type authFlags struct {
	creds, nkey, user, password, token string
	tlsCA, tlsCert, tlsKey             string
}

func (a *authFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.creds, "creds", "", "")
	fs.StringVar(&a.nkey, "nkey", "", "")
	fs.StringVar(&a.user, "user", "", "")
	fs.StringVar(&a.password, "password", "", "")
	fs.StringVar(&a.token, "token", "", "")
	fs.StringVar(&a.tlsCA, "tls-ca", "", "")
	fs.StringVar(&a.tlsCert, "tls-cert", "", "")
	fs.StringVar(&a.tlsKey, "tls-key", "", "")
}

// check rejects combinations that cannot work.
func (a *authFlags) check() error {
	var given []string
	for _, f := range []struct{ name, v string }{
		{"--creds", a.creds}, {"--nkey", a.nkey}, {"--user", a.user}, {"--token", a.token},
	} {
		if f.v != "" {
			given = append(given, f.name)
		}
	}
	switch {
	case len(given) > 1:
		return usagef("give one of --creds, --nkey, --user or --token, not %s", strings.Join(given, " and "))
	case a.password != "" && a.user == "":
		return usagef("--password needs --user")
	case (a.tlsCert == "") != (a.tlsKey == ""):
		return usagef("--tls-cert and --tls-key go together")
	}
	return nil
}

// options maps the flags to client options.
func (a *authFlags) options() ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(connName)}
	switch {
	case a.creds != "":
		opts = append(opts, nats.UserCredentials(a.creds))
	case a.nkey != "":
		o, err := nats.NkeyOptionFromSeed(a.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey: %w", err)
		}
		opts = append(opts, o)
	case a.user != "":
		opts = append(opts, nats.UserInfo(a.user, a.password))
	case a.token != "":
		opts = append(opts, nats.Token(a.token))
	}
	if a.tlsCA != "" {
		opts = append(opts, nats.RootCAs(a.tlsCA))
	}
	if a.tlsCert != "" {
		opts = append(opts, nats.ClientCert(a.tlsCert, a.tlsKey))
	}
	return opts, nil
}

// secrets are the values to keep out of error messages.
func (a *authFlags) secrets(rawURL string) []string {
	s := []string{a.password, a.token}
	for _, u := range parseURLs(rawURL) {
		if u.User != nil {
			p, ok := u.User.Password()
			if !ok {
				p = u.User.Username() // nats://TOKEN@host
			}
			s = append(s, p)
		}
	}
	return s
}

// parseURLs parses the comma-separated server list as nats.Connect reads
// it (a missing scheme means nats://). Unparseable entries are nil.
func parseURLs(raw string) []*url.URL {
	var out []*url.URL
	for _, s := range strings.Split(raw, ",") {
		s = strings.TrimSpace(s)
		if !strings.Contains(s, "://") {
			s = "nats://" + s
		}
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			u = nil
		}
		out = append(out, u)
	}
	return out
}

// checkURL validates --url without echoing it: it may hold credentials.
func checkURL(raw string) error {
	for i, u := range parseURLs(raw) {
		if u == nil {
			return usagef("--url: server %d of the list is not a valid URL", i+1)
		}
	}
	return nil
}

// redactURL is the server list with every user info masked, for messages.
// (url.URL.Redacted masks only a password, not a token given as the user.)
func redactURL(raw string) string {
	var out []string
	for _, u := range parseURLs(raw) {
		if u == nil {
			out = append(out, "[invalid URL]")
			continue
		}
		r := *u
		if r.User != nil {
			r.User = url.User("xxxxx")
		}
		out = append(out, r.String())
	}
	return strings.Join(out, ",")
}

// conn is a connection to JetStream with a publisher on top.
type conn struct {
	nc      *nats.Conn
	pub     *producer.Publisher
	secrets []string
}

// connect connects with the flags' authentication and TLS.
func connect(o *options) (*conn, error) {
	c := &conn{secrets: o.auth.secrets(o.url)}
	opts, err := o.auth.options()
	if err != nil {
		return nil, c.scrub(err)
	}
	nc, err := nats.Connect(o.url, opts...)
	if err != nil {
		return nil, c.scrub(fmt.Errorf("connect to NATS at %s: %w", redactURL(o.url), err))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, c.scrub(fmt.Errorf("JetStream at %s: %w", redactURL(o.url), err))
	}
	// The trace of $TRACEPARENT travels with each event (README "Tracing").
	c.nc, c.pub = nc, producer.NewPublisher(js, o.root, producer.WithHeaders(tracing.InjectEnvironment))
	return c, nil
}

func (c *conn) close() { c.nc.Close() }

// publish publishes ev, whose subject is subject, and waits for the ack.
func (c *conn) publish(ev producer.Event, subject string) (producer.PublishResult, error) {
	ctx, cancel := publishCtx()
	defer cancel()
	res, err := c.pub.Publish(ctx, ev)
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, producer.ErrNoStream):
		return res, fmt.Errorf("no stream captures subject %s (is the bridge running, or the stream created?)", subject)
	case ctx.Err() != nil:
		return res, fmt.Errorf("%s: %w", subject, context.Cause(ctx))
	}
	msg := strings.TrimPrefix(err.Error(), "bridge: publish "+subject+": ")
	return res, c.scrub(fmt.Errorf("%s: %s", subject, msg))
}

// scrub masks any secret that made it into err's message (defence in
// depth: nats.go errors are not known to carry them). Secrets shorter than
// 4 bytes are left alone: masking them would garble the message.
func (c *conn) scrub(err error) error {
	msg := err.Error()
	for _, s := range c.secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	if msg == err.Error() {
		return err
	}
	return errors.New(msg)
}
