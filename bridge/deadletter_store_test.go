package bridge

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sinktest"
	"github.com/sotercare/jetbridge/producer"
)

// startTweaked is startBridgeOn with tweak applied to the bridge between
// New and Run: tests replace a value that production builds once
// (the JetStream the bridge stores dead letters on, see
// dlq_faults_test.go) with a broken variant
// there. A nil tweak runs the real bridge.
func startTweaked(t testing.TB, srv *natstest.Server, cfg *config.Config, tweak func(*Bridge)) *harness {
	t.Helper()
	return startHarness(t, srv, cfg, faults{}, tweak)
}

// setDLQMaxMsgSize gives the dead-letter stream its own max_msg_size, as an
// operator may (the bridge's provisioning would reset it, so tests call this
// after the bridge is ready).
func setDLQMaxMsgSize(t testing.TB, js jetstream.JetStream, stream string, n int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	c := s.CachedInfo().Config
	c.MaxMsgSize = n
	if _, err := js.UpdateStream(ctx, c); err != nil {
		t.Fatalf("update %s: %v", stream, err)
	}
}

// jsonOfSize is a JSON object of exactly n bytes (n >= 10).
func jsonOfSize(n int) []byte {
	return []byte(`{"pad":"` + strings.Repeat("a", n-10) + `"}`)
}

// logLines counts the lines of the captured log that contain every one of
// parts.
func logLines(logs string, parts ...string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// quietErr is harness.quiet for checks that negative controls run too: it
// returns an error instead of failing the test.
func quietErr(h *harness, route string, timeout time.Duration) error {
	var last error
	if waitUntil(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := h.js.Consumer(ctx, h.cfg.Stream.Name, route)
		if err != nil {
			last = err
			return false
		}
		info := c.CachedInfo()
		last = fmt.Errorf("consumer %s: NumPending=%d NumAckPending=%d", route, info.NumPending, info.NumAckPending)
		return info.NumPending == 0 && info.NumAckPending == 0
	}) {
		return nil
	}
	return last
}

const rejectingRoute = `
destinations:
  d:
    url: %s
    format: envelope
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
`

// A message rejected by its destination (400) whose dead letter would not
// fit ends as exactly one dead letter in the largest form that fits, and
// the source message is terminated: near the server's 1 MiB max_payload it
// goes without its payload (the size is computed before sending); against a
// dead-letter stream with its own max_msg_size it goes without its payload
// after the stream refused the whole one (error code 10054); with original
// headers too large on their own, it keeps only Event-Id, Event-Type,
// Event-Severity and Content-Type.
func TestRejectedDeadLetterThatWouldNotFit(t *testing.T) {
	tests := []struct {
		name        string
		payload     func(limit int64) int // payload size from the server's max_payload
		bigHeader   int                   // size of an X-Big original header; 0: none
		dlqMax      int32                 // the dead-letter stream's max_msg_size; 0: unlimited
		wantRefused string                // refused_by in the log line
		wantMinimal bool                  // original headers dropped too
	}{
		{
			name: "payload and headers just under max_payload",
			payload: func(limit int64) int {
				// The source message, with its Nats-Msg-Id and Event-Type, is 8 bytes under the limit.
				hdr := nats.Header{jetstream.MsgIDHeader: {"e1"}, producer.HeaderEventType: {"big.report"}}
				return int(limit - msgSize(&nats.Msg{Header: hdr}) - 8)
			},
			wantRefused: "max_payload",
		},
		{
			name:        "dead-letter stream max_msg_size",
			payload:     func(int64) int { return 8 << 10 },
			dlqMax:      4 << 10,
			wantRefused: "stream_max_msg_size",
		},
		{
			// JetStream stores at most 64 KiB of headers: the original ones
			// fit, with the Bridge-* headers added they would not.
			name:    "original headers just under JetStream's 64 KiB header limit",
			payload: func(int64) int { return 1 << 10 },
			bigHeader: func() int {
				hdr := nats.Header{jetstream.MsgIDHeader: {"e1"}, producer.HeaderEventType: {"big.report"}, "X-Big": {""}}
				return int(maxHeaderBytes - headerSize(&nats.Msg{Header: hdr}) - 8)
			}(),
			wantRefused: "header_size",
			wantMinimal: true,
		},
		{
			name:        "dead-letter stream max_msg_size below the original headers",
			payload:     func(int64) int { return 1 << 10 },
			bigHeader:   20_000,
			dlqMax:      8 << 10,
			wantRefused: "stream_max_msg_size",
			wantMinimal: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			check := func(t testing.TB, tweak func(*Bridge)) error {
				sink := sinktest.New(t, sinktest.Always(400))
				cfg := testConfig(t, rejectingRoute, sink.URL())
				h := startTweaked(t, natstest.Start(t), cfg, tweak)
				if tc.dlqMax > 0 {
					setDLQMaxMsgSize(t, h.js, cfg.DeadLetter.Stream, tc.dlqMax)
				}
				limit := h.nc.MaxPayload()
				payload := jsonOfSize(tc.payload(limit))
				hdr := map[string]string{producer.HeaderEventType: "big.report"}
				if tc.bigHeader > 0 {
					hdr["X-Big"] = strings.Repeat("b", tc.bigHeader)
				}
				seq := h.publish("events.info.big", "e1", payload, hdr)

				// The first settlement decides: dead-lettered, or (broken)
				// left for redelivery because the dead letter was not stored.
				first := h.waitOutcomes(1, settleWait, nil)
				if len(first) == 0 {
					return errors.New("the message was never settled")
				}
				if first[0].Outcome != OutcomeDeadLettered || first[0].Reason != deadletter.ReasonRejected {
					return fmt.Errorf("first settlement %s %s, want dead_lettered rejected", first[0].Outcome, first[0].Reason)
				}
				if err := quietErr(h, "r", 10*time.Second); err != nil {
					return fmt.Errorf("source message not terminated: %w", err)
				}
				if out := h.outcomes(); len(out) != 1 {
					return fmt.Errorf("%d settlements, want 1 (the message was redelivered)", len(out))
				}
				if n := sink.Count(); n != 1 {
					return fmt.Errorf("destination received %d requests, want 1", n)
				}
				dl := h.deadLetters()
				if len(dl) != 1 {
					return fmt.Errorf("%d dead letters, want exactly 1", len(dl))
				}
				d := dl[0]
				if len(d.Data) != 0 {
					return fmt.Errorf("dead letter carries %d payload bytes, want none", len(d.Data))
				}
				for k, want := range map[string]string{
					deadletter.HeaderPayloadOmitted:   strconv.Itoa(len(payload)),
					deadletter.HeaderOriginalSequence: strconv.FormatUint(seq, 10),
					deadletter.HeaderOriginalStream:   cfg.Stream.Name,
					deadletter.HeaderOriginalSubject:  "events.info.big",
					deadletter.HeaderReason:           string(deadletter.ReasonRejected),
					deadletter.HeaderStatus:           "400",
					producer.HeaderEventID:            "e1",
					producer.HeaderEventType:          "big.report",
					jetstream.MsgIDHeader:             deadletter.MsgID("r", cfg.Stream.Name, seq),
				} {
					if got := d.Header.Get(k); got != want {
						return fmt.Errorf("dead letter %s = %q, want %q", k, got, want)
					}
				}
				if got := d.Header.Get(deadletter.HeaderHeadersOmitted); tc.wantMinimal != (got == "1") {
					return fmt.Errorf("%s = %q, want original headers omitted: %t", deadletter.HeaderHeadersOmitted, got, tc.wantMinimal)
				}
				if tc.wantMinimal && d.Header.Get("X-Big") != "" {
					return errors.New("minimal dead letter kept the X-Big original header")
				}
				if !tc.wantMinimal && len(d.Header.Get("X-Big")) != tc.bigHeader {
					return errors.New("dead letter lost an original header it had room for")
				}
				if v := testutil.ToFloat64(h.b.m.payloadOmitted.WithLabelValues("r")); v != 1 {
					return fmt.Errorf("bridge_dead_letter_payload_omitted_total{route=r} = %v, want 1", v)
				}
				if v := testutil.ToFloat64(h.b.m.deadLetters.WithLabelValues("r", string(deadletter.ReasonRejected))); v != 1 {
					return fmt.Errorf("bridge_dead_letters_total{route=r,reason=rejected} = %v, want 1", v)
				}
				logs := h.logs.String()
				if n := logLines(logs, "dead letter too large", `"refused_by":"`+tc.wantRefused+`"`,
					fmt.Sprintf(`"stream_seq":%d`, seq), fmt.Sprintf(`"payload_bytes":%d`, len(payload)), `"max_payload":`); n != 1 {
					return fmt.Errorf("%d omission log lines, want 1", n)
				}
				if strings.Contains(logs, "bbbbbbbb") || strings.Contains(logs, "aaaaaaaa") {
					return errors.New("the log carries payload or header bytes")
				}
				return nil
			}
			if err := check(t, nil); err != nil {
				t.Fatal(err)
			}
			expectBroken(t, "dead letters never shrink", func(t testing.TB) error { return check(t, noShrink) })
		})
	}
}

// A ~1 MiB message JetStream gave up on (its deliveries went unsettled
// while no bridge ran) is dead-lettered by the safety net without its
// payload, once.
func TestGivenUpNearLimitMessageDeadLetteredWithoutPayload(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, sinktest.Always(200))
		cfg := testConfig(t, maxDeliverRoute, sink.URL(), 2)
		srv := natstest.Start(t)
		nc, js := natstest.Connect(t, srv.URL())
		ctx := context.Background()
		pre := provisioned(t, cfg, js, faults{})
		hdr := nats.Header{jetstream.MsgIDHeader: {"e1"}}
		payload := jsonOfSize(int(nc.MaxPayload() - msgSize(&nats.Msg{Header: hdr}) - 8))
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "events.info.x", Header: hdr, Data: payload})
		if err != nil {
			t.Fatal(err)
		}
		leaveUnsettled(t, pre.routes[0].consumer(), 3)

		h := startTweaked(t, srv, cfg, tweak)
		// Wait until the safety net handled the advisory, either way.
		waitUntil(settleWait, func() bool {
			return len(h.outcomes()) > 0 || logLines(h.logs.String(), `"component":"max-deliveries"`, "safety net:") > 0
		})
		out := h.outcomes()
		if len(out) != 1 || out[0].Outcome != OutcomeDeadLettered || out[0].Reason != deadletter.ReasonMaxDeliveries {
			return fmt.Errorf("settlements %+v, want one dead letter max-deliveries", out)
		}
		dl := h.deadLetters()
		if len(dl) != 1 {
			return fmt.Errorf("%d dead letters, want exactly 1", len(dl))
		}
		d := dl[0]
		if len(d.Data) != 0 || d.Header.Get(deadletter.HeaderPayloadOmitted) != strconv.Itoa(len(payload)) {
			return fmt.Errorf("dead letter has %d payload bytes and %s %q, want none and %d",
				len(d.Data), deadletter.HeaderPayloadOmitted, d.Header.Get(deadletter.HeaderPayloadOmitted), len(payload))
		}
		if d.Header.Get(deadletter.HeaderOriginalSequence) != strconv.FormatUint(ack.Sequence, 10) ||
			d.Header.Get(deadletter.HeaderReason) != string(deadletter.ReasonMaxDeliveries) || d.Header.Get(deadletter.HeaderDeliveries) != "3" {
			return errors.New("dead letter's Bridge-Original-Sequence, Bridge-Reason or Bridge-Deliveries wrong")
		}
		if n := sink.Count(); n != 0 {
			return fmt.Errorf("destination received %d requests, want 0", n)
		}
		if v := testutil.ToFloat64(h.b.m.payloadOmitted.WithLabelValues("r")); v != 1 {
			return fmt.Errorf("payload-omitted counter = %v, want 1", v)
		}
		if v := testutil.ToFloat64(h.b.m.deadLetters.WithLabelValues("r", string(deadletter.ReasonMaxDeliveries))); v != 1 {
			return fmt.Errorf("dead-letter counter = %v, want 1", v)
		}
		return nil
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "dead letters never shrink", func(t testing.TB) error { return check(t, noShrink) })
}

// msgSize is exact: against a real server's max_payload, a message padded
// to msgSize == limit is sent and one byte more is refused by the client.
func TestMsgSizeMatchesTheClientsCheck(t *testing.T) {
	headers := []struct {
		name string
		h    nats.Header
	}{
		{"no header", nil},
		{"one header", nats.Header{"Event-Id": {"e1"}}},
		{"values trimmed by the encoder", nats.Header{"Event-Type": {"  spaced  "}, "X-Tab": {"\tv\t"}}},
		{"several values and keys", nats.Header{"X-Multi": {"a", "bb", "ccc"}, "Nats-Msg-Id": {"dlq:r:EVENTS:1"}, "Bridge-Reason": {"rejected"}}},
		{"empty value", nats.Header{"X-Empty": {""}}},
	}
	srv := natstest.Start(t)
	nc, _ := natstest.Connect(t, srv.URL())
	limit := nc.MaxPayload()
	check := func(t testing.TB, size func(*nats.Msg) int64) error {
		for _, tc := range headers {
			m := &nats.Msg{Subject: "size.check", Header: tc.h}
			m.Data = make([]byte, limit-size(m))
			if err := nc.PublishMsg(m); err != nil {
				return fmt.Errorf("%s: message of computed size %d refused: %v", tc.name, limit, err)
			}
			m.Data = append(m.Data, 'x')
			if err := nc.PublishMsg(m); !errors.Is(err, nats.ErrMaxPayload) {
				return fmt.Errorf("%s: one byte over the computed limit: %v, want nats.ErrMaxPayload", tc.name, err)
			}
		}
		return nil
	}
	// JetStream's header limit: headers of exactly maxHeaderBytes are
	// stored, one byte more is refused with error code 10097.
	_, js := natstest.Connect(t, srv.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SIZE", Subjects: []string{"size.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	checkHeaders := func(t testing.TB, size func(*nats.Msg) int64) error {
		m := &nats.Msg{Subject: "size.hdr", Header: nats.Header{"X-Big": {""}}}
		m.Header.Set("X-Big", strings.Repeat("h", int(maxHeaderBytes-size(m))))
		if _, err := js.PublishMsg(ctx, m); err != nil {
			return fmt.Errorf("headers of computed size %d refused: %v", maxHeaderBytes, err)
		}
		m.Header.Set("X-Big", m.Header.Get("X-Big")+"h")
		if _, err := js.PublishMsg(ctx, m); err == nil {
			return fmt.Errorf("headers one byte over %d stored", maxHeaderBytes)
		} else if why, _ := tooLarge(err); why != "header_size" {
			return fmt.Errorf("headers one byte over the limit: %v, want error code 10097", err)
		}
		return nil
	}
	unframed := func(m *nats.Msg) int64 {
		n := int64(len(m.Data))
		for k, vs := range m.Header {
			for _, v := range vs {
				n += int64(len(k) + len(v))
			}
		}
		return n
	}
	if err := check(t, msgSize); err != nil {
		t.Fatal(err)
	}
	if err := checkHeaders(t, headerSize); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "headers counted without their framing", func(t testing.TB) error { return check(t, unframed) })
	expectBroken(t, "header limit without framing", func(t testing.TB) error { return checkHeaders(t, unframed) })
}

func TestShrinkDeadLetter(t *testing.T) {
	full := &nats.Msg{
		Subject: "dlq.r.events.info.x",
		Data:    jsonOfSize(1000),
		Header: nats.Header{
			producer.HeaderEventID:            {"e1"},
			producer.HeaderEventType:          {"t"},
			"event-severity":                  {"INFO"}, // a producer's own spelling is kept too
			producer.HeaderContentType:        {"application/json"},
			"X-Big":                           {"bbbb"},
			"Event-Meta-Patient":              {"p1"},
			jetstream.MsgIDHeader:             {"dlq:r:EVENTS:7"},
			jetstream.ExpectedStreamHeader:    {"EVENTS_DLQ"},
			deadletter.HeaderReason:           {string(deadletter.ReasonRejected)},
			deadletter.HeaderOriginalSequence: {"7"},
		},
	}
	tests := []struct {
		form        dlForm
		wantData    string
		wantKeys    []string
		wantAbsent  []string
		wantOmitted string // Bridge-Payload-Omitted
		wantHeaders string // Bridge-Headers-Omitted
	}{
		{dlFull, string(jsonOfSize(1000)), []string{"X-Big", deadletter.HeaderReason}, []string{deadletter.HeaderPayloadOmitted, deadletter.HeaderHeadersOmitted}, "", ""},
		{dlNoPayload, "", []string{"X-Big", "Event-Meta-Patient", deadletter.HeaderReason, jetstream.MsgIDHeader}, []string{deadletter.HeaderHeadersOmitted}, "1000", ""},
		{dlMinimal, "", []string{producer.HeaderEventID, producer.HeaderEventType, "event-severity", producer.HeaderContentType, jetstream.MsgIDHeader,
			jetstream.ExpectedStreamHeader, deadletter.HeaderReason, deadletter.HeaderOriginalSequence}, []string{"X-Big", "Event-Meta-Patient"}, "1000", "2"},
	}
	for _, tc := range tests {
		t.Run(strconv.Itoa(int(tc.form)), func(t *testing.T) {
			m := shrinkDeadLetter(full, tc.form)
			if string(m.Data) != tc.wantData || m.Subject != full.Subject {
				t.Errorf("data %q subject %q, want %q %q", m.Data, m.Subject, tc.wantData, full.Subject)
			}
			for _, k := range tc.wantKeys {
				if len(m.Header[k]) == 0 || m.Header[k][0] != full.Header[k][0] {
					t.Errorf("header %s = %v, want %v", k, m.Header[k], full.Header[k])
				}
			}
			for _, k := range tc.wantAbsent {
				if _, ok := m.Header[k]; ok {
					t.Errorf("header %s present, want absent", k)
				}
			}
			if tc.wantOmitted != "" && m.Header.Get(deadletter.HeaderPayloadOmitted) != tc.wantOmitted {
				t.Errorf("%s = %q, want %q", deadletter.HeaderPayloadOmitted, m.Header.Get(deadletter.HeaderPayloadOmitted), tc.wantOmitted)
			}
			if tc.wantHeaders != "" && m.Header.Get(deadletter.HeaderHeadersOmitted) != tc.wantHeaders {
				t.Errorf("%s = %q, want %q", deadletter.HeaderHeadersOmitted, m.Header.Get(deadletter.HeaderHeadersOmitted), tc.wantHeaders)
			}
			if tc.form > dlFull && msgSize(m) >= msgSize(full) {
				t.Errorf("form %d is %d bytes, not smaller than the full %d", tc.form, msgSize(m), msgSize(full))
			}
		})
	}
	if full.Header.Get(deadletter.HeaderPayloadOmitted) != "" || len(full.Data) != 1000 {
		t.Error("shrinkDeadLetter changed the full dead letter")
	}
}

func TestTooLarge(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nats.ErrMaxPayload, "max_payload"},
		{fmt.Errorf("wrapped: %w", nats.ErrMaxPayload), "max_payload"},
		{fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}), "stream_max_msg_size"},
		{nats.ErrBadHeaderMsg, "header_format"},
		{fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: errCodeHeaderTooLarge}), "header_size"},
		{nats.ErrTimeout, ""},
		{context.DeadlineExceeded, ""},
		{jetstream.ErrNoStreamResponse, ""},
		{fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled}), ""},
	}
	for _, tc := range tests {
		why, ok := tooLarge(tc.err)
		if why != tc.want || ok != (tc.want != "") {
			t.Errorf("tooLarge(%v) = %q %t, want %q", tc.err, why, ok, tc.want)
		}
	}
}

// plantDeadLetterID stores a message on the dead-letter subject of route
// r for subject under the Nats-Msg-Id the real dead letter of the given
// source sequence will carry, as a producer allowed on the dead-letter
// prefix could (without the permissions of
// docs/security.md#who-may-write-dead-letters). It returns its
// sequence on the dead-letter stream.
func plantDeadLetterID(t testing.TB, js jetstream.JetStream, id, subject string) uint64 {
	t.Helper()
	h := nats.Header{}
	h.Set(jetstream.MsgIDHeader, id)
	h.Set(producer.HeaderEventID, "fall-7")
	h.Set(deadletter.HeaderRoute, "r")
	h.Set(deadletter.HeaderReason, string(deadletter.ReasonRejected))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: "dlq.r." + subject, Header: h, Data: attackerPayload})
	if err != nil || ack.Duplicate {
		t.Fatalf("plant: %+v, %v", ack, err)
	}
	return ack.Sequence
}

// The suspected pre-planting: a message stored on the dead-letter
// subject under "dlq:r:EVENTS:1" before the real dead-lettering of EVENTS
// seq 1. The dead-letter stream answers the real one as a duplicate; the
// bridge reads back what is stored there, sees another message, stores
// the dead letter again under an id no producer can plant, and only then
// terminates the source message. A warning names the route and the
// sequences, and no payload or header value.
func TestPlantedDeadLetterIDIsNotTrusted(t *testing.T) {
	check := func(t testing.TB, tweak func(*Bridge)) error {
		sink := sinktest.New(t, sinktest.Always(400))
		cfg := testConfig(t, attackYAML, sink.URL())
		h := startTweaked(t, natstest.Start(t), cfg, tweak)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		planted := plantDeadLetterID(t, h.js, deadletter.MsgID("r", "EVENTS", 1), fallSubject)
		seq := h.publish(fallSubject, "fall-7", fallPayload, map[string]string{producer.HeaderEventID: "fall-7", "X-Ward": "w-3"})
		if seq != 1 {
			return fmt.Errorf("source seq %d, want 1", seq)
		}
		out := h.waitOutcomes(1, settleWait, nil)
		if len(out) != 1 || out[0].Outcome != OutcomeDeadLettered {
			return fmt.Errorf("settlements %+v, want one dead letter", out)
		}
		if err := quietErr(h, "r", 10*time.Second); err != nil {
			return fmt.Errorf("source message not terminated: %w", err)
		}
		var errs []error
		dl := h.deadLetters()
		if len(dl) != 2 || dl[0].Sequence != planted {
			return fmt.Errorf("%d messages on the dead-letter stream, want the planted one (seq %d) and the real dead letter", len(dl), planted)
		}
		real := dl[1]
		wantID := deadletter.RestoreMsgID(deadletter.MsgID("r", "EVENTS", 1), planted, dl[0].Time, fallPayload)
		for k, want := range map[string]string{
			jetstream.MsgIDHeader: wantID, producer.HeaderEventID: "fall-7", "X-Ward": "w-3",
			deadletter.HeaderReason: string(deadletter.ReasonRejected), deadletter.HeaderStatus: "400", deadletter.HeaderRoute: "r",
			deadletter.HeaderOriginalStream: "EVENTS", deadletter.HeaderOriginalSequence: "1", deadletter.HeaderOriginalSubject: fallSubject,
		} {
			if got := real.Header.Get(k); got != want {
				errs = append(errs, fmt.Errorf("real dead letter %s = %q, want %q", k, got, want))
			}
		}
		if string(real.Data) != string(fallPayload) || real.Subject != "dlq.r."+fallSubject {
			errs = append(errs, errors.New("the real dead letter lost its payload or subject"))
		}
		// and it replays like any other
		sink.SetScript(sinktest.Always(200))
		if res, err := deadletter.Open(h.js, cfg).Replay(ctx, real.Sequence, false); err != nil || res.Duplicate {
			errs = append(errs, fmt.Errorf("replay of the real dead letter: %+v, %v", res, err))
		}
		logs := h.logs.String()
		if n := logLines(logs, `"level":"warn"`, "dead-letter id collision", `"route":"r"`, `"stream":"EVENTS"`, `"stream_seq":1`,
			fmt.Sprintf(`"planted_dlq_seq":%d`, planted), fmt.Sprintf(`"dlq_seq":%d`, real.Sequence), "stored again under a new id"); n != 1 {
			errs = append(errs, fmt.Errorf("%d collision warnings naming the route and sequences, want 1", n))
		}
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "dead-letter id collision") && (strings.Contains(line, "fall-7") || strings.Contains(line, "w-3") ||
				strings.Contains(line, "patient") || strings.Contains(line, "attacker") || strings.Contains(line, "dlq:r:")) {
				errs = append(errs, fmt.Errorf("the collision warning carries a payload or header value: %s", line))
			}
		}
		return errors.Join(errs...)
	}
	if err := check(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "a duplicate PubAck trusted", func(t testing.TB) error { return check(t, trustDeadLetterDuplicates) })
}

// deadLetterTwice dead-letters one delivery (EVENTS seq 1 on route r)
// twice through the route, with other reasons as a second replica or the
// safety net would, and returns both sequences on the dead-letter stream.
func deadLetterTwice(t testing.TB, h *harness) ([2]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hdr := nats.Header{producer.HeaderEventID: {"fall-7"}, "X-Ward": {"w-3"}, jetstream.MsgIDHeader: {"fall-7"}}
	ev := &event{ID: "fall-7", Subject: fallSubject, Stream: "EVENTS", Seq: 1, Delivered: 1}
	var seqs [2]uint64
	var err error
	if seqs[0], err = h.b.routes[0].deadLetter(ctx, hdr, fallPayload, ev, deadletter.ReasonRejected, ErrGivenUp); err != nil {
		return seqs, err
	}
	ev.Delivered = 5
	seqs[1], err = h.b.routes[0].deadLetter(ctx, hdr, fallPayload, ev, deadletter.ReasonMaxDeliveries, ErrGivenUp)
	return seqs, err
}

// A retried dead-lettering of the same delivery (another reason, time and
// delivery count) is read back, recognised and stores one copy; so is one
// retried after the dead letter was stored again under its restore id.
// Both ids taken by other messages: an error, so the message is
// redelivered rather than lost.
func TestDeadLetterDuplicateReadBack(t *testing.T) {
	start := func(t testing.TB, tweak func(*Bridge)) *harness {
		sink := sinktest.New(t, sinktest.Always(200))
		return startTweaked(t, natstest.Start(t), testConfig(t, attackYAML, sink.URL()), tweak)
	}
	genuine := func(t testing.TB, tweak func(*Bridge)) error {
		h := start(t, tweak)
		seqs, err := deadLetterTwice(t, h)
		if err != nil {
			return err
		}
		if n := len(h.deadLetters()); n != 1 || seqs[0] != seqs[1] {
			return fmt.Errorf("dead-lettered twice: %d copies at %v, want one", n, seqs)
		}
		return nil
	}
	if err := genuine(t, nil); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, "every duplicate called another message", func(t testing.TB) error {
		return genuine(t, distrustDeadLetterDuplicates)
	})

	t.Run("retried after a planted id", func(t *testing.T) {
		h := start(t, nil)
		planted := plantDeadLetterID(t, h.js, deadletter.MsgID("r", "EVENTS", 1), fallSubject)
		seqs, err := deadLetterTwice(t, h)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(h.deadLetters()); n != 2 || seqs[0] != seqs[1] || seqs[0] == planted {
			t.Fatalf("%d messages on the dead-letter stream, dead letter at %v; want the planted one and one copy", n, seqs)
		}
	})

	t.Run("both ids taken", func(t *testing.T) {
		h := start(t, nil)
		planted := plantDeadLetterID(t, h.js, deadletter.MsgID("r", "EVENTS", 1), fallSubject)
		// an attacker who could read the planted message's stored time
		m, err := h.deadLetters()[0], error(nil)
		if m.Sequence != planted {
			t.Fatal("planted message not found")
		}
		plantDeadLetterID(t, h.js, deadletter.RestoreMsgID(deadletter.MsgID("r", "EVENTS", 1), planted, m.Time, fallPayload), fallSubject)
		_, err = deadLetterTwice(t, h)
		if !errors.Is(err, ErrDeadLetterCollision) {
			t.Fatalf("dead-lettering with both ids taken: %v, want ErrDeadLetterCollision", err)
		}
		if n := len(h.deadLetters()); n != 2 {
			t.Fatalf("%d messages on the dead-letter stream, want the 2 planted ones", n)
		}
	})
}

func TestDeadLetterMismatch(t *testing.T) {
	sent := &nats.Msg{Subject: "dlq.r." + fallSubject, Data: fallPayload, Header: nats.Header{
		jetstream.MsgIDHeader: {"dlq:r:EVENTS:1"}, producer.HeaderEventID: {"fall-7"}, "X-Ward": {"w-3"}, "X-Multi": {"a", "b"},
		deadletter.HeaderRoute: {"r"}, deadletter.HeaderReason: {string(deadletter.ReasonRejected)}, deadletter.HeaderOriginalStream: {"EVENTS"}, deadletter.HeaderOriginalSequence: {"1"},
		deadletter.HeaderOriginalSubject: {fallSubject}, deadletter.HeaderFailedAt: {"2026-03-01T10:00:00Z"}, jetstream.ExpectedStreamHeader: {"EVENTS_DLQ"},
	}}
	stored := func() *jetstream.RawStreamMsg {
		h := nats.Header{}
		for k, vs := range sent.Header {
			h[k] = slices.Clone(vs)
		}
		return &jetstream.RawStreamMsg{Subject: sent.Subject, Header: h, Data: slices.Clone(sent.Data), Sequence: 1}
	}
	if got := deadLetterMismatch(stored(), sent); got != "" {
		t.Fatalf("the dead letter itself: %q", got)
	}
	omitted := shrinkDeadLetter(sent, dlNoPayload)
	for name, tc := range map[string]struct {
		change func(m *jetstream.RawStreamMsg)
		want   string
	}{
		"another reason, time, count": {func(m *jetstream.RawStreamMsg) {
			m.Header.Set(deadletter.HeaderReason, string(deadletter.ReasonMaxDeliveries))
			m.Header.Set(deadletter.HeaderFailedAt, "2026-03-01T11:00:00Z")
			m.Header.Set(deadletter.HeaderDeliveries, "5")
		}, ""},
		"subject":                    {func(m *jetstream.RawStreamMsg) { m.Subject = "dlq.r.events.x" }, "subject"},
		"route":                      {func(m *jetstream.RawStreamMsg) { m.Header.Set(deadletter.HeaderRoute, "r2") }, deadletter.HeaderRoute},
		"source stream":              {func(m *jetstream.RawStreamMsg) { m.Header.Del(deadletter.HeaderOriginalStream) }, deadletter.HeaderOriginalStream},
		"source sequence":            {func(m *jetstream.RawStreamMsg) { m.Header.Set(deadletter.HeaderOriginalSequence, "2") }, deadletter.HeaderOriginalSequence},
		"source subject":             {func(m *jetstream.RawStreamMsg) { m.Header.Set(deadletter.HeaderOriginalSubject, "events.x") }, deadletter.HeaderOriginalSubject},
		"event id":                   {func(m *jetstream.RawStreamMsg) { m.Header.Set(producer.HeaderEventID, "fall-8") }, producer.HeaderEventID},
		"an original header changed": {func(m *jetstream.RawStreamMsg) { m.Header.Set("X-Ward", "w-4") }, "original headers"},
		"an original value dropped":  {func(m *jetstream.RawStreamMsg) { m.Header.Set("X-Multi", "a") }, "original headers"},
		"an original header added":   {func(m *jetstream.RawStreamMsg) { m.Header.Set("X-Extra", "x") }, "original headers"},
		"an original header missing": {func(m *jetstream.RawStreamMsg) { m.Header.Del("X-Ward") }, "original headers"},
		"payload":                    {func(m *jetstream.RawStreamMsg) { m.Data = attackerPayload }, "payload"},
		"payload omitted":            {func(m *jetstream.RawStreamMsg) { m.Data = nil; m.Header.Set(deadletter.HeaderPayloadOmitted, "32") }, deadletter.HeaderPayloadOmitted + ", payload"},
		"planted": {func(m *jetstream.RawStreamMsg) {
			m.Header = nats.Header{jetstream.MsgIDHeader: {"dlq:r:EVENTS:1"}, producer.HeaderEventID: {"fall-7"}, deadletter.HeaderRoute: {"r"}}
			m.Data = attackerPayload
		}, strings.Join([]string{deadletter.HeaderOriginalStream, deadletter.HeaderOriginalSequence, deadletter.HeaderOriginalSubject, "original headers", "payload"}, ", ")},
	} {
		m := stored()
		tc.change(m)
		if got := deadLetterMismatch(m, sent); got != tc.want {
			t.Errorf("%s: mismatch %q, want %q", name, got, tc.want)
		}
	}
	// a dead letter stored without its payload matches the same form
	m := &jetstream.RawStreamMsg{Subject: omitted.Subject, Header: omitted.Header, Data: nil}
	if got := deadLetterMismatch(m, omitted); got != "" {
		t.Errorf("the payload-omitted form itself: %q", got)
	}
	if got := deadLetterMismatch(m, sent); got != deadletter.HeaderPayloadOmitted+", payload" {
		t.Errorf("the payload-omitted form against the full one: %q", got)
	}
}

// attackYAML is one route on events.>, the whole namespace a producer may
// publish on, to a destination that rejects until it is fixed.
const attackYAML = `
destinations:
  d:
    url: %s
    circuit_breaker: {enabled: false}
routes:
  - name: r
    subjects: ["events.>"]
    destination: d
`

// The victim's event and the attacker's message.
var (
	fallPayload     = []byte(`{"patient":"p-1","event":"fall"}`)
	attackerPayload = []byte(`{"attacker":true}`)
)

const fallSubject = "events.critical.sensor.fall"
