// Command watermill is the benchmark's Watermill peer
// (docs/performance.md#the-watermill-peer): a NATS JetStream → HTTP bridge
// assembled from Watermill the way issue 26 states it, the bridge a Go
// developer would write in an afternoon with a framework. It lives in a
// module of its own so that jetbridge's module never depends on Watermill;
// `go run ./test/bench` builds it with `go build` in this directory and
// runs it like the naive reference bridge: same JetStream server, stream
// and sink. It prints "ready" once its subscriptions are made.
//
// Nothing here is tuned beyond the stated configuration: a message.Router
// with the Retry and Recoverer middleware, the watermill-nats subscriber
// on a durable push consumer (64 queue subscriptions, asynchronous acks,
// ack wait 30 s, at most 1024 unacknowledged), a handler that publishes
// each message through the watermill-http publisher, and an HTTP
// transport keeping 64 idle connections per host.
//
// As its users typically configure it, it deletes its durable consumer
// when it stops (the subscriptions made the consumer, and nats.go deletes
// a consumer it made on Unsubscribe): restarted, it replays the stream.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmhttp "github.com/ThreeDotsLabs/watermill-http/v2/pkg/http"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go"
)

// config is what the benchmark passes on the command line.
type config struct {
	natsURL string // the JetStream server
	dest    string // the destination URL: every message is POSTed there
	subject string // the subject filter of the consumer (the Watermill topic)
	durable string // the durable consumer's name, also its queue group
}

// subscribers is the number of queue subscriptions on the push consumer,
// the bridge's concurrency (each holds one message until its POST ends).
const subscribers = 64

// run is the bridge: it delivers until ctx ends, calling ready once the
// router runs.
func run(ctx context.Context, c config, logger watermill.LoggerAdapter, ready func()) error {
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              c.natsURL,
		QueueGroupPrefix: c.durable,
		SubscribersCount: subscribers,
		AckWaitTimeout:   30 * time.Second,
		Unmarshaler:      &wmnats.NATSMarshaler{},
		JetStream: wmnats.JetStreamConfig{
			AckAsync:      true,
			DurablePrefix: c.durable,
			SubscribeOptions: []nats.SubOpt{
				nats.DeliverAll(),
				nats.AckExplicit(),
				nats.AckWait(30 * time.Second),
				nats.MaxAckPending(1024),
			},
		},
	}, logger)
	if err != nil {
		return err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = subscribers
	pub, err := wmhttp.NewPublisher(wmhttp.PublisherConfig{
		MarshalMessageFunc: wmhttp.DefaultMarshalMessageFunc,
		Client:             &http.Client{Timeout: 5 * time.Second, Transport: transport},
	}, logger)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond, Logger: logger}.Middleware,
		middleware.Recoverer,
	)
	router.AddNoPublisherHandler("jetstream-to-http", c.subject, sub, func(msg *message.Message) error {
		return pub.Publish(c.dest, msg)
	})
	go func() {
		select {
		case <-router.Running():
			ready()
		case <-ctx.Done():
		}
	}()
	return router.Run(ctx)
}

func main() {
	var c config
	flag.StringVar(&c.natsURL, "nats", nats.DefaultURL, "NATS URL")
	flag.StringVar(&c.dest, "url", "", "destination URL")
	flag.StringVar(&c.subject, "subject", "events.>", "subject of the durable consumer (the stream must exist)")
	flag.StringVar(&c.durable, "durable", "watermill", "durable consumer name and queue group")
	metricsAddr := flag.String("metrics", "", "serve the Go runtime's allocation counters on http://ADDR/metrics (the benchmark's per-event allocations)")
	flag.Parse()
	if c.dest == "" {
		fmt.Fprintln(os.Stderr, "watermill: -url is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *metricsAddr != "" {
		if err := serveAllocMetrics(ctx, *metricsAddr); err != nil {
			fmt.Fprintln(os.Stderr, "watermill:", err)
			os.Exit(1)
		}
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	if err := run(ctx, c, logger, func() { fmt.Println("ready") }); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "watermill:", err)
		os.Exit(1)
	}
}
