// asynq (github.com/hibiken/asynq) against a redis-server, measured the way bench/redis_bench.cc
// measures the Redis driver (method: docs/benchmarks/peers.md):
//
//	-mode=send: -producers goroutines call Client.Enqueue, one task per call, until -msgs
//	            tasks are enqueued; rate = msgs / time from the first call to the last reply.
//	-mode=e2e:  -msgs tasks are enqueued first (not timed), then a Server with -concurrency
//	            workers and a no-op handler drains the queue; rate = msgs / time from
//	            Server.Start until the handler has run msgs times.
//
// Prints one line: peer=asynq mode=MODE msgs=N secs=S rate=R
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server address")
	mode := flag.String("mode", "e2e", "send or e2e")
	msgs := flag.Int("msgs", 50000, "tasks")
	payload := flag.Int("payload", 100, "payload bytes per task")
	producers := flag.Int("producers", 8, "goroutines calling Enqueue")
	concurrency := flag.Int("concurrency", 8, "Server concurrency (e2e)")
	flag.Parse()

	redisOpt := asynq.RedisClientOpt{Addr: *addr}
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}

	enqueue := func() time.Duration {
		client := asynq.NewClient(redisOpt)
		defer client.Close()
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for p := 0; p < *producers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(*msgs) {
					if _, err := client.Enqueue(asynq.NewTask("bench", body)); err != nil {
						log.Fatalf("enqueue: %v", err)
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}

	var took time.Duration
	switch *mode {
	case "send":
		took = enqueue()
	case "e2e":
		enqueue()
		var handled atomic.Int64
		done := make(chan struct{})
		srv := asynq.NewServer(redisOpt, asynq.Config{
			Concurrency: *concurrency,
			LogLevel:    asynq.ErrorLevel,
		})
		mux := asynq.NewServeMux()
		mux.HandleFunc("bench", func(context.Context, *asynq.Task) error {
			if handled.Add(1) == int64(*msgs) {
				close(done)
			}
			return nil
		})
		start := time.Now()
		if err := srv.Start(mux); err != nil {
			log.Fatalf("server: %v", err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Minute):
			log.Fatalf("timed out after %d of %d tasks", handled.Load(), *msgs)
		}
		took = time.Since(start)
		srv.Shutdown()
	default:
		fmt.Fprintf(os.Stderr, "unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	fmt.Printf("peer=asynq mode=%s msgs=%d secs=%.3f rate=%.0f\n", *mode, *msgs,
		took.Seconds(), float64(*msgs)/took.Seconds())
}
