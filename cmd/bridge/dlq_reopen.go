package main

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
)

// maxBlockRecords bounds how many block records of one route are read.
const maxBlockRecords = 10000

// reopenBlocked deletes the block record of route's key that dead letter
// seq blocks, when route is ordered with on_dead_letter: block: the
// replicas watch the records, and the key goes on with its next message
// (docs/delivery.md#ordered-delivery). It returns the record's id, or ""
// when no record names seq (another route, or the key re-opened already).
// Records are untrusted: one too large, not JSON or not of the route's
// prefix is left alone.
func reopenBlocked(ctx context.Context, s *dlqSession, route string, seq uint64) (string, error) {
	i := slices.IndexFunc(s.cfg.Routes, func(rc *config.Route) bool { return rc.Name == route })
	if i < 0 || s.cfg.Routes[i].Ordering == nil || s.cfg.Routes[i].Ordering.OnDeadLetter != config.OnDeadLetterBlock {
		return "", nil
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlqOpTimeout)
	defer cancel()
	kv, err := s.js.KeyValue(opCtx, config.StateBucket(s.cfg.Stream.Name))
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	prefix := config.BlockRecordPrefix(route)
	keys, err := kv.ListKeysFiltered(opCtx, prefix+"*")
	if err != nil {
		return "", err
	}
	n := 0
	for key := range keys.Keys() {
		if n++; n > maxBlockRecords {
			break
		}
		e, err := kv.Get(opCtx, key)
		if err != nil || len(e.Value()) > config.MaxBlockRecord {
			continue
		}
		var rec struct {
			DLQ uint64 `json:"dlq_seq"`
		}
		if json.Unmarshal(e.Value(), &rec) != nil || rec.DLQ != seq {
			continue
		}
		// Only if it is still the record read: a replay or another
		// purge may have changed it meanwhile.
		if err := kv.Delete(opCtx, key, jetstream.LastRevision(e.Revision())); err != nil {
			return "", err
		}
		return strings.TrimPrefix(key, prefix), nil
	}
	return "", nil
}
