// The RabbitMQ peers of bench/rabbitmq_bench.cc (docs/benchmarks/rabbitmq.md), against the same
// broker and queue type:
//
//	-mode=raw_send       amqp091-go, confirmed single publishes from -producers goroutines
//	                     (a channel each, in confirm mode, one publish waiting for its confirm)
//	-mode=raw_consume    amqp091-go, one consumer with manual acks at -prefetch draining a
//	                     pre-filled queue
//	-mode=watermill_e2e  Watermill's AMQP subscriber (watermill-amqp v3 over amqp091-go) with
//	                     -prefetch, acking each message, draining a pre-filled queue
//
// Each prints `peer=<mode> msgs=N secs=S rate=R cpu_us_per_msg=C broker_cpu_us_per_msg=B`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

var (
	uri       = flag.String("uri", "amqp://guest:guest@127.0.0.1:5672/", "broker")
	mode      = flag.String("mode", "raw_send", "raw_send, raw_consume or watermill_e2e")
	messages  = flag.Int("messages", 20000, "messages")
	producers = flag.Int("producers", 8, "publishing goroutines (raw_send)")
	prefetch  = flag.Int("prefetch", 64, "consumer prefetch")
	payload   = flag.Int("payload", 100, "body bytes")
	queueType = flag.String("queue_type", "quorum", "quorum or classic")
	brokerPid = flag.Int("broker_pid", 0, "the broker's pid, for its CPU")
)

func cpuSeconds() float64 {
	var r syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r)
	return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
}

func pidCPU(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

type phase struct {
	start       time.Time
	cpu, broker float64
}

func begin() phase { return phase{time.Now(), cpuSeconds(), pidCPU(*brokerPid)} }

func (p phase) report(name string, n int) {
	secs := time.Since(p.start).Seconds()
	fmt.Printf("peer=%s msgs=%d secs=%.3f rate=%.0f cpu_us_per_msg=%.1f broker_cpu_us_per_msg=%.1f queue_type=%s\n",
		name, n, secs, float64(n)/secs, (cpuSeconds()-p.cpu)*1e6/float64(n),
		(pidCPU(*brokerPid)-p.broker)*1e6/float64(n), *queueType)
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func declare(ch *amqp.Channel, q string) {
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": *queueType})
	must(err)
}

// fill publishes n messages to q with confirms, pipelined (not timed).
func fill(conn *amqp.Connection, q string, n int) {
	ch, err := conn.Channel()
	must(err)
	defer ch.Close()
	declare(ch, q)
	must(ch.Confirm(false))
	body := make([]byte, *payload)
	var confs []*amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		c, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, true, false,
			amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
		must(err)
		confs = append(confs, c)
	}
	for _, c := range confs {
		if !c.Wait() {
			must(fmt.Errorf("nacked"))
		}
	}
}

func rawSend(conn *amqp.Connection) {
	q := fmt.Sprintf("peer-send-%d", os.Getpid())
	ch, err := conn.Channel()
	must(err)
	declare(ch, q)
	var next int64
	var wg sync.WaitGroup
	body := make([]byte, *payload)
	p := begin()
	for g := 0; g < *producers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := conn.Channel()
			must(err)
			must(c.Confirm(false))
			for atomic.AddInt64(&next, 1) <= int64(*messages) {
				dc, err := c.PublishWithDeferredConfirmWithContext(context.Background(), "", q, true,
					false, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: body})
				must(err)
				if !dc.Wait() {
					must(fmt.Errorf("nacked"))
				}
			}
		}()
	}
	wg.Wait()
	p.report("raw_send", *messages)
	ch.QueueDelete(q, false, false, false)
}

func rawConsume(conn *amqp.Connection) {
	q := fmt.Sprintf("peer-consume-%d", os.Getpid())
	fill(conn, q, *messages)
	ch, err := conn.Channel()
	must(err)
	must(ch.Qos(*prefetch, 0, false))
	p := begin()
	ds, err := ch.Consume(q, "", false, false, false, false, nil)
	must(err)
	for i := 0; i < *messages; i++ {
		d := <-ds
		must(d.Ack(false))
	}
	p.report("raw_consume", *messages)
	ch.QueueDelete(q, false, false, false)
}

func watermillE2E(conn *amqp.Connection) {
	topic := fmt.Sprintf("peer-watermill-%d", os.Getpid())
	fill(conn, topic, *messages)
	cfg := wamqp.NewDurableQueueConfig(*uri)
	cfg.Queue.Arguments = amqp.Table{"x-queue-type": *queueType}
	cfg.Consume.Qos.PrefetchCount = *prefetch
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	must(err)
	p := begin()
	msgs, err := sub.Subscribe(context.Background(), topic)
	must(err)
	for i := 0; i < *messages; i++ {
		m := <-msgs
		m.Ack()
	}
	p.report("watermill_e2e", *messages)
	sub.Close()
}

func main() {
	flag.Parse()
	conn, err := amqp.Dial(*uri)
	must(err)
	defer conn.Close()
	switch *mode {
	case "raw_send":
		rawSend(conn)
	case "raw_consume":
		rawConsume(conn)
	case "watermill_e2e":
		watermillE2E(conn)
	default:
		must(fmt.Errorf("unknown -mode %q", *mode))
	}
}
