// Watermill's Kafka Pub/Sub (github.com/ThreeDotsLabs/watermill-kafka/v3, over IBM/sarama) at its
// defaults against one Kafka broker, measured the way bench/kafka_bench.cc measures the Kafka
// driver end to end (docs/benchmarks/kafka.md).
//
// -msgs messages of a -payload-byte payload are published first (not timed) from 8 goroutines,
// one Publish per message (sarama's sync producer, acks=all as Watermill sets it). Then one
// Subscriber (a consumer group) drains the topic with a no-op handler that Acks; rate = msgs /
// time from Subscribe until msgs messages were acked.
//
// Prints: peer=watermill-kafka mode=e2e msgs=N secs=S rate=R, and the publish rate.
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

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:9092", "comma-separated brokers")
	msgs := flag.Int("msgs", 50000, "messages")
	payload := flag.Int("payload", 100, "payload bytes per message")
	flag.Parse()
	topic := fmt.Sprintf("bench-watermill-%d", time.Now().UnixNano())
	logger := watermill.NopLogger{}
	addrs := strings.Split(*brokers, ",")

	publisher, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:   addrs,
		Marshaler: kafka.DefaultMarshaler{},
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	pubStart := time.Now()
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
	pubSecs := time.Since(pubStart).Seconds()
	fmt.Printf("peer=watermill-kafka mode=publish msgs=%d secs=%.3f rate=%.0f\n", *msgs, pubSecs,
		float64(*msgs)/pubSecs)

	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:       addrs,
		Unmarshaler:   kafka.DefaultMarshaler{},
		ConsumerGroup: "bench",
		OverwriteSaramaConfig: func() *sarama.Config {
			c := kafka.DefaultSaramaSubscriberConfig()
			c.Consumer.Offsets.Initial = sarama.OffsetOldest
			return c
		}(),
	}, logger)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		log.Fatalf("subscribe: %v", err)
	}
	for n := 0; n < *msgs; n++ {
		m := <-ch
		m.Ack()
	}
	secs := time.Since(start).Seconds()
	fmt.Printf("peer=watermill-kafka mode=e2e msgs=%d secs=%.3f rate=%.0f\n", *msgs, secs,
		float64(*msgs)/secs)
}
