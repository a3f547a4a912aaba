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
// With -server_work, first the server's work per message in the consume phase, as
// bench/redis_bench.cc prints it (INFO cpu, stats and commandstats before and after).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sort"
	"strconv"
	"strings"
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
	serverWork := flag.Bool("server_work", false, "print the server's work per message in the consume phase")
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

	var before serverStats
	if *serverWork {
		before = readServerStats(client)
	}
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
	if *serverWork {
		printServerWork(before, readServerStats(client), *msgs)
	}
	cancel()
	fmt.Printf("peer=watermill-redisstream mode=e2e subscribers=%d msgs=%d secs=%.3f rate=%.0f\n",
		*subscribers, *msgs, took.Seconds(), float64(*msgs)/took.Seconds())
}

// What redis-server reports of its own work (see ServerWork in bench/redis_bench.cc).
type serverStats struct {
	cpuSecs       float64
	reads, writes int64
	calls, usec   map[string]int64
}

func readServerStats(client *redis.Client) serverStats {
	info, err := client.Info(context.Background(), "cpu", "stats", "commandstats").Result()
	if err != nil {
		log.Fatalf("info: %v", err)
	}
	st := serverStats{calls: map[string]int64{}, usec: map[string]int64{}}
	for _, line := range strings.Split(info, "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case name == "used_cpu_sys" || name == "used_cpu_user":
			d, _ := strconv.ParseFloat(value, 64)
			st.cpuSecs += d
		case name == "total_reads_processed":
			st.reads, _ = strconv.ParseInt(value, 10, 64)
		case name == "total_writes_processed":
			st.writes, _ = strconv.ParseInt(value, 10, 64)
		case strings.HasPrefix(name, "cmdstat_"):
			cmd := strings.TrimPrefix(name, "cmdstat_")
			for _, field := range strings.Split(value, ",") {
				k, v, _ := strings.Cut(field, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				if k == "calls" {
					st.calls[cmd] = n
				} else if k == "usec" {
					st.usec[cmd] = n
				}
			}
		}
	}
	return st
}

func printServerWork(before, after serverStats, msgs int) {
	n := float64(msgs)
	fmt.Printf("server work per message (consume phase): cpu_us=%.1f reads=%.3f writes=%.3f (%d messages)\n",
		(after.cpuSecs-before.cpuSecs)*1e6/n, float64(after.reads-before.reads)/n,
		float64(after.writes-before.writes)/n, msgs)
	names := make([]string, 0, len(after.calls))
	for name := range after.calls {
		names = append(names, name)
	}
	sort.Strings(names)
	total := 0.0
	for _, name := range names {
		calls := after.calls[name] - before.calls[name]
		if calls <= 0 || name == "info" {
			continue
		}
		total += float64(calls)
		fmt.Printf("  %-12s calls/msg=%.3f  usec/msg=%.2f\n", name, float64(calls)/n,
			float64(after.usec[name]-before.usec[name])/n)
	}
	fmt.Printf("  commands/msg (not counting script calls)=%.2f\n", total/n)
}
