// A prototype of a stream-based data model for the Redis driver, measured for its server work: queues
// as a Redis stream with a consumer group (the group's pending list gives each delivery its
// lease owner, idle time and delivery count), with this library's idempotency keys beside it
// (SET NX PX per message to acquire, the store's mark-done-many script, read from its C++ source,
// to mark done; run it from the repository root or give -store_source). It is not
// a driver: no delays, no lease recovery, no topics; the steady-state commands of a consumer are
// what it runs, so its `server phase=consume` line is the server's work such a driver would pay
// per message at least (docs/benchmarks/redis.md, "Server work per message").
//
// -msgs messages of -payload bytes are added first (not timed, pipelined XADD). Then -consumers
// goroutines (one consumer name each, one shared go-redis client) loop: XREADGROUP COUNT
// -batch; the batch's keys acquired with pipelined SET NX PX; the mark-done-many script; XACK and
// XDEL of the batch in one pipeline. rate = msgs / time until every message was XDELed.
//
// Prints `server phase=consume ...` (serverstats) and one line:
// peer=stream-model mode=e2e consumers=K batch=B msgs=N secs=S rate=R.
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
	"github.com/redis/go-redis/v9"
)

// The store's own mark-done-many script: kMarkDoneMany's Lua in the C++ source at `path`.
func markDoneManyScript(path string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%v (run from the repository root, or give -store_source)", err)
	}
	const open, end = `kMarkDoneMany[] = R"lua(`, `)lua"`
	s := string(src)
	i := strings.Index(s, open)
	if i < 0 {
		return "", fmt.Errorf("%s: no kMarkDoneMany script", path)
	}
	s = s[i+len(open):]
	j := strings.Index(s, end)
	if j < 0 {
		return "", fmt.Errorf("%s: kMarkDoneMany is not closed", path)
	}
	return s[:j], nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server host:port")
	msgs := flag.Int("msgs", 50000, "messages")
	payload := flag.Int("payload", 100, "payload bytes")
	consumers := flag.Int("consumers", 8, "consumer goroutines")
	batch := flag.Int("batch", 64, "XREADGROUP COUNT")
	storeSource := flag.String("store_source", "idempotency/redis/redis_idempotency_store.cc",
		"the Redis idempotency store's source, whose mark-done-many script is run")
	flag.Parse()
	markDoneMany, err := markDoneManyScript(*storeSource)
	if err != nil {
		log.Fatalf("mark-done script: %v", err)
	}

	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 2 * *consumers})
	defer client.Close()
	const stream, group = "sm:{orders}:stream", "workers"
	client.Del(ctx, stream)
	body := strings.Repeat("x", *payload)
	for sent := 0; sent < *msgs; {
		p := client.Pipeline()
		for i := 0; i < 1000 && sent < *msgs; i++ {
			p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"m", body}})
			sent++
		}
		if _, err := p.Exec(ctx); err != nil {
			log.Fatalf("fill: %v", err)
		}
	}
	if err := client.XGroupCreate(ctx, stream, group, "0").Err(); err != nil {
		log.Fatalf("group: %v", err)
	}
	script := redis.NewScript(markDoneMany)
	if err := script.Load(ctx, client).Err(); err != nil {
		log.Fatalf("script: %v", err)
	}

	var done atomic.Int64
	finished := make(chan struct{})
	var finish sync.Once
	before := serverstats.Take(ctx, client)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < *consumers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			name := fmt.Sprintf("c%d", c)
			owner := 0
			for done.Load() < int64(*msgs) {
				res, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
					Group: group, Consumer: name, Streams: []string{stream, ">"},
					Count: int64(*batch), Block: 50 * time.Millisecond,
				}).Result()
				if err == redis.Nil {
					continue
				}
				if err != nil {
					log.Fatalf("xreadgroup: %v", err)
				}
				entries := res[0].Messages
				keys := make([]string, len(entries))
				args := make([]any, 0, len(entries)+1)
				args = append(args, 86400000)
				ids := make([]string, len(entries))
				acquire := client.Pipeline()
				for i, e := range entries {
					owner++
					ids[i] = e.ID
					keys[i] = "bus:idem:{orders." + e.ID + "}"
					o := fmt.Sprintf("%s-%d", name, owner)
					args = append(args, o)
					acquire.SetArgs(ctx, keys[i], "held:"+o, redis.SetArgs{Mode: "NX", TTL: 15 * time.Second})
				}
				if _, err := acquire.Exec(ctx); err != nil {
					log.Fatalf("acquire: %v", err)
				}
				// The handler would run here.
				if err := script.EvalSha(ctx, client, keys, args...).Err(); err != nil {
					log.Fatalf("mark done: %v", err)
				}
				settle := client.Pipeline()
				settle.XAck(ctx, stream, group, ids...)
				del := settle.XDel(ctx, stream, ids...)
				if _, err := settle.Exec(ctx); err != nil {
					log.Fatalf("settle: %v", err)
				}
				if done.Add(del.Val()) >= int64(*msgs) {
					finish.Do(func() { close(finished) })
				}
			}
		}(c)
	}
	<-finished
	took := time.Since(start)
	serverstats.Print("consume", *msgs, before, serverstats.Take(ctx, client))
	wg.Wait()
	fmt.Printf("peer=stream-model mode=e2e consumers=%d batch=%d msgs=%d secs=%.3f rate=%.0f\n",
		*consumers, *batch, *msgs, took.Seconds(), float64(*msgs)/took.Seconds())
}
