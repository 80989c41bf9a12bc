package cli

import "github.com/nats-io/nats.go"

// Auth is how a command authenticates to NATS and verifies its TLS: the
// bridge fills it from the configuration's nats section, publish from its
// flags. At most one of CredsFile, NKeySeedFile, User and Token is used,
// in that order.
type Auth struct {
	CredsFile, NKeySeedFile string
	User, Password, Token   string
	CAFile                  string
	CertFile, KeyFile       string
}

// Options are the client options of a. Its error is the nkey seed file's
// (the only one read here); callers name their key or flag.
func (a Auth) Options() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case a.CredsFile != "":
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeySeedFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	}
	if a.CAFile != "" {
		opts = append(opts, nats.RootCAs(a.CAFile))
	}
	if a.CertFile != "" || a.KeyFile != "" {
		opts = append(opts, nats.ClientCert(a.CertFile, a.KeyFile))
	}
	return opts, nil
}
