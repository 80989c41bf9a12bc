package producer_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

func TestPublisherMessage(t *testing.T) {
	tests := []struct {
		name        string
		root        string
		ev          producer.Event
		wantSubject string
		wantHeader  nats.Header // exactly the headers of the message
		wantErr     error       // matched with errors.Is; errAny for any error
	}{
		{
			name:        "subject from root, severity and type",
			root:        "events",
			ev:          producer.Event{ID: "e-1", Type: "sensor.fall", Severity: subjects.Critical, Payload: []byte(`{"a":1}`)},
			wantSubject: "events.critical.sensor.fall",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-1"}, "Event-Id": {"e-1"}, "Event-Type": {"sensor.fall"},
				"Event-Severity": {"CRITICAL"}, "Content-Type": {"application/json"},
			},
		},
		{
			name:        "empty root means events, default severity INFO",
			ev:          producer.Event{ID: "e-2", Type: "order.created"},
			wantSubject: "events.info.order.created",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-2"}, "Event-Id": {"e-2"}, "Event-Type": {"order.created"},
				"Event-Severity": {"INFO"}, "Content-Type": {"application/json"},
			},
		},
		{
			name:        "custom root, severity in any case",
			root:        "care.home",
			ev:          producer.Event{ID: "e-3", Type: "door.open", Severity: "warning"},
			wantSubject: "care.home.warning.door.open",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-3"}, "Event-Id": {"e-3"}, "Event-Type": {"door.open"},
				"Event-Severity": {"WARNING"}, "Content-Type": {"application/json"},
			},
		},
		{
			name:        "explicit subject is used as is, with the given type",
			root:        "events",
			ev:          producer.Event{ID: "e-4", Type: "care.note", Subject: "notes.ward7", Severity: subjects.Warning},
			wantSubject: "notes.ward7",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-4"}, "Event-Id": {"e-4"}, "Event-Type": {"care.note"},
				"Event-Severity": {"WARNING"}, "Content-Type": {"application/json"},
			},
		},
		{
			name:        "event type derived from a scheme subject",
			ev:          producer.Event{ID: "e-5", Subject: "events.critical.sensor.fall", Severity: subjects.Critical},
			wantSubject: "events.critical.sensor.fall",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-5"}, "Event-Id": {"e-5"}, "Event-Type": {"sensor.fall"},
				"Event-Severity": {"CRITICAL"}, "Content-Type": {"application/json"},
			},
		},
		{
			name:        "event type of a subject outside the scheme is the subject",
			ev:          producer.Event{ID: "e-6", Subject: "orders.created"},
			wantSubject: "orders.created",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-6"}, "Event-Id": {"e-6"}, "Event-Type": {"orders.created"},
				"Event-Severity": {"INFO"}, "Content-Type": {"application/json"},
			},
		},
		{
			name: "metadata keys kept as given, content type as given",
			ev: producer.Event{
				ID: "e-7", Type: "sensor.fall", ContentType: "text/plain; charset=utf-8",
				Metadata: map[string]string{"room": "12", "X-Trace": "abc", "ward_ID": "7", "note": "tab\tok"},
			},
			wantSubject: "events.info.sensor.fall",
			wantHeader: nats.Header{
				"Nats-Msg-Id": {"e-7"}, "Event-Id": {"e-7"}, "Event-Type": {"sensor.fall"},
				"Event-Severity": {"INFO"}, "Content-Type": {"text/plain; charset=utf-8"},
				"Event-Meta-room": {"12"}, "Event-Meta-X-Trace": {"abc"}, "Event-Meta-ward_ID": {"7"},
				"Event-Meta-note": {"tab\tok"},
			},
		},
		{name: "invalid severity", ev: producer.Event{Type: "a", Severity: "loud"}, wantErr: subjects.ErrInvalid},
		{name: "invalid subject", ev: producer.Event{Subject: "events.*.fall"}, wantErr: subjects.ErrInvalid},
		{name: "subject with an empty token", ev: producer.Event{Subject: "events..fall"}, wantErr: subjects.ErrInvalid},
		{name: "invalid type", ev: producer.Event{Type: "sensor fall"}, wantErr: subjects.ErrInvalid},
		{name: "type with a wildcard", ev: producer.Event{Type: "sensor.>"}, wantErr: subjects.ErrInvalid},
		{name: "invalid root", root: "a b", ev: producer.Event{Type: "x"}, wantErr: subjects.ErrInvalid},
		{name: "neither type nor subject", ev: producer.Event{ID: "x"}, wantErr: errAny},
		{name: "metadata key with a space", ev: producer.Event{Type: "a", Metadata: map[string]string{"a b": "1"}}, wantErr: errAny},
		{name: "metadata key with a colon", ev: producer.Event{Type: "a", Metadata: map[string]string{"a:b": "1"}}, wantErr: errAny},
		{name: "empty metadata key", ev: producer.Event{Type: "a", Metadata: map[string]string{"": "1"}}, wantErr: errAny},
		{name: "metadata value with CRLF", ev: producer.Event{Type: "a", Metadata: map[string]string{"k": "1\r\nX-Injected: 1"}}, wantErr: errAny},
		{name: "id with a newline", ev: producer.Event{ID: "a\nb", Type: "a"}, wantErr: errAny},
		{name: "type with a control character", ev: producer.Event{Subject: "events.info.a", Type: "a\x00"}, wantErr: errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := producer.NewPublisher(nil, tt.root).Message(tt.ev)

			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Message: no error, want one (message %q %v)", msg.Subject, msg.Header)
				}
				if tt.wantErr != errAny && !errors.Is(err, tt.wantErr) {
					t.Errorf("Message: %v, want errors.Is %v", err, tt.wantErr)
				}
				assertNoValues(t, err, tt.ev.Metadata)
				return
			}
			if err != nil {
				t.Fatalf("Message: %v", err)
			}
			if msg.Subject != tt.wantSubject {
				t.Errorf("subject %q, want %q", msg.Subject, tt.wantSubject)
			}
			if !maps.EqualFunc(msg.Header, tt.wantHeader, slices.Equal) {
				t.Errorf("headers\n got  %v\n want %v", msg.Header, tt.wantHeader)
			}
			if string(msg.Data) != string(tt.ev.Payload) {
				t.Errorf("data %q, want the payload %q", msg.Data, tt.ev.Payload)
			}
		})
	}
}

// errAny in a wantErr column accepts any non-nil error.
var errAny = errors.New("any error")

// assertNoValues fails if err quotes a metadata value: errors name keys,
// never values.
func assertNoValues(t *testing.T, err error, md map[string]string) {
	t.Helper()
	for _, v := range md {
		if len(v) > 2 && strings.Contains(err.Error(), v) {
			t.Errorf("error %q quotes the metadata value %q", err, v)
		}
	}
}

func TestPublisherMessageGeneratesID(t *testing.T) {
	p := producer.NewPublisher(nil, "events")
	ids := map[string]bool{}
	for range 2 {
		msg, err := p.Message(producer.Event{Type: "a"})
		if err != nil {
			t.Fatalf("Message: %v", err)
		}
		id := msg.Header.Get(producer.HeaderEventID)
		if id == "" || msg.Header.Get(jetstream.MsgIDHeader) != id {
			t.Fatalf("Event-Id %q, Nats-Msg-Id %q: want the same new id", id, msg.Header.Get(jetstream.MsgIDHeader))
		}
		ids[id] = true
	}
	if len(ids) != 2 {
		t.Errorf("two events without an id got the same id: %v", ids)
	}
}

// startPublisher starts an embedded JetStream with the stream EVENTS on
// events.> (one-minute duplicate window) and returns a publisher on it.
func startPublisher(t *testing.T) (*producer.Publisher, jetstream.Stream) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := natstest.Connect(t, srv.URL())
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: time.Minute,
	})
	if err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	return producer.NewPublisher(js, "events"), s
}

func TestPublisherPublishDuplicate(t *testing.T) {
	p, s := startPublisher(t)
	ev := producer.Event{ID: "fall-1", Type: "sensor.fall", Severity: subjects.Critical, Payload: []byte(`{}`)}

	// Given an event stored once, when the same id is published again
	// inside the duplicate window, then JetStream refuses it as a duplicate
	// and reports the original's sequence.
	first, err := p.Publish(t.Context(), ev)
	if err != nil {
		t.Fatalf("first Publish: %v", err)
	}
	second, err := p.Publish(t.Context(), ev)
	if err != nil {
		t.Fatalf("second Publish: %v", err)
	}
	other, err := p.Publish(t.Context(), producer.Event{ID: "fall-2", Type: "sensor.fall", Severity: subjects.Critical})
	if err != nil {
		t.Fatalf("third Publish: %v", err)
	}

	want := producer.PublishResult{ID: "fall-1", Subject: "events.critical.sensor.fall", Stream: "EVENTS", Seq: 1}
	if first != want {
		t.Errorf("first = %+v, want %+v", first, want)
	}
	want.Duplicate = true
	if second != want {
		t.Errorf("second = %+v, want %+v", second, want)
	}
	if other.Seq != 2 || other.Duplicate {
		t.Errorf("another id = %+v, want stored at seq 2", other)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("stream holds %d messages, want 2", info.State.Msgs)
	}
}

func TestPublisherPublishStoresHeaders(t *testing.T) {
	p, s := startPublisher(t)

	res, err := p.Publish(t.Context(), producer.Event{
		Type: "door.open", Severity: subjects.Warning, Payload: []byte(`{"door":"front"}`),
		Metadata: map[string]string{"room": "12"},
	})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}

	m, err := s.GetMsg(t.Context(), res.Seq)
	if err != nil {
		t.Fatalf("GetMsg: %v", err)
	}
	if res.ID == "" || m.Header.Get(jetstream.MsgIDHeader) != res.ID || m.Header.Get(producer.HeaderEventID) != res.ID {
		t.Errorf("result id %q, stored Nats-Msg-Id %q and Event-Id %q: want one generated id",
			res.ID, m.Header.Get(jetstream.MsgIDHeader), m.Header.Get(producer.HeaderEventID))
	}
	if got := m.Header["Event-Meta-room"]; len(got) != 1 || got[0] != "12" {
		t.Errorf("Event-Meta-room = %q, want [12] (key as published)", got)
	}
	if m.Subject != "events.warning.door.open" || string(m.Data) != `{"door":"front"}` {
		t.Errorf("stored %s %q", m.Subject, m.Data)
	}
}

func TestPublisherPublishNoStream(t *testing.T) {
	p, _ := startPublisher(t)
	const canary = "payload-canary-7"

	_, err := p.Publish(t.Context(), producer.Event{Subject: "orders.info.created", Payload: []byte(canary)})

	// Then the error matches ErrNoStream, also after more wrapping, and
	// names the subject but not the payload.
	wrapped := fmt.Errorf("caller: %w", err)
	if !errors.Is(wrapped, producer.ErrNoStream) {
		t.Fatalf("Publish: %v, want errors.Is ErrNoStream", err)
	}
	if !strings.Contains(err.Error(), "orders.info.created") || strings.Contains(err.Error(), canary) {
		t.Errorf("error %q: want the subject named and the payload absent", err)
	}
}

func TestPublisherPublishInvalidEventSendsNothing(t *testing.T) {
	p, s := startPublisher(t)

	_, err := p.Publish(t.Context(), producer.Event{Type: "a", Metadata: map[string]string{"bad key": "v"}})

	if err == nil || errors.Is(err, producer.ErrNoStream) {
		t.Fatalf("Publish: %v, want a validation error", err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 0 {
		t.Errorf("stream holds %d messages, want 0", info.State.Msgs)
	}
}
