// Watermill's Redis Streams Pub/Sub (github.com/ThreeDotsLabs/watermill-redisstream) against a
// redis-server, measured the way bench/redis_bench.cc measures the Redis driver end to end
// (method: docs/benchmarks/peers.md).
//
// -msgs messages of a -payload-byte payload are published first (not timed) from 8
// goroutines, one Publish per message. Then -subscribers Subscribers (one consumer group,
// a consumer name each, one shared go-redis client) each Subscribe to the stream, and a
// goroutine per subscription runs a no-op handler and Acks; rate = msgs / time from the first
// Subscribe until the broker has settled msgs messages: the client's hook adds up the replies to
// the subscribers' XACKs (message.Ack only hands the message back to the subscriber, which
// sends the XACK after it).
//
// Prints one line: peer=watermill-redisstream mode=e2e subscribers=K msgs=N secs=S rate=R, and
// before it the server's cost of the consume phase (serverstats: `server phase=consume ...`).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bus.local/bench/peers/serverstats"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// ackHook adds up the messages the server acknowledged (the integer replies to XACK).
type ackHook struct {
	acked atomic.Int64
	done  chan struct{}
	want  int64
}

func (h *ackHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *ackHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || !strings.EqualFold(cmd.Name(), "xack") {
			return err
		}
		if n, e := cmd.(*redis.IntCmd).Result(); e == nil && n > 0 {
			if h.acked.Add(n) == h.want {
				close(h.done)
			}
		}
		return err
	}
}

func (h *ackHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server address")
	msgs := flag.Int("msgs", 50000, "messages")
	payload := flag.Int("payload", 100, "payload bytes per message")
	subscribers := flag.Int("subscribers", 8, "subscribers (consumers of one group)")
	flag.Parse()
	const topic = "bench-watermill"

	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	hook := &ackHook{done: make(chan struct{}), want: int64(*msgs)}
	client.AddHook(hook)
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

	ctx, cancel := context.WithCancel(context.Background())
	before := serverstats.Take(ctx, client)
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
			}
		}()
	}
	select {
	case <-hook.done:
	case <-time.After(10 * time.Minute):
		log.Fatalf("timed out after %d of %d messages", hook.acked.Load(), *msgs)
	}
	took := time.Since(start)
	serverstats.Print("consume", *msgs, before, serverstats.Take(ctx, client))
	cancel()
	fmt.Printf("peer=watermill-redisstream mode=e2e subscribers=%d msgs=%d secs=%.3f rate=%.0f\n",
		*subscribers, *msgs, took.Seconds(), float64(*msgs)/took.Seconds())
}
