package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sotercare/jetbridge/bridge"
	"github.com/sotercare/jetbridge/config"
	"github.com/sotercare/jetbridge/deadletter"
	"github.com/sotercare/jetbridge/internal/natstest"
	"github.com/sotercare/jetbridge/internal/sotercare"
	"github.com/sotercare/jetbridge/jetbridgetest"
	"github.com/sotercare/jetbridge/producer"
	"github.com/sotercare/jetbridge/subjects"
)

// careTimeout bounds every wait of the SoterCare scenarios.
const careTimeout = 15 * time.Second

// careEnv is SoterCare end to end on the public test kit: an embedded
// JetStream, the bridge run in process with config/sotercare.yaml, the
// SoterCare API on httptest and a recording caregiver notifier.
type careEnv struct {
	srv      *jetbridgetest.Server
	b        *jetbridgetest.Bridge
	js       jetstream.JetStream // the kit's connection
	api      *nats.Conn          // the SoterCare API's connection
	apiURL   string
	cfg      *config.Config
	notifier *jetbridgetest.Receiver
}

// startCare starts the scenario with a notifier answering by script; tweak,
// if any, changes the loaded configuration first (the controls').
func startCare(t *testing.T, script jetbridgetest.Script, tweak ...func(*config.Config)) *careEnv {
	t.Helper()
	notifier := jetbridgetest.NewReceiver(t, jetbridgetest.WithScript(script))
	// The config's own environment: its nats and admin sections are used
	// only by cmd/bridge; here the bridge runs against the kit's server.
	t.Setenv("CAREGIVER_URL", notifier.URL()+"/notifier/alerts")
	t.Setenv("JETBRIDGE_STORE_DIR", t.TempDir())
	t.Setenv("JETBRIDGE_NATS_LISTEN", "127.0.0.1:0")
	t.Setenv("JETBRIDGE_ADMIN_LISTEN", "127.0.0.1:0")
	path := filepath.Join(moduleRoot(t), "config", "sotercare.yaml")
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	for _, f := range tweak {
		f(cfg)
	}
	srv := jetbridgetest.NewServer(t)
	e := &careEnv{srv: srv, js: srv.JetStream(), cfg: cfg, notifier: notifier}
	e.b = jetbridgetest.StartBridge(t, srv, cfg)

	// The API's connection has no reconnect buffer, as in cmd/sotercare: a
	// reading published while JetStream is away fails at once.
	var js jetstream.JetStream
	e.api, js = srv.Connect(t, nats.ReconnectBufSize(-1))
	hs := httptest.NewServer(sotercare.NewHandler(producer.NewPublisher(js, "events"),
		sotercare.Options{PublishTimeout: time.Second}))
	t.Cleanup(hs.Close)
	e.apiURL = hs.URL
	return e
}

// careReading is the JSON body of a reading.
func careReading(id, typ string, value float64, unit string) string {
	return fmt.Sprintf(`{"eventId":%q,"deviceId":"bed-3","eventType":%q,"value":%v,"unit":%q,"timestamp":1735689600000}`,
		id, typ, value, unit)
}

// deviceReading is careReading from another device.
func deviceReading(id, device, typ string, value float64, unit string) string {
	return strings.Replace(careReading(id, typ, value, unit), `"deviceId":"bed-3"`, `"deviceId":"`+device+`"`, 1)
}

// careAnswer is any response body of the API.
type careAnswer struct {
	sotercare.Receipt
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *careEnv) post(t *testing.T, body string) (int, careAnswer) {
	t.Helper()
	resp, err := http.Post(e.apiURL+"/api/v1/events", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST /api/v1/events: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var a careAnswer
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("response %d is not JSON: %v\n%s", resp.StatusCode, err, raw)
	}
	return resp.StatusCode, a
}

// accept posts a reading and fails unless it is accepted with the given
// classification.
func (e *careEnv) accept(t *testing.T, body string, sev sotercare.Severity, route sotercare.Route) sotercare.Receipt {
	t.Helper()
	code, a := e.post(t, body)
	if code != http.StatusAccepted || a.Status != "accepted" || a.Severity != sev || a.RoutedTo != route ||
		a.Stream != e.cfg.Stream.Name || a.Seq == 0 || a.CorrelationID == "" {
		t.Fatalf("got %d %+v, want 202 accepted %s -> %s in %s", code, a, sev, route, e.cfg.Stream.Name)
	}
	return a.Receipt
}

// quiet waits until the caregiver route has nothing pending or unsettled.
func (e *careEnv) quiet(t *testing.T) {
	t.Helper()
	e.b.WaitQuiet(t)
}

// waitNotified waits for a request carrying id, then for the routes to be
// quiet, and returns every request that carried it.
func (e *careEnv) waitNotified(t *testing.T, id string) []jetbridgetest.Request {
	t.Helper()
	e.notifier.WaitEvent(t, id)
	e.quiet(t)
	return e.notifier.Events(id)
}

// outcomes are the bridge's settlements of event id, in order.
func (e *careEnv) outcomes(id string) []bridge.Settled {
	return slices.DeleteFunc(e.b.Settlements(), func(s bridge.Settled) bool { return s.EventID != id })
}

// checkAlert checks one notification: the event's id, type and severity in
// the headers, and SoterCare's alert as the envelope's payload.
func checkAlert(t *testing.T, r jetbridgetest.Request, id, typ, severity string, care sotercare.Severity) {
	t.Helper()
	if r.Method != http.MethodPost || r.Path != "/notifier/alerts" {
		t.Errorf("request %s %s, want POST /notifier/alerts", r.Method, r.Path)
	}
	if r.Header.Get("X-Event-Type") != typ || r.Header.Get("X-Event-Severity") != severity {
		t.Errorf("X-Event-Type %q X-Event-Severity %q, want %q %q",
			r.Header.Get("X-Event-Type"), r.Header.Get("X-Event-Severity"), typ, severity)
	}
	var env struct {
		ID      string          `json:"id"`
		Payload sotercare.Alert `json:"payload"`
	}
	if err := json.Unmarshal(r.Body, &env); err != nil {
		t.Fatalf("body is not an envelope: %v\n%s", err, r.Body)
	}
	if env.ID != id || env.Payload.EventID != id || env.Payload.CareSeverity != care || env.Payload.RoutedTo != sotercare.Caregiver {
		t.Errorf("envelope id %q payload %+v, want %s, %s for the caregiver", env.ID, env.Payload, id, care)
	}
}

// The SoterCare API and the bridge with config/sotercare.yaml: caregiver
// alerts reach the notifier exactly once, everything else stays in the
// stream, duplicates and invalid readings are refused.
func TestSoterCareEndToEnd(t *testing.T) {
	e := startCare(t, jetbridgetest.Always(http.StatusOK))

	t.Run("critical fall notifies the caregiver once", func(t *testing.T) {
		rc := e.accept(t, careReading("fall-0001", "fall", 1, "boolean"), sotercare.Critical, sotercare.Caregiver)
		reqs := e.waitNotified(t, rc.EventID)
		if len(reqs) != 1 {
			t.Fatalf("notifier got %d requests for %s, want exactly 1", len(reqs), rc.EventID)
		}
		checkAlert(t, reqs[0], rc.EventID, "care.caregiver.fall", "CRITICAL", sotercare.Critical)
	})

	t.Run("high vitals notify the caregiver", func(t *testing.T) {
		rc := e.accept(t, careReading("vit-0001", "vitals", 130, "bpm"), sotercare.High, sotercare.Caregiver)
		reqs := e.waitNotified(t, rc.EventID)
		if len(reqs) != 1 {
			t.Fatalf("notifier got %d requests for %s, want exactly 1", len(reqs), rc.EventID)
		}
		checkAlert(t, reqs[0], rc.EventID, "care.caregiver.vitals", "WARNING", sotercare.High)
	})

	t.Run("normal vitals and medium moisture are stored, not notified", func(t *testing.T) {
		before := e.notifier.Count()
		stored := map[string]string{}
		for _, c := range []struct {
			body    string
			sev     sotercare.Severity
			subject string
		}{
			{careReading("vit-0002", "vitals", 72, "bpm"), sotercare.Normal, "events.info.care.eventlog.bed-3.vitals"},
			{careReading("wet-0001", "moisture", 85, "percent"), sotercare.Medium, "events.warning.care.eventlog.bed-3.moisture"},
		} {
			rc := e.accept(t, c.body, c.sev, sotercare.EventLog)
			msg := getMsg(t, e.js, e.cfg.Stream.Name, rc.Seq)
			if msg.Subject != c.subject || msg.Header.Get("Event-Id") != rc.EventID {
				t.Fatalf("seq %d: subject %s event id %q, want %s %s", rc.Seq, msg.Subject, msg.Header.Get("Event-Id"), c.subject, rc.EventID)
			}
			stored[rc.EventID] = msg.Subject
		}
		// Both caregiver consumers have nothing pending: neither reading
		// matches their filters, so nothing is on its way to the notifier.
		e.quiet(t)
		for id := range stored {
			if n := len(e.notifier.Events(id)); n != 0 {
				t.Errorf("notifier got %d requests for %s, want none", n, id)
			}
		}
		if got := e.notifier.Count(); got != before {
			t.Errorf("notifier got %d new requests, want none", got-before)
		}
	})

	t.Run("the same reading twice: 202, 409, one notification", func(t *testing.T) {
		body := careReading("fall-0002", "fall", 1, "boolean")
		rc := e.accept(t, body, sotercare.Critical, sotercare.Caregiver)
		code, a := e.post(t, body)
		if code != http.StatusConflict || a.Code != sotercare.CodeDuplicateEvent {
			t.Fatalf("second post: %d %+v, want 409 %s", code, a, sotercare.CodeDuplicateEvent)
		}
		if reqs := e.waitNotified(t, rc.EventID); len(reqs) != 1 {
			t.Fatalf("notifier got %d requests for %s, want exactly 1", len(reqs), rc.EventID)
		}
	})

	t.Run("invalid readings are refused", func(t *testing.T) {
		for name, body := range map[string]string{
			"unsupported type": careReading("tmp-0001", "temperature", 37, "celsius"),
			"out of range":     careReading("vit-0003", "vitals", 241, "bpm"),
			"malformed JSON":   `{"eventId":"fall-0003","deviceId":`,
		} {
			code, a := e.post(t, body)
			if code != http.StatusBadRequest || a.Code != sotercare.CodeInvalidEvent || a.Message == "" {
				t.Errorf("%s: %d %+v, want 400 %s with a message", name, code, a, sotercare.CodeInvalidEvent)
			}
		}
	})
}

// JetStream away: the reading is refused with 503 and not stored; once it
// is back, the same eventId is accepted and notified once.
func TestSoterCareBrokerDown(t *testing.T) {
	e := startCare(t, jetbridgetest.Always(http.StatusOK))
	body := careReading("fall-0100", "fall", 1, "boolean")

	e.srv.Shutdown()
	code, a := e.post(t, body)
	if code != http.StatusServiceUnavailable || a.Code != sotercare.CodeBrokerUnavailable {
		t.Fatalf("with JetStream stopped: %d %+v, want 503 %s", code, a, sotercare.CodeBrokerUnavailable)
	}

	e.srv.Restart(t)
	natstest.Eventually(t, careTimeout, func() error {
		if !e.api.IsConnected() {
			return errors.New("the API's connection has not reconnected yet")
		}
		return nil
	})
	rc := e.accept(t, body, sotercare.Critical, sotercare.Caregiver)
	reqs := e.waitNotified(t, rc.EventID)
	if len(reqs) != 1 {
		t.Fatalf("notifier got %d requests for %s, want exactly 1", len(reqs), rc.EventID)
	}
	checkAlert(t, reqs[0], rc.EventID, "care.caregiver.fall", "CRITICAL", sotercare.Critical)
}

// A notifier failing with 500 twice, then recovering: the critical alert is
// redelivered after the route's first two backoffs and delivered on the
// third delivery, within its max_deliver.
func TestSoterCareNotifierRecovers(t *testing.T) {
	e := startCare(t, jetbridgetest.Sequence(http.StatusInternalServerError, http.StatusInternalServerError, http.StatusOK))
	route := careRoute(t, e.cfg, "caregiver-alerts")
	rc := e.accept(t, careReading("fall-0200", "fall", 1, "boolean"), sotercare.Critical, sotercare.Caregiver)

	e.b.WaitEvent(t, rc.EventID)
	e.quiet(t)
	got := e.outcomes(rc.EventID)
	want := []bridge.Outcome{bridge.OutcomeRedeliveryScheduled, bridge.OutcomeRedeliveryScheduled, bridge.OutcomeDelivered}
	if len(got) != len(want) {
		t.Fatalf("%d settlements, want %d: %+v", len(got), len(want), got)
	}
	for i, s := range got {
		if s.Outcome != want[i] || s.Route != route.Name || s.Delivered != uint64(i+1) {
			t.Fatalf("settlement %d: %s on %s delivery %d, want %s on %s delivery %d", i, s.Outcome, s.Route, s.Delivered, want[i], route.Name, i+1)
		}
		if i < 2 && s.Delay != route.BackoffFor(i+1) {
			t.Errorf("redelivery %d after %s, want the configured %s", i+1, s.Delay, route.BackoffFor(i+1))
		}
	}
	if got[2].Delivered > uint64(route.MaxDeliver) {
		t.Fatalf("delivered on delivery %d, beyond max_deliver %d", got[2].Delivered, route.MaxDeliver)
	}
	reqs := e.notifier.Events(rc.EventID)
	var attempts []string
	for _, r := range reqs {
		attempts = append(attempts, r.Header.Get("X-Delivery-Attempt"))
	}
	if !slices.Equal(attempts, []string{"1", "2", "3"}) {
		t.Fatalf("notifier saw attempts %v, want [1 2 3]", attempts)
	}
	checkAlert(t, reqs[2], rc.EventID, "care.caregiver.fall", "CRITICAL", sotercare.Critical)
}

// A notifier answering 400 rejects the alert: one request, then a dead
// letter carrying the eventId.
func TestSoterCareNotifierRejects(t *testing.T) {
	e := startCare(t, jetbridgetest.Always(http.StatusBadRequest))
	rc := e.accept(t, careReading("vit-0200", "vitals", 45, "bpm"), sotercare.High, sotercare.Caregiver)
	reqs := e.waitNotified(t, rc.EventID)
	if len(reqs) != 1 {
		t.Fatalf("notifier got %d requests for %s, want exactly 1 (a 400 is not retried)", len(reqs), rc.EventID)
	}
	dead := e.b.WaitDeadLetters(t, 1)
	if d := dead[0]; len(dead) != 1 || d.EventID != rc.EventID || d.Reason != deadletter.ReasonRejected || d.Status != 400 ||
		d.Route != "caregiver-alerts" || d.Subject != "events.warning.care.caregiver.bed-3.vitals" {
		t.Fatalf("dead letters %+v, want one: event %s rejected with 400 on caregiver-alerts", dead, rc.EventID)
	}
	if dead[0].DLQSubject != "dlq.caregiver-alerts.events.warning.care.caregiver.bed-3.vitals" {
		t.Fatalf("dead letter subject %s", dead[0].DLQSubject)
	}
	var alert sotercare.Alert
	if err := json.Unmarshal(dead[0].Data, &alert); err != nil || alert.EventID != rc.EventID {
		t.Fatalf("dead letter payload %s (%v), want the alert for %s", dead[0].Data, err, rc.EventID)
	}
}

func careRoute(t *testing.T, cfg *config.Config, name string) *config.Route {
	t.Helper()
	for _, r := range cfg.Routes {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("config/sotercare.yaml has no route %s", name)
	return nil
}

func getMsg(t *testing.T, js jetstream.JetStream, stream string, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatalf("stream %s seq %d: %v", stream, seq, err)
	}
	return m
}

// config/sotercare.yaml as the issue describes it: every caregiver-bound
// alert, and nothing else, reaches the caregiver notifier; critical ones
// get more deliveries and a shorter backoff; the environment overrides the
// embedded server, the admin address and the notifier URL.
func TestSoterCareConfig(t *testing.T) {
	path := filepath.Join(moduleRoot(t), "config", "sotercare.yaml")
	for _, k := range []string{"CAREGIVER_URL", "JETBRIDGE_NATS_LISTEN", "JETBRIDGE_STORE_DIR", "JETBRIDGE_ADMIN_LISTEN"} {
		t.Setenv(k, "") // t.Setenv restores it; an empty value is not "unset" for ${VAR:-default}
	}
	cfg, err := config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Destinations["caregiver"].URL.Value(); got != "http://127.0.0.1:9091/notifier/alerts" {
		t.Errorf("caregiver url %q", got)
	}
	if cfg.Admin.Listen != "127.0.0.1:8089" || !cfg.Embedded() {
		t.Errorf("admin %q, embedded %v", cfg.Admin.Listen, cfg.Embedded())
	}
	t.Setenv("CAREGIVER_URL", "http://127.0.0.1:1/x")
	t.Setenv("JETBRIDGE_ADMIN_LISTEN", "127.0.0.1:1")
	t.Setenv("JETBRIDGE_NATS_LISTEN", "127.0.0.1:2")
	t.Setenv("JETBRIDGE_STORE_DIR", "/tmp/elsewhere")
	if cfg, err = config.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if cfg.Destinations["caregiver"].URL.Value() != "http://127.0.0.1:1/x" || cfg.Admin.Listen != "127.0.0.1:1" ||
		cfg.NATS.Embedded.Listen != "127.0.0.1:2" || cfg.NATS.Embedded.StoreDir != "/tmp/elsewhere" {
		t.Errorf("environment not applied: %+v %+v", cfg.NATS.Embedded, cfg.Admin)
	}

	route := careRoute(t, cfg, "caregiver-alerts")
	if len(cfg.Routes) != 1 || route.Destination != "caregiver" || route.Ordering == nil ||
		!slices.Equal(route.Ordering.Key.Tokens, []int{5}) {
		t.Fatalf("want exactly the caregiver route, ordered by the subject's fifth token (the device), got %d routes", len(cfg.Routes))
	}

	// Every reading SoterCare can publish goes to the notifier exactly
	// when SoterCare routed it to the caregiver.
	for _, r := range []sotercare.Reading{
		{EventType: "fall", Value: 1, Unit: "boolean"}, {EventType: "fall", Value: 0, Unit: "boolean"},
		{EventType: "vitals", Value: 40, Unit: "bpm"}, {EventType: "vitals", Value: 80, Unit: "bpm"}, {EventType: "vitals", Value: 200, Unit: "bpm"},
		{EventType: "moisture", Value: 10, Unit: "percent"}, {EventType: "moisture", Value: 90, Unit: "percent"},
	} {
		r.EventID, r.DeviceID, r.Timestamp = "evt-0001", "bed-3", 1
		c, err := sotercare.Classify(r)
		if err != nil {
			t.Fatal(err)
		}
		subject, err := c.Subject("events", r)
		if err != nil {
			t.Fatal(err)
		}
		if tok := strings.Split(subject, "."); len(tok) < 5 || tok[4] != r.DeviceID {
			t.Errorf("%s: the fifth token is not the device %s", subject, r.DeviceID)
		}
		var matched []string
		for _, route := range cfg.Routes {
			for _, f := range route.Subjects {
				if subjects.Match(f, subject) {
					matched = append(matched, route.Name)
				}
			}
		}
		want := 0
		if c.Route == sotercare.Caregiver {
			want = 1
		}
		if len(matched) != want {
			t.Errorf("%s (%s, %s): matched by routes %v, want %d route", subject, c.Severity, c.Route, matched, want)
		}
	}
}

// The caregiver route orders by device (config/sotercare.yaml): bed-7's
// "fall detected" fails once, and until another device's alert has
// arrived, so its
// redelivery holds bed-7 ("fall resolved" waits for it) and only bed-7
// (bed-8's vitals alert goes through meanwhile, or the fall never
// succeeds). Negative control: the same route unordered lets "fall
// resolved" overtake the fall.
func TestSoterCareOrdersPerDevice(t *testing.T) {
	check := func(t *testing.T, tweak ...func(*config.Config)) error {
		var sawVitals bool
		falls := 0
		e := startCare(t, func(r jetbridgetest.Request) jetbridgetest.Response {
			switch r.EventID() {
			case "vit-0300":
				sawVitals = true
			case "fall-0300":
				if falls++; falls == 1 || !sawVitals {
					return jetbridgetest.Response{Status: http.StatusServiceUnavailable}
				}
			}
			return jetbridgetest.Response{}
		}, tweak...)
		e.accept(t, deviceReading("fall-0300", "bed-7", "fall", 1, "boolean"), sotercare.Critical, sotercare.Caregiver)
		e.accept(t, deviceReading("fall-0301", "bed-7", "fall", 0, "boolean"), sotercare.Normal, sotercare.Caregiver)
		e.accept(t, deviceReading("vit-0300", "bed-8", "vitals", 130, "bpm"), sotercare.High, sotercare.Caregiver)
		for _, id := range []string{"fall-0300", "fall-0301", "vit-0300"} {
			e.notifier.WaitEvent(t, id)
		}
		e.quiet(t)
		fall, resolved := e.notifier.Events("fall-0300"), e.notifier.Events("fall-0301")
		if len(resolved) != 1 || len(fall) < 2 {
			t.Fatalf("fall detected sent %d times, fall resolved %d times; want at least 2 and exactly 1", len(fall), len(resolved))
		}
		if got, done := resolved[0].N, fall[len(fall)-1].N; got < done {
			return fmt.Errorf("fall resolved arrived as request %d, before fall detected was delivered (request %d)", got, done)
		}
		return nil
	}
	if err := check(t); err != nil {
		t.Fatal(err)
	}
	t.Run("control: unordered", func(t *testing.T) {
		if err := check(t, func(c *config.Config) { c.Routes[0].Ordering = nil }); err == nil {
			t.Fatal("the unordered route kept the order too: the assertion would catch nothing")
		}
	})
}
