package bridge

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
)

// oldClassification is the classifier of the safety net before failures
// were classified: every failure is retried (every 5 s then; 50 ms here, so
// the negative controls stay short) and logged every time.
func oldClassification(error, uint64) advisoryVerdict {
	return advisoryVerdict{delay: 50 * time.Millisecond, log: true}
}

// checkPermanent waits until the safety net has given up on n advisories
// with reason (counted, advisory stream empty), or has logged more lines
// than that (the sign of retries), then checks that each was logged exactly
// once at error level (lines holding every one of match), counted once and
// acked, and that no other reason was counted.
func checkPermanent(h *harness, reason safetyNetReason, n int, match ...string) error {
	ctx := context.Background()
	advisories := func() uint64 {
		s, err := h.js.Stream(ctx, advisoryStreamName(h.cfg.DeadLetter))
		if err != nil {
			return 1 << 62
		}
		return s.CachedInfo().State.Msgs
	}
	counted := func(r safetyNetReason) int {
		return int(testutil.ToFloat64(h.b.m.safetyNet.WithLabelValues(string(r))))
	}
	lines := func() int {
		return logLines(h.logs.String(), append([]string{`"component":"max-deliveries"`}, match...)...)
	}
	waitUntil(settleWait, func() bool {
		return (counted(reason) >= n && advisories() == 0) || lines() > n
	})
	var errs []error
	if got := counted(reason); got != n {
		errs = append(errs, fmt.Errorf("bridge_safety_net_failures_total{reason=%s} = %d, want %d", reason, got, n))
	}
	for _, r := range safetyNetReasons {
		if got := counted(r); r != reason && got != 0 {
			errs = append(errs, fmt.Errorf("bridge_safety_net_failures_total{reason=%s} = %d, want 0", r, got))
		}
	}
	if m := advisories(); m != 0 {
		errs = append(errs, fmt.Errorf("advisory stream holds %d advisories, want none (acked)", m))
	}
	if got := lines(); got != n {
		errs = append(errs, fmt.Errorf("%d log lines about it, want exactly %d", got, n))
	}
	want := append([]string{`"component":"max-deliveries"`, `"level":"error"`, `"reason":"` + string(reason) + `"`}, match...)
	if got := logLines(h.logs.String(), want...); got != n {
		errs = append(errs, fmt.Errorf("%d error lines with reason %s, want %d", got, reason, n))
	}
	return errors.Join(errs...)
}

// messageStillStored fails unless the source stream still holds seq.
func messageStillStored(h *harness, seq uint64) error {
	s, err := h.js.Stream(context.Background(), h.cfg.Stream.Name)
	if err != nil {
		return err
	}
	if _, err := s.GetMsg(context.Background(), seq); err != nil {
		return fmt.Errorf("message %d no longer in the source stream: %w", seq, err)
	}
	return nil
}

// The dead-letter stream refuses even the smallest dead letter (its
// max_msg_size is below the Bridge-* headers): the route leaves the message
// for redelivery until JetStream gives up on it, then the safety net meets
// the same refusal. That is permanent: logged once with the stream
// sequence, counted once, advisory acked; the message stays in the source
// stream.
func TestSafetyNetDeadLetterRefusedIsPermanent(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, sinktest.Always(400))
		cfg := testConfig(t, `
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.>"], destination: d, max_deliver: 2, ack_wait: 1s, backoff: [10ms]}
`, sink.URL())
		h := startTweaked(t, natstest.Start(t), cfg, tweak)
		setDLQMaxMsgSize(t, h.js, cfg.DeadLetter.Stream, 64)
		seq := h.publish("events.info.x", "e1", []byte(`{"n":1}`), nil)
		if err := checkPermanent(h, safetyNetDeadLetterRefused, 1, fmt.Sprintf(`"stream_seq":%d`, seq), `"route":"r"`); err != nil {
			return err
		}
		if dl := h.deadLetters(); len(dl) != 0 {
			return fmt.Errorf("%d dead letters stored, want none", len(dl))
		}
		if n := sink.Count(); n != 2 {
			return fmt.Errorf("destination received %d requests, want 2 (max_deliver)", n)
		}
		return messageStillStored(h, seq)
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every failure retried", func(t testing.TB) error { return check(t, retryPermanentAdvisories) })
}

// An advisory for a route that this replica does not run and whose
// consumer no longer exists on the server is permanent: logged once with
// the stream sequence (the message stays in the source stream, where an
// operator can recover it), counted once, acked.
func TestSafetyNetConsumerGoneIsPermanent(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, sinktest.Always(200))
		const routes = `
destinations:
  d: {url: %s}
routes:
  - {name: r, subjects: ["events.info.>"], destination: d, max_deliver: 2, ack_wait: 1s}
`
		const other = `  - {name: other, subjects: ["events.warning.>"], destination: d, max_deliver: 2, ack_wait: 1s}
`
		srv := natstest.Start(t)
		_, js := natstest.Connect(t, srv.URL())
		ctx := context.Background()
		// An older deploy ran route "other"; JetStream gave up on one of its
		// messages, then the route was removed and its consumer deleted.
		pre := provisioned(t, testConfig(t, routes+other, sink.URL()), js, faults{})
		ack, err := js.Publish(ctx, "events.warning.x", []byte(`{}`), jetstream.WithMsgID("w1"))
		if err != nil {
			t.Fatal(err)
		}
		cons := pre.routes[1].consumer()
		leaveUnsettled(t, cons, 3)
		advStream, err := js.Stream(ctx, advisoryStreamName(pre.cfg.DeadLetter))
		if err != nil {
			t.Fatal(err)
		}
		natstest.Eventually(t, 20*time.Second, func() error {
			// A pull after ack_wait makes JetStream announce the advisory.
			_, _ = cons.Fetch(1, jetstream.FetchMaxWait(1500*time.Millisecond))
			info, err := advStream.Info(ctx)
			if err != nil || info.State.Msgs != 1 {
				return errors.New("no MAX_DELIVERIES advisory stored yet")
			}
			return nil
		})
		if err := js.DeleteConsumer(ctx, pre.cfg.Stream.Name, "other"); err != nil {
			t.Fatal(err)
		}

		h := startTweaked(t, srv, testConfig(t, routes, sink.URL()), tweak)
		if err := checkPermanent(h, safetyNetConsumerGone, 1, fmt.Sprintf(`"stream_seq":%d`, ack.Sequence), `"consumer":"other"`); err != nil {
			return err
		}
		if dl := h.deadLetters(); len(dl) != 0 {
			return fmt.Errorf("%d dead letters stored, want none", len(dl))
		}
		return messageStillStored(h, ack.Sequence)
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every failure retried", func(t testing.TB) error { return check(t, retryPermanentAdvisories) })
}

// The advisory stream is untrusted input: anything that can publish on the
// advisory subject can store garbage there. Oversized, non-JSON, incomplete
// advisories and advisories that disagree with their subject are each
// logged once (without their content), counted and acked; nothing is
// dead-lettered.
func TestSafetyNetForgedAdvisoriesArePermanent(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, maxDeliverRoute, sink.URL(), 2)
		h := startTweaked(t, natstest.Start(t), cfg, tweak)
		seq := h.publish("events.info.x", "e1", []byte(`{}`), nil)
		h.waitOutcomes(1, settleWait, nil)
		subject := maxDeliveriesPrefix + cfg.Stream.Name + ".r"
		forged := [][]byte{
			[]byte("zzzz not json zzzz"),
			[]byte(`{"stream":"EVENTS","consumer":"r","stream_seq":1,"pad":"` + strings.Repeat("z", maxAdvisoryBytes) + `"}`),
			[]byte(`{"stream":"EVENTS","consumer":"r"}`),
			[]byte(fmt.Sprintf(`{"stream":"EVENTS","consumer":"other","stream_seq":%d}`, seq)),
			[]byte(fmt.Sprintf(`{"stream":"EVENTS","consumer":"r.x","stream_seq":%d}`, seq)),
		}
		for _, data := range forged {
			if _, err := h.js.PublishMsg(context.Background(), &nats.Msg{Subject: subject, Data: data}); err != nil {
				t.Fatalf("forge advisory: %v", err)
			}
		}
		if err := checkPermanent(h, safetyNetInvalidAdvisory, len(forged)); err != nil {
			return err
		}
		if strings.Contains(h.logs.String(), "zzzz") {
			return errors.New("the log quotes a forged advisory")
		}
		if dl := h.deadLetters(); len(dl) != 0 {
			return fmt.Errorf("%d dead letters stored from forged advisories, want none", len(dl))
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every failure retried", func(t testing.TB) error { return check(t, retryPermanentAdvisories) })
}

// classifyCases is the classification every safety-net failure must get.
var classifyCases = []struct {
	name string
	err  error
	want safetyNetReason // permanent reason; "" transient
}{
	{"unreadable advisory", fmt.Errorf("%w: not a JSON advisory", errInvalidAdvisory), safetyNetInvalidAdvisory},
	{"foreign stream", errForeignStream, safetyNetForeignStream},
	{"consumer deleted", fmt.Errorf("lookup: %w", jetstream.ErrConsumerNotFound), safetyNetConsumerGone},
	{"consumer not found from the server", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeConsumerNotFound}), safetyNetConsumerGone},
	{"message gone", jetstream.ErrMsgNotFound, safetyNetMessageGone},
	{"source stream gone", fmt.Errorf("bridge: stream EVENTS: %w", jetstream.ErrStreamNotFound), safetyNetMessageGone},
	{"dead letter refused", fmt.Errorf("%w (stream_max_msg_size): x", ErrDeadLetterRefused), safetyNetDeadLetterRefused},
	{"timeout", context.DeadlineExceeded, ""},
	{"nats timeout", nats.ErrTimeout, ""},
	{"no stream response", jetstream.ErrNoStreamResponse, ""},
	{"disconnected", nats.ErrConnectionClosed, ""},
	{"max_payload, not yet shrunk", nats.ErrMaxPayload, ""},
	{"JetStream unavailable", fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled}), ""},
}

func checkClassifier(c func(err error, delivered uint64) advisoryVerdict) error {
	for _, tc := range classifyCases {
		v := c(tc.err, 3)
		if v.reason != tc.want {
			return fmt.Errorf("%s: reason %q, want %q", tc.name, v.reason, tc.want)
		}
		if tc.want == "" && v.delay != advisoryBackoff(3) {
			return fmt.Errorf("%s: delay %s, want %s", tc.name, v.delay, advisoryBackoff(3))
		}
	}
	return nil
}

func TestClassifyAdvisoryFailure(t *testing.T) {
	if err := checkClassifier(classifyAdvisoryFailure); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every failure retried", func(testing.TB) error { return checkClassifier(oldClassification) })

	// Transient failures are logged on the first delivery, then every
	// transientLogEvery-th.
	var logged []uint64
	for n := uint64(1); n <= 40; n++ {
		if classifyAdvisoryFailure(nats.ErrTimeout, n).log {
			logged = append(logged, n)
		}
	}
	if fmt.Sprint(logged) != "[1 12 24 36]" {
		t.Errorf("transient failures logged on deliveries %v, want [1 12 24 36]", logged)
	}
}

func TestAdvisoryBackoff(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want time.Duration
	}{
		{0, 5 * time.Second}, {1, 5 * time.Second}, {2, 10 * time.Second}, {3, 20 * time.Second},
		{6, 160 * time.Second}, {7, 5 * time.Minute}, {100, 5 * time.Minute}, {1 << 62, 5 * time.Minute},
	} {
		if got := advisoryBackoff(tc.n); got != tc.want {
			t.Errorf("advisoryBackoff(%d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}

// The pauses after failed advisory fetches in a row: as newRetryBackoff paces them,
// 100 ms doubling up to 5 s, and from the start again after a fetch works.
func TestFetchRetry(t *testing.T) {
	b := newRetryBackoff()
	var got []time.Duration
	for range 9 {
		got = append(got, b.NextBackOff())
	}
	const want = "[100ms 200ms 400ms 800ms 1.6s 3.2s 5s 5s 5s]"
	if fmt.Sprint(got) != want {
		t.Errorf("pauses %v, want %s", got, want)
	}
	b.Reset()
	if d := b.NextBackOff(); d != 100*time.Millisecond {
		t.Errorf("first pause after Reset = %s, want 100ms", d)
	}
}

func TestNthBackOff(t *testing.T) {
	flat := &backoff.ExponentialBackOff{InitialInterval: time.Second, Multiplier: 1, MaxInterval: time.Hour}
	if d := nthBackOff(flat, 1<<62); d != time.Second {
		t.Errorf("multiplier 1: %s, want 1s", d)
	}
	// A randomization factor set by mistake is ignored: delays stay exact.
	jittered := &backoff.ExponentialBackOff{InitialInterval: time.Second, RandomizationFactor: 0.5, Multiplier: 3, MaxInterval: time.Minute}
	for i, want := range []time.Duration{time.Second, 3 * time.Second, 9 * time.Second, 27 * time.Second, time.Minute, time.Minute} {
		if d := nthBackOff(jittered, uint64(i+1)); d != want {
			t.Errorf("nthBackOff(%d) = %s, want %s", i+1, d, want)
		}
	}
}

func TestParseAdvisory(t *testing.T) {
	const subj = maxDeliveriesPrefix + "EVENTS.r"
	tests := []struct {
		name    string
		subject string
		data    string
		ok      bool
	}{
		{"a real advisory", subj, `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"EVENTS","consumer":"r","stream_seq":7,"deliveries":3}`, true},
		{"not JSON", subj, `garbage`, false},
		{"no stream_seq", subj, `{"stream":"EVENTS","consumer":"r"}`, false},
		{"no stream", subj, `{"consumer":"r","stream_seq":7}`, false},
		{"consumer differs from the subject", subj, `{"stream":"EVENTS","consumer":"s","stream_seq":7}`, false},
		{"stream differs from the subject", subj, `{"stream":"OTHER","consumer":"r","stream_seq":7}`, false},
		{"wildcard consumer", maxDeliveriesPrefix + "EVENTS.*", `{"stream":"EVENTS","consumer":"*","stream_seq":7}`, false},
		{"dotted consumer", maxDeliveriesPrefix + "EVENTS.a.b", `{"stream":"EVENTS","consumer":"a.b","stream_seq":7}`, false},
		{"control character", subj, "{\"stream\":\"EVENTS\",\"consumer\":\"r\\n\",\"stream_seq\":7}", false},
		{"name too long", maxDeliveriesPrefix + "EVENTS." + strings.Repeat("c", 300), `{"stream":"EVENTS","consumer":"` + strings.Repeat("c", 300) + `","stream_seq":7}`, false},
		{"oversized", subj, `{"stream":"EVENTS","consumer":"r","stream_seq":7,"x":"` + strings.Repeat("x", maxAdvisoryBytes) + `"}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			adv, err := parseAdvisory(tc.subject, []byte(tc.data))
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %t", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, errInvalidAdvisory) {
					t.Errorf("error %v does not match errInvalidAdvisory", err)
				}
				if strings.Contains(err.Error(), "xxxx") || strings.Contains(err.Error(), "garbage") {
					t.Errorf("error quotes the advisory: %v", err)
				}
				return
			}
			if adv.Stream != "EVENTS" || adv.Consumer != "r" || adv.StreamSeq != 7 || adv.Deliveries != 3 {
				t.Errorf("parsed %+v", adv)
			}
		})
	}
}
