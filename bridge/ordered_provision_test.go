package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/subjects"
)

// orderedFixture is an embedded server with the source stream EVENTS, and
// an ordered route r of 4 partitions keyed by the fourth token.
type orderedFixture struct {
	nc *nats.Conn
	js jetstream.JetStream
	sc config.Stream
	rc *config.Route
}

func newOrderedFixture(t *testing.T) *orderedFixture {
	t.Helper()
	srv := natstest.Start(t)
	nc, js := natstest.Connect(t, srv.URL())
	sc := config.Stream{Name: "EVENTS", Subjects: []string{"events.>"}, Create: true,
		DuplicateWindow: config.Duration(2 * time.Minute), MaxAge: config.Duration(time.Hour), Replicas: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ensureStream(ctx, js, sourceStreamConfig(sc), warnFails(t)); err != nil {
		t.Fatal(err)
	}
	rc := &config.Route{
		Name: "r", Subjects: []string{"events.*.care.>"}, AckWait: config.Duration(3 * time.Second), MaxInFlight: 4, MaxDeliver: 5,
		Ordering: &config.Ordering{Key: config.OrderingKey{Tokens: []int{4}}, Partitions: 4, OnDeadLetter: config.OnDeadLetterContinue},
	}
	return &orderedFixture{nc: nc, js: js, sc: sc, rc: rc}
}

func warnFails(t *testing.T) func(what, key, have, want string) {
	return func(what, key, have, want string) {
		t.Errorf("warning: %s %s: have %s, want %s", what, key, have, want)
	}
}

func (f *orderedFixture) provision(t *testing.T) (*orderedCopy, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return provisionOrdered(ctx, f.js, f.sc, f.rc, warnFails(t))
}

// publish publishes one event per subject, with an Event-Type header and
// a Nats-Msg-Id, and returns each subject's stream sequence.
func (f *orderedFixture) publish(t *testing.T, subs []string) map[string]uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seqs := map[string]uint64{}
	for i, s := range subs {
		m := nats.NewMsg(s)
		m.Header.Set("Event-Type", "t")
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("id-%d-%s", i, s))
		ack, err := f.js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		seqs[s] = ack.Sequence
	}
	return seqs
}

// drain fetches every partition until want messages came, with the
// priority group, acking each, and returns them by partition consumer.
func drain(t *testing.T, oc *orderedCopy, want int) map[int][]jetstream.Msg {
	t.Helper()
	got := map[int][]jetstream.Msg{}
	n := 0
	natstest.Eventually(t, 15*time.Second, func() error {
		for p, c := range oc.parts {
			batch, err := c.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond), jetstream.FetchPriorityGroup(orderingGroup))
			if err != nil {
				return err
			}
			for m := range batch.Messages() {
				got[p] = append(got[p], m)
				n++
				if err := m.Ack(); err != nil {
					return err
				}
			}
		}
		if n < want {
			return fmt.Errorf("%d of %d messages", n, want)
		}
		return nil
	})
	if n != want {
		t.Fatalf("%d messages, want %d", n, want)
	}
	return got
}

// The copy receives every message of the route, and only those, each on
// the consumer of its key's partition (with a pin id), and each gives back
// the original stream, sequence, subject and headers; the source stream
// is unchanged. The control checks the same deliveries against the
// partitions of another key: they disagree, so the check can fail.
func TestOrderedCopyPartitionsEveryMessage(t *testing.T) {
	f := newOrderedFixture(t)
	oc, err := f.provision(t)
	if err != nil {
		t.Fatal(err)
	}
	if len(oc.parts) != 4 {
		t.Fatalf("%d partition consumers, want 4", len(oc.parts))
	}
	var subs []string
	for k := range 30 {
		subs = append(subs,
			fmt.Sprintf("events.critical.care.p%d.fall", k),
			fmt.Sprintf("events.info.care.p%d", k),
			fmt.Sprintf("events.warning.care.p%d.resolved.x", k),
			fmt.Sprintf("events.critical.other.p%d", k), // not the route's
		)
	}
	seqs := f.publish(t, subs)
	got := drain(t, oc, 90)

	whole, err := subjects.NewPartitioner(f.rc.Subjects, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen, mismatchControl := map[string]bool{}, 0
	for p, msgs := range got {
		for _, m := range msgs {
			if m.Headers().Get(headerPinID) == "" {
				t.Errorf("%s: no %s header", m.Subject(), headerPinID)
			}
			cm, err := newCopyMsg(m, "EVENTS")
			if err != nil {
				t.Fatalf("%s: %v", m.Subject(), err)
			}
			orig := cm.Subject()
			if want, ok := oc.key.Partition(orig); !ok || want != p || cm.partition != p {
				t.Errorf("%s on partition %d (subject says %d), want %d", orig, p, cm.partition, want)
			}
			if w, _ := whole.Partition(orig); w != p {
				mismatchControl++
			}
			md, _ := cm.Metadata()
			if md.Stream != "EVENTS" || md.Sequence.Stream != seqs[orig] || cm.copySeq == 0 {
				t.Errorf("%s: stream %s seq %d (copy seq %d), want EVENTS %d", orig, md.Stream, md.Sequence.Stream, cm.copySeq, seqs[orig])
			}
			h := cm.Headers()
			if h.Get("Event-Type") != "t" || h.Get(jetstream.MsgIDHeader) == "" || h.Get(headerStreamSource) != "" || h.Get(headerPinID) != "" {
				t.Errorf("%s: headers %v", orig, h)
			}
			if seen[orig] {
				t.Errorf("%s delivered twice", orig)
			}
			seen[orig] = true
		}
	}
	for _, s := range subs {
		if want := !strings.Contains(s, ".other."); seen[s] != want {
			t.Errorf("%s delivered %v, want %v", s, seen[s], want)
		}
	}
	if mismatchControl == 0 {
		t.Error("control: the partitions of the whole subject agree with every delivery; the check cannot tell keys apart")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src, err := f.js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatal(err)
	}
	if cfg, st := src.CachedInfo().Config, src.CachedInfo().State; !slices.Equal(cfg.Subjects, []string{"events.>"}) || st.Msgs != uint64(len(subs)) {
		t.Errorf("source stream: subjects %v, %d messages; want [events.>], %d", cfg.Subjects, st.Msgs, len(subs))
	}
	natstest.Eventually(t, 5*time.Second, func() error {
		info, err := oc.stream.Info(ctx)
		if err != nil {
			return err
		}
		if n := info.State.Msgs; n != 0 {
			return fmt.Errorf("the work-queue copy keeps %d acknowledged messages", n)
		}
		return nil
	})
}

// The partition consumers are pinned-client priority groups with
// PinnedTTL = ack_wait + 1s, unlimited deliveries and the in-process
// buffer as max ack pending; the copy is a work queue without subjects.
func TestOrderedCopyConfiguration(t *testing.T) {
	f := newOrderedFixture(t)
	oc, err := f.provision(t)
	if err != nil {
		t.Fatal(err)
	}
	cfg := oc.stream.CachedInfo().Config
	if cfg.Name != "EVENTS-r" || cfg.Retention != jetstream.WorkQueuePolicy || len(cfg.Subjects) != 0 || cfg.MaxAge != time.Hour || !cfg.AllowDirect {
		t.Errorf("copy config %+v", cfg)
	}
	for p, c := range oc.parts {
		cc := c.CachedInfo().Config
		if cc.Durable != fmt.Sprintf("r-p%d", p) || cc.FilterSubject != fmt.Sprintf("%d.>", p) ||
			cc.PriorityPolicy != jetstream.PriorityPolicyPinned || !slices.Equal(cc.PriorityGroups, []string{"jetbridge"}) ||
			cc.PinnedTTL != 4*time.Second || cc.MaxDeliver != -1 || cc.MaxAckPending != 64 || cc.AckWait != 3*time.Second {
			t.Errorf("partition %d: %+v", p, cc)
		}
	}
}

// Provisioning again (a restart, another replica) writes nothing; a copy
// made for another number of partitions or another key is refused, not
// changed. The control provisions after a change of max age: exactly one
// stream update.
func TestOrderedCopyIdempotent(t *testing.T) {
	f := newOrderedFixture(t)
	if _, err := f.provision(t); err != nil {
		t.Fatal(err)
	}
	writes := func(t *testing.T, provision func() error) int {
		t.Helper()
		sub, err := f.nc.SubscribeSync("$JS.API.>")
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := f.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if err := provision(); err != nil {
			t.Fatal(err)
		}
		if err := f.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := sub.NextMsg(0)
			if err != nil {
				return n
			}
			if strings.HasPrefix(m.Subject, "$JS.API.STREAM.UPDATE.") || strings.HasPrefix(m.Subject, "$JS.API.STREAM.CREATE.") {
				n++
			}
		}
	}
	again := func() error { _, err := f.provision(t); return err }
	if n := writes(t, again); n != 0 {
		t.Errorf("provisioning again wrote the copy %d times", n)
	}
	f.sc.MaxAge = config.Duration(2 * time.Hour)
	if n := writes(t, again); n != 1 {
		t.Errorf("control: a changed max age gave %d stream writes, want 1", n)
	}

	for _, change := range []func(o *config.Ordering){
		func(o *config.Ordering) { o.Partitions = 8 },
		func(o *config.Ordering) { o.Key = config.OrderingKey{} },
	} {
		o := *f.rc.Ordering
		change(&o)
		rc := *f.rc
		rc.Ordering = &o
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := provisionOrdered(ctx, f.js, f.sc, &rc, warnFails(t))
		cancel()
		var de *CopyDiffersError
		if !errors.As(err, &de) || de.Stream != "EVENTS-r" {
			t.Fatalf("ordering %+v: error %v, want a *CopyDiffersError", o, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := f.js.Stream(ctx, "EVENTS-r")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.CachedInfo().Config.Sources[0].SubjectTransforms); n != 2 {
		t.Errorf("the refused copy has %d transforms, want its own 2", n)
	}
}

// A route that was unordered and turns ordering on starts its copy after
// what its durable acknowledged: history is not delivered again. The
// control is a route without a durable: its copy holds everything.
func TestOrderedCopyStartsAfterTheUnorderedDurable(t *testing.T) {
	f := newOrderedFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var subs []string
	for k := range 10 {
		subs = append(subs, fmt.Sprintf("events.info.care.p%d", k))
	}
	f.publish(t, subs)
	cons, err := f.js.CreateOrUpdateConsumer(ctx, "EVENTS", consumerConfig(f.rc))
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(6, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	oc, err := f.provision(t)
	if err != nil {
		t.Fatal(err)
	}
	got := drain(t, oc, 4)
	var origSeqs []uint64
	for _, msgs := range got {
		for _, m := range msgs {
			cm, err := newCopyMsg(m, "EVENTS")
			if err != nil {
				t.Fatal(err)
			}
			md, _ := cm.Metadata()
			origSeqs = append(origSeqs, md.Sequence.Stream)
		}
	}
	slices.Sort(origSeqs)
	if !slices.Equal(origSeqs, []uint64{7, 8, 9, 10}) {
		t.Errorf("the copy delivered source sequences %v, want [7 8 9 10]", origSeqs)
	}

	rc := *f.rc
	rc.Name = "fresh"
	f.rc = &rc
	oc2, err := f.provision(t)
	if err != nil {
		t.Fatal(err)
	}
	drain(t, oc2, 10)
}

func TestParseStreamSource(t *testing.T) {
	good := []struct {
		h    string
		want streamSource
	}{
		{"EVENTS 2 events.critical.*\fevents.critical.*.> {{partition(4,1)}}.events.critical.{{wildcard(1)}}\f{{partition(4,1)}}.events.critical.{{wildcard(1)}}.> events.critical.p1.fall A2OTbnJO",
			streamSource{"EVENTS", 2, "events.critical.p1.fall"}},
		{"EVENTS 18446744073709551615 x y events.a", streamSource{"EVENTS", 1<<64 - 1, "events.a"}},
		{"EVENTS 7   events.a", streamSource{"EVENTS", 7, "events.a"}},
	}
	for _, g := range good {
		got, err := parseStreamSource(g.h, "EVENTS")
		if err != nil || got != g.want {
			t.Errorf("parseStreamSource(%q) = %+v, %v; want %+v", g.h, got, err, g.want)
		}
	}
	for _, h := range []string{
		"",
		"EVENTS 2",
		"EVENTS 2 a b",
		"OTHER 2 a b events.a",
		"EVENTS 0 a b events.a",
		"EVENTS -1 a b events.a",
		"EVENTS x a b events.a",
		"EVENTS 2 a b events..a",
		"EVENTS 2 a b events.* x",
		"EVENTS 2 a b events.a id extra",
		"EVENTS 2 a b events.a" + strings.Repeat("x", maxStreamSourceHeader),
	} {
		if got, err := parseStreamSource(h, "EVENTS"); !errors.Is(err, ErrNotCopied) {
			t.Errorf("parseStreamSource(%.40q) = %+v, %v; want ErrNotCopied", h, got, err)
		}
	}
}

// A partition's consumer gives its messages to one replica at a time:
// once replica A pulled and got the pin, replica B's pulls get nothing
// while A keeps pulling, and A gets every message. The control is the
// same consumer without the pinned policy: B then gets messages too.
func TestPartitionConsumerIsPinned(t *testing.T) {
	f := newOrderedFixture(t)
	oc, err := f.provision(t)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := oc.key.Partition("events.info.care.k")
	name := partitionConsumerName("r", p)
	var subs []string
	for i := range 20 {
		subs = append(subs, fmt.Sprintf("events.info.care.k.e%d", i))
	}
	f.publish(t, subs)

	run := func(t *testing.T, cfg jetstream.ConsumerConfig) (a, b int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := oc.stream.CreateOrUpdateConsumer(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		var opts []jetstream.FetchOpt
		if cfg.PriorityPolicy == jetstream.PriorityPolicyPinned {
			opts = append(opts, jetstream.FetchPriorityGroup(orderingGroup))
		}
		handle := func() jetstream.Consumer {
			_, js := natstest.Connect(t, f.nc.ConnectedUrl())
			c, err := js.Consumer(ctx, "EVENTS-r", cfg.Durable)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		ca, cb := handle(), handle()
		fetch := func(c jetstream.Consumer, n int) int {
			batch, err := c.Fetch(n, append(opts, jetstream.FetchMaxWait(300*time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for m := range batch.Messages() {
				got++
				if err := m.Ack(); err != nil {
					t.Fatal(err)
				}
			}
			return got
		}
		a = fetch(ca, 1) // A is pinned
		for a+b < 20 {
			if ctx.Err() != nil {
				t.Fatalf("A got %d, B %d of 20", a, b)
			}
			b += fetch(cb, 2)
			a += fetch(ca, 2)
		}
		return a, b
	}

	pinned := partitionConsumerConfig(f.rc, p)
	if a, b := run(t, pinned); a != 20 || b != 0 {
		t.Errorf("pinned: A got %d, B %d; want 20 and 0", a, b)
	}
	for i := range subs {
		subs[i] += ".again" // new messages (the source deduplicates by Nats-Msg-Id)
	}
	f.publish(t, subs)
	plain := pinned
	plain.Durable, plain.PriorityGroups, plain.PriorityPolicy, plain.PinnedTTL = name+"-plain", nil, jetstream.PriorityPolicyNone, 0
	if err := oc.stream.DeleteConsumer(context.Background(), name); err != nil { // a work queue allows one consumer per subject
		t.Fatal(err)
	}
	if _, b := run(t, plain); b == 0 {
		t.Error("control: without pinning B got nothing either; the check cannot fail")
	}
}
