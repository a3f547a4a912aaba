// Watermill's Redis Streams Pub/Sub (github.com/ThreeDotsLabs/watermill-redisstream) against a
// redis-server, measured the way bench/redis_bench.cc measures the Redis driver end to end
// (method: docs/benchmarks/peers.md).
//
// -msgs messages of a -payload-byte payload are published first (not timed) from 8
// goroutines, one Publish per message. Then -subscribers Subscribers (one consumer group,
// a consumer name each, one shared go-redis client) each Subscribe to the stream, and a
// goroutine per subscription runs a no-op handler and Acks; rate = msgs / time from the first
// Subscribe until msgs messages were acked.
//
// Prints one line: peer=watermill-redisstream mode=e2e subscribers=K msgs=N secs=S rate=R
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server address")
	msgs := flag.Int("msgs", 50000, "messages")
	payload := flag.Int("payload", 100, "payload bytes per message")
	subscribers := flag.Int("subscribers", 8, "subscribers (consumers of one group)")
	flag.Parse()
	const topic = "bench-watermill"

	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	logger := watermill.NopLogger{}
	publisher, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: client}, logger)
	if err != nil {
		log.Fatal(err)
	}
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(*msgs) {
				if err := publisher.Publish(topic, message.NewMessage(watermill.NewUUID(), body)); err != nil {
					log.Fatalf("publish: %v", err)
				}
			}
		}()
	}
	wg.Wait()

	var handled atomic.Int64
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	for s := 0; s < *subscribers; s++ {
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:        client,
			ConsumerGroup: "bench",
			Consumer:      fmt.Sprintf("c%d", s),
		}, logger)
		if err != nil {
			log.Fatal(err)
		}
		ch, err := sub.Subscribe(ctx, topic)
		if err != nil {
			log.Fatalf("subscribe: %v", err)
		}
		go func() {
			for m := range ch {
				m.Ack()
				if handled.Add(1) == int64(*msgs) {
					close(done)
				}
			}
		}()
	}
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		log.Fatalf("timed out after %d of %d messages", handled.Load(), *msgs)
	}
	took := time.Since(start)
	cancel()
	fmt.Printf("peer=watermill-redisstream mode=e2e subscribers=%d msgs=%d secs=%.3f rate=%.0f\n",
		*subscribers, *msgs, took.Seconds(), float64(*msgs)/took.Seconds())
}
