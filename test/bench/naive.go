package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// runNaive is the "_naive" role: the reference bridge the issue compares
// jetbridge with, what one writes in an afternoon. A durable consumer read
// with Consume, K goroutines, each POSTing the raw body and acking on 2xx,
// naking (immediate redelivery) otherwise. No envelope, no breaker, no
// retries, no metrics, no dead letters. It prints "ready" once consuming.
func runNaive(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("_naive", flag.ContinueOnError)
	natsURL := fs.String("nats", "", "NATS URL")
	dest := fs.String("url", "", "destination URL")
	k := fs.Int("k", 64, "concurrent requests")
	stream := fs.String("stream", "EVENTS", "stream")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *k < 1 {
		return fmt.Errorf("_naive: -k must be at least 1")
	}
	nc, err := nats.Connect(*natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, *stream, jetstream.ConsumerConfig{
		Durable:   "naive",
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   30 * time.Second,
	})
	if err != nil {
		return err
	}
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{MaxIdleConns: *k, MaxIdleConnsPerHost: *k, IdleConnTimeout: time.Minute},
	}

	msgs := make(chan jetstream.Msg)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	for range *k {
		wg.Go(func() {
			for {
				select {
				case m := <-msgs:
					if post(ctx, client, *dest, m.Data()) {
						_ = m.Ack()
					} else {
						_ = m.Nak()
					}
				case <-ctx.Done():
					return
				}
			}
		})
	}
	fmt.Println("ready")
	<-ctx.Done()
	cc.Stop()
	wg.Wait()
	return nil
}

// post sends body and reports whether the destination answered 2xx.
func post(ctx context.Context, c *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode/100 == 2
}
