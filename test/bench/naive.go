package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// confirmTimeout bounds the confirmed ack (DoubleAck) of -confirm.
const confirmTimeout = 5 * time.Second

// The idempotency bucket of -kv, configured as the bridge provisions it
// with the config defaults (docs/delivery.md#exactly-one-delivery-per-event-id):
// the default bucket name and TTL, one value per key, file storage, the
// stream's replicas. kvRoute is the route name of the bridge's benchmark
// config, the first part of each key; kvTimeout bounds each KV write as
// the bridge bounds its reservation steps.
const (
	kvBucket  = "EVENTS_DELIVERED"
	kvTTL     = 24 * time.Hour
	kvRoute   = "bench0"
	kvTimeout = 5 * time.Second
)

// runNaive is the "_naive" role: the reference bridge the issue compares
// jetbridge with, what one writes in an afternoon. A durable consumer read
// with Consume, K goroutines, each POSTing the raw body and acking on 2xx,
// naking (immediate redelivery) otherwise. No envelope, no breaker, no
// retries, no metrics, no dead letters. It prints "ready" once consuming.
//
// Two flags turn it into a floor reference: each adds exactly one piece of
// work the bridge's contract requires and nothing else, written as lean as
// it can be, so that the "floor" scenario measures what that work alone
// costs a minimal bridge:
//
//   - -envelope sends the body of docs/delivery.md#the-request (format envelope),
//     byte for byte what the bridge sends: the payload checked with
//     json.Valid, then the envelope appended into a buffer each goroutine
//     reuses, with the request headers the bridge must send (Content-Type
//     application/json, X-Event-Id, X-Event-Type, X-Event-Severity,
//     X-Delivery-Attempt, Idempotency-Key). A payload that is not JSON is
//     terminated (the bridge dead-letters it; the benchmark publishes none).
//   - -confirm settles with a confirmed ack (DoubleAck, a request-reply to
//     the server, bounded by confirmTimeout) instead of a plain Ack; with
//     -async the confirmation is collected on one subscription and the
//     goroutine does not wait for it (asyncack.go), as the bridge does.
//   - -kv adds the two KV writes of the bridge's idempotency
//     (docs/delivery.md#exactly-one-delivery-per-event-id) to each message, on a bucket
//     configured like the bridge's: an atomic kv.Create of the
//     reservation ("inflight STREAM SEQ DELIVERED" under
//     ROUTE.b.BASE64URL(id)) before the POST, a kv.Update to "done …" at
//     the created revision after a 2xx and before the ack; after a
//     non-2xx the reservation is deleted (the release) and the message
//     naked. A message whose key exists is acked unsent when the key says
//     done (delivered, the ack was lost), else naked. None of the
//     bridge's takeover, refresh or long-id hashing: this is a floor.
func runNaive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("_naive", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL")
	dest := fs.String("url", "", "destination URL")
	k := fs.Int("k", 64, "concurrent requests")
	stream := fs.String("stream", "EVENTS", "stream")
	envelope := fs.Bool("envelope", false, "send the bridge's JSON envelope instead of the raw body")
	confirm := fs.Bool("confirm", false, "confirmed ack (DoubleAck) instead of a plain Ack")
	async := fs.Bool("async", false, "with -confirm: the ack's confirmation collected on one subscription, the goroutine not waiting for it (asyncack.go)")
	withKV := fs.Bool("kv", false, "reserve each event id in an idempotency bucket like the bridge's (kv.Create before the POST, kv.Update after a 2xx)")
	durable := fs.String("durable", "naive", "durable consumer name (two naive bridges measured at once use two)")
	fat := fs.Bool("fat", false, "refuse to run unless this binary was built with -tags fatfloor (it links the bridge's third-party dependencies)")
	metricsAddr := fs.String("metrics", "", "serve the Go runtime's allocation counters on http://ADDR/metrics (allocs.go)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *k < 1 {
		return fmt.Errorf("_naive: -k must be at least 1")
	}
	if *fat && !linkedFat {
		return fmt.Errorf("_naive: -fat: this binary was not built with -tags fatfloor")
	}
	if *metricsAddr != "" {
		if err := serveAllocMetrics(ctx, *metricsAddr); err != nil {
			return err
		}
	}
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, *stream, jetstream.ConsumerConfig{
		Durable:   *durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   30 * time.Second,
	})
	if err != nil {
		return err
	}
	var kv jetstream.KeyValue
	if *withKV {
		if kv, err = createBucket(ctx, js, *stream); err != nil {
			return err
		}
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{MaxIdleConns: *k, MaxIdleConnsPerHost: *k, IdleConnTimeout: time.Minute},
	}
	var acker *asyncAcker
	if *confirm && *async {
		if acker, err = newAsyncAcker(ctx, nc, *k); err != nil {
			return err
		}
	}
	ack := func(i int, m jetstream.Msg) {
		if !*confirm {
			_ = m.Ack()
			return
		}
		if acker != nil {
			acker.ack(ctx, i, m)
			return
		}
		actx, cancel := context.WithTimeout(ctx, confirmTimeout)
		_ = m.DoubleAck(actx)
		cancel()
	}

	msgs := make(chan jetstream.Msg)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for i := range *k {
		wg.Go(func() {
			var buf []byte // -envelope: this goroutine's body, reused
			var fh floorHeaders
			var hdr *floorHeaders // nil: Content-Type only
			for {
				select {
				case m := <-msgs:
					body := m.Data()
					var md *jetstream.MsgMetadata
					if *envelope || kv != nil {
						var err error
						if md, err = m.Metadata(); err != nil {
							_ = m.Term()
							continue
						}
					}
					if *envelope {
						if !json.Valid(body) {
							_ = m.Term()
							continue
						}
						buf = appendFloorEnvelope(buf[:0], m, md, &fh)
						body = buf
						hdr = &fh
					}
					if kv == nil {
						if post(ctx, client, *dest, body, hdr) {
							ack(i, m)
						} else {
							_ = m.Nak()
						}
						continue
					}
					id := fh.id
					if !*envelope {
						id = eventID(m, md)
					}
					key := reservationKey(id)
					rev, err := kvDo(ctx, func(ctx context.Context) (uint64, error) {
						return kv.Create(ctx, key, holderValue("inflight", md))
					})
					if err != nil {
						if errors.Is(err, jetstream.ErrKeyExists) && reservedDone(ctx, kv, key) {
							ack(i, m) // delivered before, its ack lost
						} else {
							_ = m.Nak()
						}
						continue
					}
					if !post(ctx, client, *dest, body, hdr) {
						_, _ = kvDo(ctx, func(ctx context.Context) (uint64, error) {
							return 0, kv.Delete(ctx, key, jetstream.LastRevision(rev))
						})
						_ = m.Nak()
						continue
					}
					// Not recorded as done: acked all the same, as the
					// bridge does (a redelivery would be sent again).
					_, _ = kvDo(ctx, func(ctx context.Context) (uint64, error) {
						return kv.Update(ctx, key, holderValue("done", md), rev)
					})
					ack(i, m)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	fmt.Println("ready")
	<-ctx.Done()
	cc.Stop()
	wg.Wait()
	return nil
}

// post sends body and reports whether the destination answered 2xx. The
// caller may reuse body once post returns: a *bytes.Reader body is written
// whole, and the sink reads it all before it answers. A bridge facing any
// destination cannot assume the latter, which is why the bridge allocates
// each body (its payload type in bridge/request.go): the floor is a little
// cheaper there than the bridge can be.
func post(ctx context.Context, c *http.Client, url string, body []byte, fh *floorHeaders) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	if fh != nil {
		req.Header.Set("X-Event-Id", fh.id)
		req.Header.Set("X-Event-Type", fh.typ)
		req.Header.Set("X-Event-Severity", fh.sev)
		req.Header.Set("X-Delivery-Attempt", fh.delivered)
		req.Header.Set("Idempotency-Key", fh.id)
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}

// floorHeaders are the request headers docs/delivery.md#the-request requires
// besides Content-Type, sent by the floor with its envelope.
type floorHeaders struct{ id, typ, sev, delivered string }

// appendFloorEnvelope appends the envelope of m, whose metadata is md
// (docs/delivery.md#the-request):
//
//	{"id":…,"eventType":…,"severity":…,"subject":…,"metadata":{…},"payload":…,"publishedAt":…}
//
// with the same fields, order and escaping as the bridge: id from Event-Id,
// else Nats-Msg-Id, else STREAM:SEQ; type and severity from the subject
// unless Event-Type / a valid Event-Severity say otherwise; metadata from
// the Event-Meta-* headers, keys sorted; the payload, already validated,
// copied as is; publishedAt the stream's timestamp in UTC.
func appendFloorEnvelope(b []byte, m jetstream.Msg, md *jetstream.MsgMetadata, fh *floorHeaders) []byte {
	h := m.Headers()
	id := eventID(m, md)
	typ, sev := subjects.Describe(m.Subject())
	if v := h.Get(producer.HeaderEventType); v != "" {
		typ = v
	}
	if v := h.Get(producer.HeaderEventSeverity); v != "" {
		if s, err := subjects.ParseSeverity(v); err == nil {
			sev = s
		}
	}
	fh.id, fh.typ, fh.sev, fh.delivered = id, typ, string(sev), strconv.FormatUint(md.NumDelivered, 10)
	b = append(b, `{"id":`...)
	b = appendString(b, id)
	b = append(b, `,"eventType":`...)
	b = appendString(b, typ)
	b = append(b, `,"severity":`...)
	b = appendString(b, string(sev))
	b = append(b, `,"subject":`...)
	b = appendString(b, m.Subject())
	b = append(b, `,"metadata":{`...)
	var keys []string
	for k, vs := range h {
		if key, ok := strings.CutPrefix(k, producer.HeaderMetaPrefix); ok && key != "" && len(vs) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, strings.TrimPrefix(k, producer.HeaderMetaPrefix))
		b = append(b, ':')
		b = appendString(b, h[k][0])
	}
	b = append(b, `},"payload":`...)
	b = append(b, m.Data()...)
	b = append(b, `,"publishedAt":"`...)
	b = md.Timestamp.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, `"}`...)
}

// eventID is the event id of m as the bridge reads it
// (docs/delivery.md#the-request): Event-Id, else Nats-Msg-Id, else STREAM:SEQ.
func eventID(m jetstream.Msg, md *jetstream.MsgMetadata) string {
	h := m.Headers()
	if id := h.Get(producer.HeaderEventID); id != "" {
		return id
	}
	if id := h.Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	return md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// createBucket creates (or finds) the idempotency bucket of -kv, with the
// replicas of stream.
func createBucket(ctx context.Context, js jetstream.JetStream, stream string) (jetstream.KeyValue, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("_naive -kv: stream %s: %w", stream, err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      kvBucket,
		Description: "jetbridge delivered event ids",
		TTL:         kvTTL,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    s.CachedInfo().Config.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("_naive -kv: bucket %s: %w", kvBucket, err)
	}
	return kv, nil
}

// kvDo runs one KV call bounded by kvTimeout.
func kvDo(ctx context.Context, f func(context.Context) (uint64, error)) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, kvTimeout)
	defer cancel()
	return f(ctx)
}

// reservedDone reports whether the reservation under key says delivered.
func reservedDone(ctx context.Context, kv jetstream.KeyValue, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, kvTimeout)
	defer cancel()
	e, err := kv.Get(ctx, key)
	return err == nil && bytes.HasPrefix(e.Value(), []byte("done "))
}

// reservationKey is the bridge's key of an event id on the benchmark's
// route: ROUTE.b.BASE64URL(id). The bridge hashes ids longer than 96
// bytes; the benchmark publishes none.
func reservationKey(id string) string {
	return kvRoute + ".b." + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// holderValue is the bridge's reservation value: "STATE STREAM SEQ DELIVERED".
func holderValue(state string, md *jetstream.MsgMetadata) []byte {
	b := make([]byte, 0, 64)
	b = append(b, state...)
	b = append(b, ' ')
	b = append(b, md.Stream...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, md.Sequence.Stream, 10)
	b = append(b, ' ')
	return strconv.AppendUint(b, md.NumDelivered, 10)
}

// appendString appends s as a JSON string escaped as encoding/json escapes
// it: copied as is when it needs no escaping (ids and subjects do not),
// else through json.Marshal.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
