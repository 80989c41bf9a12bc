package sotercare

import (
	"net/http"
	"time"
)

// ServerLimits bound what one client can hold of the SoterCare HTTP
// server: time to send the request headers and the whole request, time
// to take the response, time an idle keep-alive connection stays open, and
// the size of the request headers. Request bodies are bounded separately
// (64 KiB). See docs/security.md.
type ServerLimits struct {
	ReadHeaderTimeout time.Duration // request line and headers
	ReadTimeout       time.Duration // the whole request, body included: cuts a slow body
	WriteTimeout      time.Duration // from the end of the request headers to the end of the response
	IdleTimeout       time.Duration // an idle keep-alive connection is closed after it
	MaxHeaderBytes    int           // request line and headers
}

// DefaultServerLimits are the limits of cmd/sotercare for a publish
// timeout: the write timeout leaves room for reading the body, waiting for
// JetStream and writing the answer.
func DefaultServerLimits(publishTimeout time.Duration) ServerLimits {
	const read = 10 * time.Second
	return ServerLimits{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       read,
		WriteTimeout:      read + publishTimeout + 5*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
}

// NewServer returns an HTTP server for h with the limits l.
func NewServer(h http.Handler, l ServerLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}
