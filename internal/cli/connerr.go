package cli

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"

	"github.com/nats-io/nats.go"
)

// ConnErrClass is what a failed NATS connection attempt means: wait for
// the broker, or a fatal rejection whose cause is in the configuration.
type ConnErrClass int

const (
	ConnUnreachable ConnErrClass = iota // refused, no route, DNS, timeout: wait for the broker
	ConnAuth                            // the server rejected the credentials: fatal
	ConnTLS                             // the TLS handshake failed: fatal
	ConnCreds                           // the credentials could not be used: fatal
)

func (c ConnErrClass) String() string {
	switch c {
	case ConnAuth:
		return "NATS rejected the credentials"
	case ConnTLS:
		return "TLS with NATS failed"
	case ConnCreds:
		return "NATS credentials unusable"
	}
	return "cannot reach NATS"
}

// ClassifyConnErr sorts an error of nats.Connect (made without
// RetryOnFailedConnect, so that it is the real cause).
func ClassifyConnErr(err error) ConnErrClass {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		alert   tls.AlertError
		recErr  tls.RecordHeaderError
	)
	msg := strings.ToLower(err.Error())
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired),
		errors.Is(err, nats.ErrAuthRevoked), errors.Is(err, nats.ErrAccountAuthExpired),
		strings.Contains(msg, "authorization violation"), strings.Contains(msg, "authentication expired"),
		strings.Contains(msg, "authentication revoked"):
		return ConnAuth
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid),
		errors.As(err, &alert), errors.As(err, &recErr),
		errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted),
		strings.Contains(msg, "tls:"), strings.Contains(msg, "x509:"), strings.Contains(msg, "tls error"):
		return ConnTLS
	case errors.Is(err, nats.ErrNkeysNotSupported), errors.Is(err, nats.ErrNkeyButNoSigCB),
		strings.Contains(msg, "nkeys:"), strings.Contains(msg, "signing nonce"),
		strings.Contains(msg, "user credentials"), strings.Contains(msg, "key pair"):
		return ConnCreds
	}
	return ConnUnreachable
}
