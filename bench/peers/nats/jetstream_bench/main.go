// The Go peer of the NATS driver's end-to-end benchmark (docs/benchmarks/nats.md): plain
// nats.go JetStream (the jetstream package), a durable pull consumer with explicit acks, as a
// NATS user would write a worker pool.
//
// -msgs messages of a -payload-byte payload are published first (not timed), 1000 async
// publishes in flight, each awaited. Then -workers goroutines each Fetch up to -batch messages
// at a time from one durable consumer and ack every message: -ack=sync waits for the server's
// answer to each ack (AckSync, what the driver does), -ack=async does not (Ack). rate = msgs /
// time from the first Fetch until every ack was sent (sync: answered).
//
// Prints one line: peer=nats.go mode=e2e workers=W batch=B ack=A msgs=N secs=S rate=R.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	url := flag.String("url", nats.DefaultURL, "nats-server URL")
	msgs := flag.Int("msgs", 100000, "messages")
	payload := flag.Int("payload", 100, "payload bytes per message")
	workers := flag.Int("workers", 8, "worker goroutines fetching and acking")
	batch := flag.Int("batch", 64, "messages per Fetch")
	ack := flag.String("ack", "sync", "sync (AckSync) or async (Ack)")
	flag.Parse()

	nc, err := nats.Connect(*url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	name := fmt.Sprintf("GOBENCH%d", time.Now().UnixNano())
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{name + ".>"}, Retention: jetstream.InterestPolicy,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer js.DeleteStream(ctx, name)
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "work", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}
	subject := name + ".q"
	for sent := 0; sent < *msgs; {
		n := min(1000, *msgs-sent)
		futures := make([]jetstream.PubAckFuture, 0, n)
		for i := 0; i < n; i++ {
			f, err := js.PublishAsync(subject, body)
			if err != nil {
				log.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				log.Fatal(err)
			}
		}
		sent += n
	}

	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < int64(*msgs) {
				batchMsgs, err := cons.Fetch(*batch, jetstream.FetchMaxWait(200*time.Millisecond))
				if err != nil {
					log.Fatal(err)
				}
				for m := range batchMsgs.Messages() {
					if *ack == "sync" {
						err = m.DoubleAck(ctx)
					} else {
						err = m.Ack()
					}
					if err != nil {
						log.Fatal(err)
					}
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if *ack != "sync" {
		nc.Flush()
	}
	secs := time.Since(start).Seconds()
	fmt.Printf("peer=nats.go mode=e2e workers=%d batch=%d ack=%s msgs=%d secs=%.3f rate=%.0f\n",
		*workers, *batch, *ack, *msgs, secs, float64(*msgs)/secs)
}
