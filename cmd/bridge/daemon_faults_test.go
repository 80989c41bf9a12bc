package main

import (
	"net/http"

	"github.com/nats-io/nats.go"
)

// A daemonBreak breaks a built daemon before it runs, for a negative
// control: it replaces or wraps a value the daemon runs with (its NATS
// client options, the handler its admin server serves).
type daemonBreak func(*daemon)

// withOption appends o to the daemon's NATS client options: it applies
// last, so it may replace any option the daemon sets.
func withOption(o nats.Option) daemonBreak {
	return func(d *daemon) { d.conn.opts = append(d.conn.opts, o) }
}

// abortOnAuthError is nats.go's default: the 2nd identical authentication
// error in a row closes the connection for good.
var abortOnAuthError nats.Option = func(o *nats.Options) error { o.IgnoreAuthErrorAbort = false; return nil }

// closedUnnoticed lets nats.go close the connection for good on a repeated
// authentication error, and nothing hears of it.
var closedUnnoticed nats.Option = func(o *nats.Options) error {
	o.IgnoreAuthErrorAbort, o.ClosedCB = false, nil
	return nil
}

// healthzAlwaysOK answers /healthz 200 whatever the daemon's state.
func healthzAlwaysOK(d *daemon) {
	h := d.adminHandler
	d.adminHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusOK)
			return
		}
		h.ServeHTTP(w, r)
	})
}
