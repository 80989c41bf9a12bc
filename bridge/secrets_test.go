package bridge

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/sotercare/jetbridge/internal/sinktest"
)

// Logs, dead-letter reason headers and settlement errors never carry the
// payload, header values, URL secrets or signing secrets (docs/security.md#what-is-and-is-not-logged).
func TestNoSecretsOrPayloadsInLogsOrReasons(t *testing.T) {
	rejecting := sinktest.New(t, sinktest.Always(400))
	closer := sinktest.NewCloser(t, true)
	secret := base64.StdEncoding.EncodeToString([]byte("signing-canary-0123456789abcdef"))
	cfg := testConfig(t, `
log: {level: debug}
destinations:
  rejecting:
    url: http://user:pw-canary@%s/x?token=query-canary
    headers: {X-Api-Key: header-canary, Authorization: "Bearer auth-canary"}
    signing: {secret: "whsec_%s"}
  broken:
    url: %s?api_key=query-canary
    transport_retry: {count: 1, interval: 1ms, max_interval: 1ms}
routes:
  - {name: a, subjects: ["events.*.a.>"], destination: rejecting}
  - {name: b, subjects: ["events.*.b.>"], destination: broken, max_deliver: 2, backoff: [5ms]}
`, strings.TrimPrefix(rejecting.URL(), "http://"), secret, strings.TrimSuffix(closer.URL(), "/"))
	h := startBridge(t, cfg, faults{})
	meta := map[string]string{"Event-Meta-Note": "meta-canary", "X-Private": "header-value-canary"}
	h.publish("events.info.a.x", "e1", []byte(`{"p":"payload-canary"}`), meta)
	h.publish("events.info.b.x", "e2", []byte(`{"p":"payload-canary"}`), meta)
	h.waitOutcomes(2, settleWait, outcomeIs(OutcomeDeadLettered))
	h.quiet("a")
	h.quiet("b")
	h.stop()

	canaries := []string{"pw-canary", "query-canary", "header-canary", "auth-canary", "payload-canary", "meta-canary",
		"header-value-canary", secret, "signing-canary"}
	var texts []string
	texts = append(texts, h.logs.String())
	for _, s := range h.outcomes() {
		if s.Err != nil {
			texts = append(texts, s.Err.Error())
		}
	}
	for _, m := range h.deadLetters() {
		for k, vs := range m.Header {
			if strings.HasPrefix(k, "Bridge-") {
				texts = append(texts, strings.Join(vs, " "))
			}
		}
	}
	if len(h.deadLetters()) != 2 {
		t.Fatalf("want 2 dead letters")
	}
	for _, text := range texts {
		for _, c := range canaries {
			if strings.Contains(text, c) {
				t.Errorf("%q leaked into logs, an error or a Bridge-* header", c)
			}
		}
	}
}
