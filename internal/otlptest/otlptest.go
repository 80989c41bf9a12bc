// Package otlptest is a real OTLP/HTTP trace receiver for tests: an HTTP
// server on 127.0.0.1 (random port) that decodes each protobuf
// ExportTraceServiceRequest (gzip or not) and keeps the spans. It can
// also hang (never answer) to play a collector that is stuck.
//
// Invariant: every span of every request answered 200 is in Spans.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a received span, with ids in hex.
type Span struct {
	TraceID, SpanID, ParentID string
	Name                      string
	Kind                      tracepb.Span_SpanKind
	StatusCode                tracepb.Status_StatusCode
	Attributes                map[string]string // values as text
	Service                   string            // the resource's service.name
}

// Receiver is a running OTLP/HTTP receiver.
type Receiver struct {
	srv     *httptest.Server
	hang    chan struct{} // nil: answer; else requests block until it is closed
	mu      sync.Mutex
	spans   []Span
	reqs    int
	changed chan struct{}
}

// New starts a receiver until the test ends. With hang, it reads each
// request and never answers (until the test ends).
func New(t testing.TB, hang bool) *Receiver {
	r := &Receiver{changed: make(chan struct{})}
	if hang {
		r.hang = make(chan struct{})
	}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	if hang {
		t.Cleanup(func() { close(r.hang) }) // runs before Close
	}
	return r
}

// URL is the base endpoint (OTEL_EXPORTER_OTLP_ENDPOINT).
func (r *Receiver) URL() string { return r.srv.URL }

// Requests is the number of export requests seen.
func (r *Receiver) Requests() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Changed is closed when the next request has been recorded.
func (r *Receiver) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "not an OTLP traces endpoint", http.StatusNotFound)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, 64<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, "bad gzip", http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, "body", http.StatusBadRequest)
		return
	}
	var ex coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &ex); err != nil {
		http.Error(w, "not an ExportTraceServiceRequest", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.reqs++
	r.mu.Unlock()
	if r.hang != nil {
		select {
		case <-r.hang:
		case <-req.Context().Done():
		}
		return
	}
	var got []Span
	for _, rs := range ex.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					StatusCode: s.GetStatus().GetCode(), Attributes: map[string]string{}, Service: service,
				}
				for _, kv := range s.GetAttributes() {
					sp.Attributes[kv.GetKey()] = valueText(kv.GetValue())
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func valueText(v *commonpb.AnyValue) string {
	if _, ok := v.GetValue().(*commonpb.AnyValue_IntValue); ok {
		return strconv.FormatInt(v.GetIntValue(), 10)
	}
	return v.GetStringValue()
}
