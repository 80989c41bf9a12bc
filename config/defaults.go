package config

import "time"

// This file is the one place that holds default values. Load starts from
// defaultConfig and decodes the file over it, so a key that is absent keeps
// its default while an explicit value, zero included, replaces it. Items of
// maps and lists (destinations, routes, status_retry) get theirs from the
// functions below, called by their UnmarshalYAML methods.

// Destination formats.
const (
	FormatEnvelope    = "envelope"
	FormatRaw         = "raw"
	FormatCloudEvents = "cloudevents"
)

func defaultConfig() Config {
	return Config{
		NATS: NATS{
			Name: "jetbridge",
			Embedded: Embedded{
				Listen:   "127.0.0.1:4222",
				StoreDir: "data/jetstream",
			},
		},
		Stream: Stream{
			Name:            "EVENTS",
			Subjects:        []string{"events.>"},
			Create:          true,
			DuplicateWindow: Duration(2 * time.Minute),
			MaxAge:          Duration(168 * time.Hour),
			Replicas:        1,
		},
		DeadLetter: DeadLetter{
			Stream:        "EVENTS_DLQ",
			SubjectPrefix: "dlq",
			MaxAge:        Duration(720 * time.Hour),
			Replicas:      1,
		},
		Idempotency: Idempotency{
			Bucket: "EVENTS_DELIVERED",
			TTL:    Duration(24 * time.Hour),
		},
		Admin:           Admin{Listen: "127.0.0.1:8088"},
		Log:             Log{Level: "info", Format: "json"},
		ShutdownTimeout: Duration(30 * time.Second),
	}
}

func defaultDestination() Destination {
	return Destination{
		Timeout: Duration(time.Second),
		Format:  FormatEnvelope,
		TransportRetry: Backoff{
			Count:         2,
			Interval:      Duration(50 * time.Millisecond),
			BackoffFactor: 2,
			MaxInterval:   Duration(200 * time.Millisecond),
		},
		CircuitBreaker: CircuitBreaker{
			Enabled:          true,
			FailureRate:      0.5,
			MinRequests:      10,
			Window:           Duration(10 * time.Second),
			Delay:            Duration(2 * time.Second),
			SuccessThreshold: 1,
			Statuses:         []int{500, 502, 503, 504},
		},
	}
}

// defaultStatusRetry fills a status_retry block that is present; an absent
// block stays nil (status retries off).
func defaultStatusRetry() StatusRetry {
	return StatusRetry{
		Codes: []int{502, 503, 504},
		Backoff: Backoff{
			Count:         2,
			Interval:      Duration(200 * time.Millisecond),
			BackoffFactor: 2,
			MaxInterval:   Duration(2 * time.Second),
		},
		MaxElapsed: Duration(5 * time.Second),
	}
}

func defaultRoute() Route {
	return Route{
		MaxDeliver: 5,
		Backoff: []Duration{
			Duration(time.Second),
			Duration(5 * time.Second),
			Duration(30 * time.Second),
			Duration(2 * time.Minute),
		},
		AckWait:           Duration(30 * time.Second),
		MaxInFlight:       32,
		RedeliverStatuses: []int{408, 425, 429, 500, 502, 503, 504},
		MaxRetryAfter:     Duration(5 * time.Minute),
	}
}
