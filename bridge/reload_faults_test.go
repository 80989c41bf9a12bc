package bridge

import (
	"errors"

	"github.com/sotercare/jetbridge/config"
)

// The broken reloads of the reload tests' negative controls, put in place
// of a built bridge's reloader (the seam reload.go decides through).

// brokenReload is a reloader with one deliberately broken rule.
type brokenReload struct {
	liveReload
	ignoreRestart bool // no key needs a restart: a stream change is "applied" with the rest
	cutInFlight   bool // a retired route's attempts are interrupted instead of finished
}

func (f brokenReload) restartKeys(b *Bridge, running, next *config.Config) []string {
	if f.ignoreRestart {
		return nil
	}
	return f.liveReload.restartKeys(b, running, next)
}

func (f brokenReload) retire(run *routeRun, r *route) {
	if f.cutInFlight {
		run.cancelWork(errors.New("negative control: retired route cut off"))
	}
	f.liveReload.retire(run, r)
}

// withReloader is a startHarness tweak that replaces the bridge's reloader.
func withReloader(rl reloader) func(*Bridge) {
	return func(b *Bridge) { b.reloader = rl }
}
