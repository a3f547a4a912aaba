// Watermill's GoChannel Pub/Sub (github.com/ThreeDotsLabs/watermill/pubsub/gochannel) through a
// message.Router with a no-op handler: the in-process equivalent of our memory driver end to end
// (bench/memory_e2e_bench.cc; method: docs/benchmarks/peers.md).
//
// -msgs messages of a -payload-byte payload and 2 metadata entries are published first (not
// timed) into a persistent GoChannel. GoChannel has no consumer groups (every subscriber gets
// every message), so -concurrency K means K router handlers on K topics of msgs/K messages
// each, the way a consumer group would split one queue. rate = msgs / time from Router.Run
// until msgs messages were acked: a router middleware calls Message.Ack after the handler
// returns (the channel close GoChannel's delivering goroutine waits on; the router's own Ack
// after it is then a no-op), and counts then, not when the handler returns.
//
// Prints one line: peer=watermill-gochannel mode=e2e concurrency=K msgs=N secs=S rate=R
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

func main() {
	msgs := flag.Int("msgs", 1000000, "messages")
	payload := flag.Int("payload", 100, "payload bytes per message")
	concurrency := flag.Int("concurrency", 1, "router handlers (one topic each)")
	flag.Parse()
	k := *concurrency
	n := *msgs / k * k

	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'p'
	}
	for t := 0; t < k; t++ {
		batch := make([]*message.Message, 0, 10000)
		for i := 0; i < n/k; i++ {
			m := message.NewMessage(watermill.NewUUID(), body)
			m.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			m.Metadata.Set("tenant", "eu")
			batch = append(batch, m)
			if len(batch) == cap(batch) || i+1 == n/k {
				if err := pubsub.Publish(fmt.Sprintf("bench-%d", t), batch...); err != nil {
					log.Fatalf("publish: %v", err)
				}
				batch = batch[:0]
			}
		}
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	var acked atomic.Int64
	done := make(chan struct{})
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			if err == nil && m.Ack() && acked.Add(1) == int64(n) {
				close(done)
			}
			return out, err
		}
	})
	for t := 0; t < k; t++ {
		router.AddNoPublisherHandler(fmt.Sprintf("h%d", t), fmt.Sprintf("bench-%d", t), pubsub,
			func(*message.Message) error { return nil })
	}
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	go func() {
		if err := router.Run(ctx); err != nil {
			log.Fatalf("router: %v", err)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		log.Fatalf("timed out after %d of %d messages", acked.Load(), n)
	}
	took := time.Since(start)
	cancel()
	fmt.Printf("peer=watermill-gochannel mode=e2e concurrency=%d msgs=%d secs=%.3f rate=%.0f\n", k,
		n, took.Seconds(), float64(n)/took.Seconds())
}
