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

// blockRef is a block record as read: its key and revision.
type blockRef struct {
	key string
	rev uint64
}

// blockIndex finds the block records of a command's ordered routes by the
// dead letter that blocks each key (docs/delivery.md#ordered-delivery):
// each route's records are read once per command, not once per dead
// letter purged. Records are untrusted: one too large, not JSON or not of
// the route's prefix is left alone.
type blockIndex struct {
	s      *dlqSession
	kv     jetstream.KeyValue
	opened bool                           // kv looked up (nil: no bucket)
	routes map[string]map[uint64]blockRef // route -> dead letter -> record
}

func newBlockIndex(s *dlqSession) *blockIndex {
	return &blockIndex{s: s, routes: map[string]map[uint64]blockRef{}}
}

// reopen deletes the block record of route's key that dead letter seq
// blocks, when route is ordered with on_dead_letter: block: the replicas
// watch the records, and the key goes on with its next message. It
// returns the record's id, or "" when no record names seq (another
// route, or the key re-opened already).
func (x *blockIndex) reopen(ctx context.Context, route string, seq uint64) (string, error) {
	cfg := x.s.cfg
	i := slices.IndexFunc(cfg.Routes, func(rc *config.Route) bool { return rc.Name == route })
	if i < 0 || cfg.Routes[i].Ordering == nil || cfg.Routes[i].Ordering.OnDeadLetter != config.OnDeadLetterBlock {
		return "", nil
	}
	opCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dlqOpTimeout)
	defer cancel()
	if !x.opened {
		kv, err := x.s.js.KeyValue(opCtx, config.StateBucket(cfg.Stream.Name))
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return "", err
		}
		x.kv, x.opened = kv, true
	}
	if x.kv == nil {
		return "", nil
	}
	prefix := config.BlockRecordPrefix(route)
	recs, ok := x.routes[route]
	if !ok {
		var err error
		if recs, err = x.read(opCtx, prefix); err != nil {
			return "", err
		}
		x.routes[route] = recs
	}
	ref, ok := recs[seq]
	if !ok {
		return "", nil
	}
	delete(recs, seq)
	// Only if it is still the record read: a replay or another purge may
	// have changed it meanwhile; then it is read again.
	err := x.kv.Delete(opCtx, ref.key, jetstream.LastRevision(ref.rev))
	if isWrongRevision(err) {
		e, gerr := x.kv.Get(opCtx, ref.key)
		if gerr != nil || blockedBy(e) != seq {
			return "", nil
		}
		err = x.kv.Delete(opCtx, ref.key, jetstream.LastRevision(e.Revision()))
	}
	if err != nil {
		return "", err
	}
	return strings.TrimPrefix(ref.key, prefix), nil
}

// read is the records under prefix, by the dead letter each names.
func (x *blockIndex) read(ctx context.Context, prefix string) (map[uint64]blockRef, error) {
	keys, err := x.kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return nil, err
	}
	recs := map[uint64]blockRef{}
	n := 0
	for key := range keys.Keys() {
		if n++; n > maxBlockRecords {
			break
		}
		e, err := x.kv.Get(ctx, key)
		if err != nil {
			continue
		}
		if seq := blockedBy(e); seq != 0 {
			recs[seq] = blockRef{key: key, rev: e.Revision()}
		}
	}
	return recs, nil
}

// blockedBy is the dead letter a block record names (0: not a record).
func blockedBy(e jetstream.KeyValueEntry) uint64 {
	if len(e.Value()) > config.MaxBlockRecord {
		return 0
	}
	var rec struct {
		DLQ uint64 `json:"dlq_seq"`
	}
	if json.Unmarshal(e.Value(), &rec) != nil {
		return 0
	}
	return rec.DLQ
}

// isWrongRevision reports a delete refused because the key changed.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
