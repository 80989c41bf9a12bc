package config

// Tracing is the optional tracing block (docs/tracing.md). The standard
// OTEL_* environment variables configure everything else, and an endpoint
// set by OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// takes precedence over Endpoint.
type Tracing struct {
	// Endpoint, when set, turns tracing on with this OTLP endpoint
	// (http:// or https://).
	Endpoint Secret `yaml:"endpoint"`
	// EventID adds each event's id to its delivery span
	// (messaging.message.id). Off by default: an event id may be personal
	// data.
	EventID bool `yaml:"event_id"`
}

func (v *validator) tracing(t *Tracing) {
	if t.Endpoint != "" {
		if why := checkURL(t.Endpoint.Value(), "http", "https"); why != "" {
			v.addf("tracing.endpoint", "%s", why)
		}
	}
}
