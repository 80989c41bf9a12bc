package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// adminCert serves the admin server's certificate and follows its files:
// when cert_file or key_file changes (a renewal by cert-manager, a
// rotated Kubernetes Secret, which swaps a symlink), the next handshake
// loads the pair again. A pair that does not load is logged once and the
// previous one stays in use, so a renewal half written never stops the
// admin server.
type adminCert struct {
	files config.AdminTLS
	log   zerolog.Logger

	mu     sync.Mutex
	pair   *tls.Certificate
	stamp  string // the files' sizes and modification times when pair was loaded
	failed string // the stamp whose load failed (logged once)
}

func newAdminCert(files config.AdminTLS, log zerolog.Logger) (*adminCert, error) {
	c := &adminCert{files: files, log: log}
	stamp, err := c.fileStamp()
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("admin.tls.cert_file, admin.tls.key_file: %s, %s: %w", files.CertFile, files.KeyFile, err)
	}
	c.pair, c.stamp = &pair, stamp
	return c, nil
}

// fileStamp identifies the current content of both files.
func (c *adminCert) fileStamp() (string, error) {
	var stamp string
	for _, f := range []string{c.files.CertFile, c.files.KeyFile} {
		fi, err := os.Stat(f) // follows symlinks: a swapped link is a change
		if err != nil {
			return "", err
		}
		stamp += fmt.Sprintf("%d/%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

// getCertificate is tls.Config.GetCertificate.
func (c *adminCert) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stamp, err := c.fileStamp()
	if err != nil || stamp == c.stamp || stamp == c.failed {
		return c.pair, nil
	}
	pair, err := tls.LoadX509KeyPair(c.files.CertFile, c.files.KeyFile)
	if err != nil {
		c.failed = stamp
		c.log.Warn().Str("cert_file", c.files.CertFile).Str("key_file", c.files.KeyFile).Str("error", err.Error()).
			Msg("admin certificate changed but does not load; still serving the previous one")
		return c.pair, nil
	}
	c.pair, c.stamp, c.failed = &pair, stamp, ""
	ev := c.log.Info().Str("cert_file", c.files.CertFile)
	if pair.Leaf != nil {
		ev = ev.Str("not_after", pair.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	ev.Msg("admin certificate reloaded")
	return c.pair, nil
}
