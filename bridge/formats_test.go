package bridge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// Each format's request, field by field; event metadata that tries to set
// Authorization, Host or an injected header has no effect on the request.
func TestRequestFormats(t *testing.T) {
	env := sinktest.New(t, nil)
	raw := sinktest.New(t, nil)
	ce := sinktest.New(t, nil)
	key1 := []byte("0123456789abcdef0123456789abcdef")
	key2 := []byte("fedcba9876543210fedcba9876543210")
	cfg := testConfig(t, `
destinations:
  env:
    url: %s/hooks/env?token=s3cr3t
    headers: {X-Api-Key: configured-key, Authorization: "Bearer configured"}
    signing:
      secret: ["whsec_%s", "whsec_%s"]
  raw:
    url: %s
    format: raw
  ce:
    url: %s
    format: cloudevents
routes:
  - {name: env, subjects: ["events.*.env.>"], destination: env}
  - {name: raw, subjects: ["events.*.raw.>"], destination: raw}
  - {name: ce, subjects: ["events.*.ce.>"], destination: ce}
`, env.URL(), base64.StdEncoding.EncodeToString(key1), base64.StdEncoding.EncodeToString(key2), raw.URL(), ce.URL())
	h := startBridge(t, cfg, faults{})

	hostile := map[string]string{
		"Event-Type":                 "order.created",
		"Event-Severity":             "critical",
		"Event-Id":                   "evt-1",
		"Event-Meta-Authorization":   "Bearer stolen",
		"Event-Meta-Host":            "evil.example",
		"Event-Meta-tenant":          "acme",
		"Event-Meta-X-Injected":      "a\tb",
		"Event-Meta-Idempotency-Key": "forged",
		"X-Injected":                 "1", // a plain NATS header is never forwarded either
	}
	payload := `{"order": 42, "items": ["a"]}`
	h.publish("events.critical.env.order", "m1", []byte(payload), hostile)
	rawHdr := map[string]string{"Content-Type": "text/plain; charset=utf-8", "Event-Id": "evt-2", "Event-Meta-Host": "evil.example"}
	h.publish("events.info.raw.note", "m2", []byte("plain text, not JSON"), rawHdr)
	h.publish("events.warning.ce.sensor.temp", "m3", []byte(`{"t":81}`), map[string]string{"Event-Meta-Authorization": "x"})
	h.waitOutcomes(3, settleWait, outcomeIs(OutcomeDelivered))
	for _, r := range []string{"env", "raw", "ce"} {
		h.quiet(r)
	}

	noForgery := func(t *testing.T, r sinktest.Request) {
		t.Helper()
		for _, name := range []string{"X-Injected", "Host", "Event-Meta-Authorization", "Event-Id", "Event-Type"} {
			if v := r.Header.Get(name); v != "" {
				t.Errorf("header %s = %q reached the destination", name, v)
			}
		}
		if strings.Contains(r.Header.Get("Authorization"), "stolen") {
			t.Errorf("metadata set Authorization")
		}
	}

	t.Run("envelope", func(t *testing.T) {
		r := env.Requests()[0]
		if r.Method != "POST" || r.Path != "/hooks/env" {
			t.Errorf("request %s %s", r.Method, r.Path)
		}
		want := map[string]string{
			"Content-Type":       "application/json",
			"X-Event-Id":         "evt-1",
			"X-Event-Type":       "order.created",
			"X-Event-Severity":   "CRITICAL",
			"X-Delivery-Attempt": "1",
			"Idempotency-Key":    "evt-1",
			"X-Api-Key":          "configured-key",
			"Authorization":      "Bearer configured",
			"Webhook-Id":         "evt-1",
		}
		for k, v := range want {
			if got := r.Header.Get(k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
		noForgery(t, r)
		var body map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &body); err != nil {
			t.Fatalf("body: %v", err)
		}
		keys := make([]string, 0, len(body))
		for k := range body {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, []string{"eventType", "id", "metadata", "payload", "publishedAt", "severity", "subject"}) {
			t.Errorf("envelope keys %v", keys)
		}
		str := func(k string) string {
			var s string
			_ = json.Unmarshal(body[k], &s)
			return s
		}
		if str("id") != "evt-1" || str("eventType") != "order.created" || str("severity") != "CRITICAL" || str("subject") != "events.critical.env.order" {
			t.Errorf("envelope %s", r.Body)
		}
		var md map[string]string
		_ = json.Unmarshal(body["metadata"], &md)
		if md["tenant"] != "acme" || md["Authorization"] != "Bearer stolen" {
			t.Errorf("metadata %v: want the entries as data, keys as published", md)
		}
		var p, wantP any
		_ = json.Unmarshal(body["payload"], &p)
		_ = json.Unmarshal([]byte(payload), &wantP)
		if b1, b2 := mustJSON(p), mustJSON(wantP); b1 != b2 {
			t.Errorf("payload %s, want %s", b1, b2)
		}
		if ts, err := time.Parse(time.RFC3339Nano, str("publishedAt")); err != nil || time.Since(ts) > time.Minute {
			t.Errorf("publishedAt %q: %v", str("publishedAt"), err)
		}
		// Standard Webhooks: one v1 signature per key over id.timestamp.body.
		ts := r.Header.Get("Webhook-Timestamp")
		if sec, err := strconv.ParseInt(ts, 10, 64); err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Minute {
			t.Errorf("webhook-timestamp %q", ts)
		}
		sigs := strings.Fields(r.Header.Get("Webhook-Signature"))
		if len(sigs) != 2 {
			t.Fatalf("webhook-signature %q: want 2 signatures (rotation)", sigs)
		}
		for i, key := range [][]byte{key1, key2} {
			mac := hmac.New(sha256.New, key)
			mac.Write([]byte("evt-1." + ts + "."))
			mac.Write(r.Body)
			if want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)); sigs[i] != want {
				t.Errorf("signature %d does not verify", i)
			}
		}
	})

	t.Run("raw", func(t *testing.T) {
		r := raw.Requests()[0]
		if string(r.Body) != "plain text, not JSON" {
			t.Errorf("body %q", r.Body)
		}
		if got := r.Header.Get("Content-Type"); got != "text/plain; charset=utf-8" {
			t.Errorf("Content-Type %q", got)
		}
		if r.Header.Get("X-Event-Id") != "evt-2" || r.Header.Get("X-Event-Type") != "raw.note" || r.Header.Get("X-Event-Severity") != "INFO" {
			t.Errorf("event headers %v", r.Header)
		}
		if r.Header.Get("Webhook-Signature") != "" {
			t.Errorf("unsigned destination sent a signature")
		}
		noForgery(t, r)
	})

	t.Run("cloudevents", func(t *testing.T) {
		r := ce.Requests()[0]
		want := map[string]string{
			"Ce-Specversion":   "1.0",
			"Ce-Id":            "m3",
			"Ce-Type":          "ce.sensor.temp",
			"Ce-Source":        "nats://EVENTS/events.warning.ce.sensor.temp",
			"Ce-Subject":       "events.warning.ce.sensor.temp",
			"Content-Type":     "application/json",
			"X-Event-Severity": "WARNING",
			"Idempotency-Key":  "m3",
		}
		for k, v := range want {
			if got := r.Header.Get(k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
		if _, err := time.Parse(time.RFC3339Nano, r.Header.Get("Ce-Time")); err != nil {
			t.Errorf("ce-time: %v", err)
		}
		if string(r.Body) != `{"t":81}` {
			t.Errorf("body %q", r.Body)
		}
		noForgery(t, r)
	})
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Credentials in a destination URL become Basic authorization, as
// http.Client adds them (the bridge sends its requests through the
// transport directly); a configured Authorization header wins.
func TestDestinationURLCredentials(t *testing.T) {
	basic := sinktest.New(t, nil)
	configured := sinktest.New(t, nil)
	withUser := func(u string) string { return strings.Replace(u, "http://", "http://hook-user:p%40ss@", 1) }
	cfg := testConfig(t, `
destinations:
  basic:
    url: %s/in?x=1
  configured:
    url: %s
    headers: {Authorization: "Bearer configured"}
routes:
  - {name: basic, subjects: ["events.*.basic.>"], destination: basic}
  - {name: configured, subjects: ["events.*.configured.>"], destination: configured}
`, withUser(basic.URL()), withUser(configured.URL()))
	h := startBridge(t, cfg, faults{})
	h.publish("events.info.basic.x", "m1", []byte(`{}`), nil)
	h.publish("events.info.configured.x", "m2", []byte(`{}`), nil)
	h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDelivered))
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("hook-user:p@ss"))
	if r := basic.Requests()[0]; r.Header.Get("Authorization") != want || r.Path != "/in" {
		t.Errorf("URL credentials: Authorization %q, path %q; want %q, /in", r.Header.Get("Authorization"), r.Path, want)
	}
	if got := configured.Requests()[0].Header.Get("Authorization"); got != "Bearer configured" {
		t.Errorf("configured Authorization: %q reached the destination", got)
	}
}
