package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
)

// Results of bridge_config_reloads_total (docs/deploy.md#signals).
const (
	reloadApplied      = "applied"
	reloadInvalid      = "invalid"
	reloadNeedsRestart = "needs_restart"
)

// watchDebounce is how long the configuration file must be left alone
// after a change before `bridge run --watch` reads it: an editor's or a
// ConfigMap's several writes and renames are one reload.
const watchDebounce = 500 * time.Millisecond

// reloadSource is where reloads come from and which file they read: a
// SIGHUP (signals; nil: none, as in tests of the daemon), and with watch a
// change of the file. server is --server, which overrides nats.url of
// every file read, as it did at start.
type reloadSource struct {
	path string
	// data are the bytes of the file in force, as read once at start (the
	// configuration was parsed from them): /status's digest.
	data    []byte
	server  string
	signals <-chan os.Signal
	watch   bool
}

// reloader applies the configuration file to the running bridge on a
// SIGHUP or (with --watch) a change of the file: the file is read and
// validated whole, then handed to bridge.Reload, which applies it whole
// or refuses it whole. Every outcome is logged, counted in
// bridge_config_reloads_total and shown in /status (bridge.ConfigStatus);
// the running configuration stays unless the outcome is applied.
type reloader struct {
	src     reloadSource
	log     zerolog.Logger
	reloads *prometheus.CounterVec
	bridge  atomic.Pointer[bridge.Bridge] // nil until the bridge is built

	mu     sync.Mutex // one reload at a time; guards status and tried
	status bridge.ConfigStatus
	tried  string // digest of the last file the watch tried, so that an unchanged file is not tried again
}

// newReloader registers bridge_config_reloads_total on reg. data is the
// file as read at start, for /status's digest.
func newReloader(src reloadSource, log zerolog.Logger, reg prometheus.Registerer) *reloader {
	r := &reloader{src: src, log: log}
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "bridge_config_reloads_total",
		Help: "Configuration reloads (SIGHUP, or a change of the file with --watch), by result: applied, invalid (the file was refused: it does not load or validate, or applying it failed), needs_restart (the file changes a key that only a restart applies; nothing was applied).",
	}, []string{"result"})
	for _, res := range []string{reloadApplied, reloadInvalid, reloadNeedsRestart} {
		r.reloads.WithLabelValues(res)
	}
	reg.MustRegister(r.reloads)
	r.status = bridge.ConfigStatus{File: src.path, Digest: digestOf(src.data), LoadedAt: time.Now().UTC()}
	return r
}

// setBridge makes b the bridge reloads apply to, and shows the
// configuration's status in its /status.
func (r *reloader) setBridge(b *bridge.Bridge) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bridge.Store(b)
	b.SetConfigStatus(r.status)
}

// digestOf is /status's digest of a configuration file's bytes.
func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// run handles reloads until ctx ends. With --watch it watches the file's
// directory (and, for a symbolic link, its target's): a write, a rename
// over the file, or a Kubernetes ConfigMap's swap of its ..data link all
// show there. The returned wait waits for the goroutine; err is a watch
// that cannot be set up.
func (r *reloader) run(ctx context.Context) (wait func(), err error) {
	if r.src.watch && notRegular(r.src.path) {
		return nil, fmt.Errorf("--watch: %s is not a regular file (a pipe is read once, at start)", r.src.path)
	}
	var w *fsnotify.Watcher
	if r.src.watch {
		if w, err = r.newWatcher(); err != nil {
			return nil, err
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var events <-chan fsnotify.Event
		var errs <-chan error
		if w != nil {
			defer w.Close()
			events, errs = w.Events, w.Errors
		}
		settle := time.NewTimer(watchDebounce)
		settle.Stop()
		defer settle.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.src.signals:
				r.reload(ctx, "SIGHUP")
			case _, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				settle.Reset(watchDebounce)
			case err, ok := <-errs:
				if !ok {
					errs = nil
					continue
				}
				r.log.Warn().Str("file", r.src.path).Str("error", err.Error()).Msg("watching the configuration file")
			case <-settle.C:
				r.reload(ctx, "watch")
			}
		}
	}()
	return func() { <-done }, nil
}

// newWatcher watches the directories a change of the file shows in.
func (r *reloader) newWatcher() (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("--watch: %w", err)
	}
	dirs := []string{filepath.Dir(r.src.path)}
	if target, err := filepath.EvalSymlinks(r.src.path); err == nil && filepath.Dir(target) != dirs[0] {
		dirs = append(dirs, filepath.Dir(target))
	}
	for _, dir := range dirs {
		if err := w.Add(dir); err != nil {
			w.Close()
			return nil, fmt.Errorf("--watch: cannot watch %s: %w", dir, err)
		}
	}
	r.log.Info().Str("file", r.src.path).Strs("directories", dirs).Str("debounce", watchDebounce.String()).
		Msg("watching the configuration file: a change is applied once the file has been left alone for the debounce")
	return w, nil
}

// reload reads, validates and applies the file once; by is "SIGHUP" or
// "watch". The watch skips a file whose bytes are in force already or
// were tried last.
func (r *reloader) reload(ctx context.Context, by string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if notRegular(r.src.path) {
		// A pipe (bash's <(...), /dev/stdin) was read at start; opening
		// it again would wait for a writer, and its bytes are gone.
		r.log.Error().Str("trigger", by).Str("file", r.src.path).
			Msg("reload: the configuration was not read from a regular file; only a restart reads it again")
		r.outcome(reloadNeedsRestart, "the configuration was not read from a regular file: only a restart reads it again")
		return
	}
	data, err := config.ReadFile(r.src.path)
	digest := ""
	if err == nil {
		digest = digestOf(data)
		if by == "watch" && (digest == r.status.Digest || digest == r.tried) {
			return
		}
	}
	r.tried = digest
	cfg, msgs := r.load(data, err)
	if msgs != nil {
		r.log.Error().Str("trigger", by).Str("file", r.src.path).Strs("errors", msgs).
			Msg("reload: the configuration file is invalid; the running configuration is unchanged")
		r.outcome(reloadInvalid, strings.Join(msgs, "; "))
		return
	}
	b := r.bridge.Load()
	if b == nil {
		err = bridge.ErrNotRunning
	} else {
		// Apply: the outcome is reported as soon as the file is in force;
		// the routes it retired finish in the background (Run waits for
		// them).
		_, err = b.Apply(ctx, cfg)
	}
	var nr *bridge.NeedsRestartError
	switch {
	case err == nil:
		r.status.Digest, r.status.LoadedAt = digest, time.Now().UTC()
		r.log.Info().Str("trigger", by).Str("file", r.src.path).Str("digest", digest).Msg("reload: configuration applied")
		r.outcome(reloadApplied, "")
	case errors.As(err, &nr):
		r.log.Error().Str("trigger", by).Str("file", r.src.path).Strs("keys", nr.Keys).
			Msg("reload: the file changes keys that need a restart; nothing was applied, the running configuration is unchanged")
		r.outcome(reloadNeedsRestart, "needs a restart: "+strings.Join(nr.Keys, ", "))
	case errors.Is(err, bridge.ErrNotRunning):
		r.log.Error().Str("trigger", by).Str("file", r.src.path).
			Msg("reload: the bridge is not delivering yet (or is stopping); the file takes effect at the next start")
		r.outcome(reloadNeedsRestart, "the bridge is not delivering yet; the file takes effect at the next start")
	default:
		r.log.Error().Str("trigger", by).Str("file", r.src.path).Str("error", errText(err)).
			Msg("reload: applying the configuration failed; nothing was applied, the running configuration is unchanged")
		r.outcome(reloadInvalid, errText(err))
	}
}

// load parses and validates data as `bridge check` does, with --server
// applied as at start; msgs are its errors (key and line, never a value),
// nil when it is valid. readErr is the error reading the file.
func (r *reloader) load(data []byte, readErr error) (*config.Config, []string) {
	if readErr != nil {
		return nil, []string{readErr.Error()}
	}
	cfg, err := config.Load(data, r.src.path)
	if err == nil {
		err = checkNATSFiles(cfg.NATS)
	}
	if err == nil {
		_, err = applyServer(cfg, r.src.server)
	}
	if err == nil {
		return cfg, nil
	}
	var msgs []string
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			msgs = append(msgs, e.Error())
		}
	} else {
		msgs = append(msgs, errText(err))
	}
	return nil, msgs
}

// outcome counts a reload and shows it in /status.
func (r *reloader) outcome(result, msg string) {
	r.reloads.WithLabelValues(result).Inc()
	r.status.LastReload = &bridge.ReloadStatus{Time: time.Now().UTC(), Result: result, Error: msg}
	if b := r.bridge.Load(); b != nil {
		b.SetConfigStatus(r.status)
	}
}

// notRegular reports whether path exists and is not a regular file (after
// symbolic links): a reload reads only a regular file again. A file that
// is gone is read, and refused, as such.
func notRegular(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.Mode().IsRegular()
}
