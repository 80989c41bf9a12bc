package bridge

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
)

// ErrNotRunning is returned by Reload before Run has started pulling and
// once it has begun to stop: there is nothing to apply a configuration to.
var ErrNotRunning = errors.New("bridge: not running")

// ErrNeedsRestart matches (errors.Is) every *NeedsRestartError.
var ErrNeedsRestart = errors.New("the change needs a restart")

// NeedsRestartError is Reload's refusal of a configuration that changes
// keys a running bridge cannot apply (docs/configuration.md#what-a-reload-applies).
// Nothing of that configuration was applied.
type NeedsRestartError struct {
	// Keys are the paths of the changed keys, such as "stream.max_age" or
	// "routes[2].idempotency"; never their values.
	Keys []string
}

func (e *NeedsRestartError) Error() string {
	return "bridge: the change needs a restart (nothing was applied): " + strings.Join(e.Keys, ", ")
}

// Is makes errors.Is(err, ErrNeedsRestart) hold.
func (e *NeedsRestartError) Is(target error) bool { return target == ErrNeedsRestart }

// ConfigStatus is what /status shows of the configuration file under
// "config": which file, its digest, when the configuration in force was
// loaded, and the last reload's outcome. The bridge does not read files;
// its caller (bridge run) sets it with SetConfigStatus.
type ConfigStatus struct {
	File string `json:"file,omitempty"`
	// Digest is "sha256:" and the hex SHA-256 of the file's bytes in force.
	Digest     string        `json:"digest"`
	LoadedAt   time.Time     `json:"loaded_at"`
	LastReload *ReloadStatus `json:"last_reload,omitempty"`
}

// ReloadStatus is one reload's outcome: Result is applied, invalid or
// needs_restart (as bridge_config_reloads_total's result label); Error
// names keys, lines and files, never a value.
type ReloadStatus struct {
	Time   time.Time `json:"time"`
	Result string    `json:"result"`
	Error  string    `json:"error,omitempty"`
}

// SetConfigStatus sets what /status shows under "config".
func (b *Bridge) SetConfigStatus(s ConfigStatus) { b.confStatus.Store(&s) }

// Reload applies cfg, a validated configuration (config.Load validates),
// to the running bridge, whole or not at all:
//
//   - a change to a key that needs a restart (nats, stream, dead_letter,
//     idempotency, admin, log, tracing, or a route turning idempotency on
//     when the bridge runs without the idempotency bucket) is refused with
//     a *NeedsRestartError naming the keys, and nothing is applied;
//   - a destination whose configuration changed is built anew (its
//     breaker, flow control and connections start afresh), and every route
//     delivering to it is replaced;
//   - a route that is new, or whose configuration or destination changed,
//     is built anew: its durable consumer is created or updated (subjects,
//     ack_wait, max_deliver), then it starts pulling, while the route it
//     replaces stops pulling and finishes what it holds on the
//     configuration it started with (each attempt ends on the route and
//     destination values it started on);
//   - a route that is gone, or now paused, stops pulling and finishes what
//     it holds; a message not yet started, or held by an open breaker, is
//     handed back to JetStream. Its durable consumer is kept;
//   - anything unchanged keeps running untouched.
//
// A renamed route is one removed and one added. If creating or updating a
// consumer fails, the consumers already updated are put back and nothing
// is applied. Reload returns once the new configuration is in force and
// the routes it retired have finished, or when ctx ends first (the
// configuration is in force then too, and Run waits for the retired
// routes before it returns). Reloads are serialised. Before Run pulls, and
// once it stops, Reload returns ErrNotRunning.
func (b *Bridge) Reload(ctx context.Context, cfg *config.Config) error {
	finished, err := b.Apply(ctx, cfg)
	if err != nil {
		return err
	}
	select {
	case <-finished:
	case <-ctx.Done():
	}
	return nil
}

// Apply is Reload without the wait for the retired routes: it returns as
// soon as cfg is in force (or refused, with Reload's errors), and finished
// is closed once the routes it retired have finished what they held. A
// caller that reports the reload (bridge run's SIGHUP and --watch) uses it,
// so that a retired route still retrying against a failing destination
// does not hold the report, or the next reload, back; Run waits for the
// retired routes before it returns either way.
func (b *Bridge) Apply(ctx context.Context, cfg *config.Config) (finished <-chan struct{}, err error) {
	b.reloadMu.Lock()
	defer b.reloadMu.Unlock()
	return b.reload(ctx, cfg)
}

// reloadPlan is what a reload changes, computed before anything is.
type reloadPlan struct {
	dests    map[string]*destination // the destinations of the new configuration
	newDests []*destination          // built for it (closed if it is not applied)
	routes   []*route                // the routes of the new configuration
	fresh    []*route                // built for it: their consumers are bound before it applies
	retired  []*route                // of the running configuration, not kept
	goneDest []*destination          // of the running configuration, not kept
}

// reload applies cfg with reloadMu held; finished is closed once the
// routes it retired have finished.
func (b *Bridge) reload(ctx context.Context, cfg *config.Config) (finished <-chan struct{}, err error) {
	rs := b.running
	if rs == nil || rs.ctx.Err() != nil {
		return nil, ErrNotRunning
	}
	b.mu.RLock()
	cur, curRoutes, curDests := b.applied, b.routes, b.dests
	b.mu.RUnlock()
	if keys := b.reloader.restartKeys(b, cur, cfg); len(keys) > 0 {
		return nil, &NeedsRestartError{Keys: keys}
	}
	plan, err := b.plan(cfg, curRoutes, curDests)
	if err != nil {
		return nil, err
	}
	if err := b.bindAll(ctx, plan.fresh, curRoutes); err != nil {
		for _, d := range plan.newDests {
			d.close()
		}
		return nil, err
	}

	// Commit: from here on nothing fails.
	names := make([]string, 0, len(cfg.Routes))
	for _, rc := range cfg.Routes {
		names = append(names, rc.Name)
	}
	b.m.addNames(names, cfg.DestinationNames())
	b.mu.Lock()
	b.applied, b.routes, b.dests = cfg, plan.routes, plan.dests
	b.mu.Unlock()
	b.health.track(plan.fresh, plan.retired)
	for _, d := range plan.newDests {
		b.m.circuit.WithLabelValues(d.name).Set(float64(d.state()))
	}
	started, paused := 0, 0
	for _, r := range plan.fresh {
		if r.cfg.Paused {
			paused++
			continue
		}
		rs.runs[r] = b.startRoute(rs, r)
		started++
	}
	var stopping []*route
	for _, r := range plan.retired {
		if run := rs.runs[r]; run != nil {
			run.stopPulling(r)
			stopping = append(stopping, r)
		}
	}
	done := make(chan struct{})
	runs := make([]*routeRun, len(stopping))
	for i, r := range stopping {
		runs[i] = rs.runs[r]
		delete(rs.runs, r)
	}
	b.retiring.Add(1)
	go func() {
		defer b.retiring.Done()
		defer close(done)
		for i, r := range stopping {
			b.reloader.retire(runs[i], r)
		}
		for _, d := range plan.goneDest {
			d.close()
			b.mu.RLock()
			_, kept := b.dests[d.name]
			b.mu.RUnlock()
			if !kept { // removed, not replaced: its state gauge goes too
				b.m.circuit.DeleteLabelValues(d.name)
			}
		}
	}()
	b.log.Info().Int("routes", len(plan.routes)).Int("started", started).Int("paused", paused).Int("retired", len(plan.retired)).
		Int("destinations_built", len(plan.newDests)).Msg("configuration reloaded")
	return done, nil
}

// reloader is what a reload decides by rules: which changed keys need a
// restart, and how a retired route ends. The bridge's is liveReload;
// negative controls replace it with a broken one (reload_faults_test.go).
type reloader interface {
	// restartKeys are the keys of next that cannot be applied to the
	// running bridge b (see Reload).
	restartKeys(b *Bridge, running, next *config.Config) []string
	// retire ends route r, which has stopped pulling: it returns once r
	// settled everything it held.
	retire(run *routeRun, r *route)
}

// liveReload is the bridge's reloader: a retired route finishes its
// attempts on the configuration they started with.
type liveReload struct{}

func (liveReload) retire(run *routeRun, r *route) { run.finish(r) }

func (liveReload) restartKeys(b *Bridge, running, next *config.Config) []string {
	keys := config.RestartKeys(running, next)
	keys = append(keys, orderedRestartKeys(running, next)...)
	if b.idem == nil {
		for i, rc := range next.Routes {
			if rc.Idempotency {
				keys = append(keys, fmt.Sprintf("routes[%d].idempotency (the idempotency bucket is opened at start)", i))
			}
		}
	}
	return keys
}

// plan builds the destinations and routes of cfg that differ from the
// running ones (cur, dests), and lists what they replace. It does no I/O.
func (b *Bridge) plan(cfg *config.Config, cur []*route, dests map[string]*destination) (*reloadPlan, error) {
	p := &reloadPlan{dests: make(map[string]*destination, len(cfg.Destinations))}
	sizes := poolSizes(cfg)
	for name, dc := range cfg.Destinations {
		if old := dests[name]; old != nil && reflect.DeepEqual(old.cfg, dc) && old.poolSize == sizes[name] {
			p.dests[name] = old
			continue
		}
		d, err := b.newDestination(dc)
		if err != nil {
			for _, d := range p.newDests {
				d.close()
			}
			return nil, err
		}
		d.poolSize = sizes[name]
		d.sizePool()
		p.dests[name] = d
		p.newDests = append(p.newDests, d)
	}
	for name, d := range dests {
		if p.dests[name] != d {
			p.goneDest = append(p.goneDest, d)
		}
	}
	byName := make(map[string]*route, len(cur))
	for _, r := range cur {
		byName[r.cfg.Name] = r
	}
	kept := make(map[*route]bool, len(cur))
	for _, rc := range cfg.Routes {
		d, ok := p.dests[rc.Destination]
		if !ok {
			for _, d := range p.newDests {
				d.close()
			}
			return nil, fmt.Errorf("bridge: route %s: unknown destination %q", rc.Name, rc.Destination)
		}
		if old := byName[rc.Name]; old != nil && old.dest == d && reflect.DeepEqual(old.cfg, rc) {
			p.routes = append(p.routes, old)
			kept[old] = true
			continue
		}
		r := newRoute(b, rc, d)
		p.routes = append(p.routes, r)
		p.fresh = append(p.fresh, r)
	}
	for _, r := range cur {
		if !kept[r] {
			p.retired = append(p.retired, r)
		}
	}
	return p, nil
}

// bindAll creates or updates the consumer of every route in fresh. On a
// failure it puts back what it changed: the consumers of running routes
// (cur) get their running configuration again, and a consumer that did
// not exist before is deleted.
func (b *Bridge) bindAll(ctx context.Context, fresh, cur []*route) error {
	running := make(map[string]*route, len(cur))
	for _, r := range cur {
		running[r.cfg.Name] = r
	}
	var undo []func(context.Context) error
	for _, r := range fresh {
		old := running[r.cfg.Name]
		existed := old != nil
		var err error
		if !existed {
			// Only "not found" means absent: a consumer whose lookup failed
			// otherwise (a timeout) may exist, and the undo must never
			// delete one it did not create.
			err = apiCall(ctx, func(ctx context.Context) error {
				_, err := b.js.Consumer(ctx, b.cfg.Stream.Name, r.cfg.Name)
				return err
			})
			existed = err == nil
			if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				err = fmt.Errorf("looking it up: %w", err)
			} else {
				err = apiCall(ctx, r.updateConsumer)
			}
		} else {
			err = apiCall(ctx, r.updateConsumer)
		}
		if err == nil {
			switch {
			case old != nil:
				undo = append(undo, old.updateConsumer)
			case !existed:
				name := r.cfg.Name
				undo = append(undo, func(ctx context.Context) error {
					return b.js.DeleteConsumer(ctx, b.cfg.Stream.Name, name)
				})
			}
			continue
		}
		for _, u := range undo {
			// context.WithoutCancel: the reload's ctx may be what ended.
			if uerr := apiCall(context.WithoutCancel(ctx), u); uerr != nil {
				b.log.Error().Str("error", uerr.Error()).Msg("reload refused, and putting a consumer back failed")
			}
		}
		return fmt.Errorf("bridge: route %s: consumer: %w (nothing was applied)", r.cfg.Name, err)
	}
	return nil
}

// updateConsumer creates or updates the route's durable consumer with its
// configuration, as a reload does: a difference from the stored one is
// the reload itself, not another replica's configuration (bindConsumer).
func (r *route) updateConsumer(ctx context.Context) error {
	if r.cfg.Ordering != nil {
		return r.bindOrdered(ctx)
	}
	c, err := r.b.js.CreateOrUpdateConsumer(ctx, r.b.cfg.Stream.Name, consumerConfig(r.cfg))
	if err != nil {
		return err
	}
	r.setConsumer(c)
	return nil
}
