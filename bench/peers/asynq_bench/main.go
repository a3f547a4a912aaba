// asynq (github.com/hibiken/asynq) against a redis-server, measured the way bench/redis_bench.cc
// measures the Redis driver (method: docs/benchmarks/peers.md):
//
//	-mode=send: -producers goroutines call Client.Enqueue, one task per call, until -msgs
//	            tasks are enqueued; rate = msgs / time from the first call to the last reply.
//	-mode=e2e:  -msgs tasks are enqueued first (not timed), then a Server with -concurrency
//	            workers and a no-op handler drains the queue; rate = msgs / time from
//	            Server.Start until the broker has settled msgs tasks: the client's hook counts
//	            the replies to asynq's done script (which removes the task from the active list
//	            and deletes it), not the handler's returns.
//
// Prints one line: peer=asynq mode=MODE msgs=N secs=S rate=R, and before it the server's cost
// of the timed phase (serverstats: `server phase=... cpu_us_per_msg=...`).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bus.local/bench/peers/serverstats"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// settleHook counts the successful runs of asynq's done (and mark-as-complete) scripts: those
// that name the queue's processed-total counter among their keys.
type settleHook struct {
	key     string
	settled atomic.Int64
	done    chan struct{}
	want    int64
}

func (h *settleHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *settleHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil || cmd.Err() != nil || h.want == 0 {
			return err
		}
		args := cmd.Args()
		if name, _ := args[0].(string); !strings.HasPrefix(strings.ToLower(name), "eval") {
			return err
		}
		for _, a := range args[1:] {
			if s, _ := a.(string); s == h.key {
				if h.settled.Add(1) == h.want {
					close(h.done)
				}
				break
			}
		}
		return err
	}
}

func (h *settleHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server address")
	mode := flag.String("mode", "e2e", "send or e2e")
	msgs := flag.Int("msgs", 50000, "tasks")
	payload := flag.Int("payload", 100, "payload bytes per task")
	producers := flag.Int("producers", 8, "goroutines calling Enqueue")
	concurrency := flag.Int("concurrency", 8, "Server concurrency (e2e)")
	flag.Parse()

	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	hook := &settleHook{key: "asynq:{default}:processed", done: make(chan struct{})}
	client.AddHook(hook)
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}

	enqueue := func() time.Duration {
		c := asynq.NewClientFromRedisClient(client)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for p := 0; p < *producers; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(*msgs) {
					if _, err := c.Enqueue(asynq.NewTask("bench", body)); err != nil {
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
		before := serverstats.Take(ctx, client)
		took = enqueue()
		serverstats.Print("send", *msgs, before, serverstats.Take(ctx, client))
	case "e2e":
		enqueue()
		hook.want = int64(*msgs)
		srv := asynq.NewServerFromRedisClient(client, asynq.Config{
			Concurrency: *concurrency,
			LogLevel:    asynq.ErrorLevel,
		})
		mux := asynq.NewServeMux()
		mux.HandleFunc("bench", func(context.Context, *asynq.Task) error { return nil })
		before := serverstats.Take(ctx, client)
		start := time.Now()
		if err := srv.Start(mux); err != nil {
			log.Fatalf("server: %v", err)
		}
		select {
		case <-hook.done:
		case <-time.After(10 * time.Minute):
			log.Fatalf("timed out after %d of %d tasks", hook.settled.Load(), *msgs)
		}
		took = time.Since(start)
		serverstats.Print("consume", *msgs, before, serverstats.Take(ctx, client))
		srv.Shutdown()
	default:
		fmt.Fprintf(os.Stderr, "unknown -mode %q\n", *mode)
		os.Exit(2)
	}
	fmt.Printf("peer=asynq mode=%s msgs=%d secs=%.3f rate=%.0f\n", *mode, *msgs,
		took.Seconds(), float64(*msgs)/took.Seconds())
}
