package main

import (
	"context"
	"errors"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/config"
)

// Results of bridge_config_reloads_total (docs/deploy.md#signals).
const (
	reloadApplied      = "applied"
	reloadInvalid      = "invalid"
	reloadNeedsRestart = "needs_restart"
)

// reloadSource is where SIGHUP comes from and which file it re-reads; a
// nil signals channel means no reloads (tests of the daemon).
type reloadSource struct {
	path    string
	signals <-chan os.Signal
}

// watchReloads handles SIGHUP until ctx ends. The configuration cannot be
// applied live yet, so a SIGHUP validates the file whole, logs whether it
// is valid and that it takes effect at the next start, counts the outcome
// (needs_restart when valid, invalid when not) and changes nothing: the
// process never stops on it. The returned func waits for the goroutine.
func watchReloads(ctx context.Context, src reloadSource, log zerolog.Logger, reg prometheus.Registerer) (wait func()) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bridge_config_reloads_total",
		Help: "SIGHUPs handled, by result: applied (never yet: changes take effect at the next start), invalid (the file was refused), needs_restart (the file is valid; it takes effect at the next start).",
	}, []string{"result"})
	for _, r := range []string{reloadApplied, reloadInvalid, reloadNeedsRestart} {
		reloads.WithLabelValues(r)
	}
	reg.MustRegister(reloads)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-src.signals:
				result := validateReload(src.path, log)
				reloads.WithLabelValues(result).Inc()
			}
		}
	}()
	return func() { <-done }
}

// validateReload loads path as `bridge check` does and logs the outcome;
// errors name the key and line, never a value (package config).
func validateReload(path string, log zerolog.Logger) string {
	cfg, err := config.LoadFile(path)
	if err == nil {
		err = checkNATSFiles(cfg.NATS)
	}
	if err != nil {
		var msgs []string
		var ve *config.ValidationError
		if errors.As(err, &ve) {
			for _, e := range ve.Unwrap() {
				msgs = append(msgs, e.Error())
			}
		} else {
			msgs = append(msgs, errText(err))
		}
		log.Error().Str("signal", "SIGHUP").Str("file", path).Strs("errors", msgs).
			Msg("SIGHUP: the configuration file is invalid; the running configuration is unchanged")
		return reloadInvalid
	}
	log.Info().Str("signal", "SIGHUP").Str("file", path).
		Msg("SIGHUP: the configuration file is valid; it takes effect at the next start (live reload is not supported yet), the running configuration is unchanged")
	return reloadNeedsRestart
}
