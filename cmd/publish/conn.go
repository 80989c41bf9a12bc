package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/pflag"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/cli"
	"github.com/sotercare/jetbridge/producer"
)

// connName is the client connection name the server shows.
const connName = "jetbridge-publish"

// authFlags are the authentication and TLS flags.
type authFlags struct{ cli.Auth }

func (a *authFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&a.CredsFile, "creds", "", "NATS user credentials file")
	fs.StringVar(&a.NKeySeedFile, "nkey", "", "NKey seed file")
	fs.StringVar(&a.User, "user", "", "user name, with --password")
	fs.StringVar(&a.Password, "password", "", "password of --user")
	fs.StringVar(&a.Token, "token", "", "authentication token")
	fs.StringVar(&a.CAFile, "tls-ca", "", "CA certificates to verify the server")
	fs.StringVar(&a.CertFile, "tls-cert", "", "client certificate, with --tls-key")
	fs.StringVar(&a.KeyFile, "tls-key", "", "client key of --tls-cert")
}

// check rejects combinations that cannot work.
func (a *authFlags) check() error {
	var given []string
	for _, f := range []struct{ name, v string }{
		{"--creds", a.CredsFile}, {"--nkey", a.NKeySeedFile}, {"--user", a.User}, {"--token", a.Token},
	} {
		if f.v != "" {
			given = append(given, f.name)
		}
	}
	switch {
	case len(given) > 1:
		return usagef("give one of --creds, --nkey, --user or --token, not %s", strings.Join(given, " and "))
	case a.Password != "" && a.User == "":
		return usagef("--password needs --user")
	case (a.CertFile == "") != (a.KeyFile == ""):
		return usagef("--tls-cert and --tls-key go together")
	}
	return nil
}

// options maps the flags to client options.
func (a *authFlags) options() ([]nats.Option, error) {
	opts, err := a.Auth.Options()
	if err != nil {
		return nil, fmt.Errorf("--nkey: %w", err)
	}
	return append([]nats.Option{nats.Name(connName)}, opts...), nil
}

// secrets are the values to keep out of error messages.
func (a *authFlags) secrets(rawURL string) []string {
	s := []string{a.Password, a.Token}
	for _, u := range cli.ParseServers(rawURL) {
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

// checkURL validates --server without echoing it: it may hold
// credentials.
func checkURL(raw string) error {
	for i, u := range cli.ParseServers(raw) {
		if u == nil {
			return usagef("--server: server %d of the list is not a valid URL", i+1)
		}
	}
	return nil
}

// redactURL is the server list, each server as the NATS client reads it,
// redacted as config redacts URLs (user info and query values masked).
func redactURL(raw string) string {
	var out []string
	for _, u := range cli.ParseServers(raw) {
		if u == nil {
			out = append(out, "[invalid URL]")
			continue
		}
		out = append(out, config.Secret(u.String()).RedactedURL())
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
		class := cli.ClassifyConnErr(err)
		return nil, c.scrub(fmt.Errorf("%s at %s: %s; %s", class, redactURL(o.url), cli.ConnectCause(err, o.url), connHint(class)))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, c.scrub(fmt.Errorf("JetStream at %s: %w", redactURL(o.url), err))
	}
	// The trace of $TRACEPARENT travels with each event (docs/tracing.md).
	c.nc, c.pub = nc, producer.NewPublisher(js, o.root, producer.WithHeaders(headerHook(o.header)))
	return c, nil
}

// connHint is what to check, among publish's flags, for a class of
// connection failure.
func connHint(c cli.ConnErrClass) string {
	switch c {
	case cli.ConnAuth:
		return "check --user and --password, --token, --nkey or --creds against the server's accounts"
	case cli.ConnTLS:
		return "check the URL's scheme (tls:// only for a TLS server), --tls-ca for the server's certificate, and --tls-cert with --tls-key when it wants a client certificate"
	case cli.ConnCreds:
		return "check --creds or --nkey (a creds file from nsc, an nkey seed starting SU)"
	}
	return "is it running there? Give the server with -s/--server or $NATS_URL"
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
