// River (github.com/riverqueue/river, pgx v5 driver) against a PostgreSQL server, measured the
// way bench/postgres_bench.cc measures our PostgreSQL driver (method:
// docs/benchmarks/postgres.md):
//
//	-mode=e2e:   -msgs jobs are inserted first with InsertMany (-batch per call, not timed), then
//	             a Client with one queue of -workers workers (River's documented 100) and a no-op
//	             worker runs them (-fetch_cooldown: River's FetchCooldown, 100 ms by default: a
//	             producer fetches at most once per cooldown, at most its free workers' worth); rate = msgs / time from Client.Start until all msgs rows are
//	             in state completed (River records completions in batches, after the worker).
//	-mode=send:  -producers goroutines call Client.Insert, one job per call, until -msgs jobs
//	             are inserted; rate = msgs / time from the first call to the last reply.
//	-mode=batch: the same with InsertMany of -batch jobs per call.
//
// River's tables are migrated up first (rivermigrate; idempotent) and river_job is emptied
// before the run. Prints one line: peer=river mode=MODE msgs=N secs=S rate=R
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type benchArgs struct {
	Payload string `json:"p"`
}

func (benchArgs) Kind() string { return "bench" }

type noopWorker struct {
	river.WorkerDefaults[benchArgs]
	ran  *atomic.Int64
	want int64
	done chan struct{}
}

func (w *noopWorker) Work(context.Context, *river.Job[benchArgs]) error {
	if w.ran.Add(1) == w.want {
		close(w.done)
	}
	return nil
}

func main() {
	url := flag.String("url", "", "PostgreSQL URL (postgres://user:password@host:port/db)")
	mode := flag.String("mode", "e2e", "e2e, send or batch")
	msgs := flag.Int("msgs", 20000, "jobs")
	payload := flag.Int("payload", 100, "payload bytes per job")
	producers := flag.Int("producers", 8, "goroutines inserting (send, batch)")
	batch := flag.Int("batch", 500, "jobs per InsertMany call (e2e pre-fill, batch)")
	workers := flag.Int("workers", 100, "MaxWorkers of the queue (e2e)")
	cooldown := flag.Duration("fetch_cooldown", 0, "Config.FetchCooldown (e2e); 0: River's 100ms")
	flag.Parse()
	if *url == "" {
		log.Fatal("-url is required")
	}

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, *url)
	if err != nil {
		log.Fatalf("pool: %v", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatalf("migrator: %v", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatalf("migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		log.Fatalf("truncate: %v", err)
	}

	body := make([]byte, *payload)
	for i := range body {
		body[i] = 'x'
	}
	args := benchArgs{Payload: string(body)}
	var ran atomic.Int64
	worker := &noopWorker{ran: &ran, want: int64(*msgs), done: make(chan struct{})}
	workersReg := river.NewWorkers()
	river.AddWorker(workersReg, worker)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// An insert-only client (no queues): for the inserts of every mode.
	inserter, err := river.NewClient(driver, &river.Config{Workers: workersReg, Logger: quiet})
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	many := func(n int) []river.InsertManyParams {
		p := make([]river.InsertManyParams, n)
		for i := range p {
			p[i] = river.InsertManyParams{Args: args}
		}
		return p
	}
	// Inserts msgs jobs from `goroutines` goroutines, `per` jobs per call (1: Insert).
	insert := func(goroutines, per int) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					end := next.Add(int64(per))
					n := per
					if end > int64(*msgs) {
						n = *msgs - int(end-int64(per))
					}
					if n <= 0 {
						return
					}
					var err error
					if per == 1 {
						_, err = inserter.Insert(ctx, args, nil)
					} else {
						_, err = inserter.InsertMany(ctx, many(n))
					}
					if err != nil {
						log.Fatalf("insert: %v", err)
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
		took = insert(*producers, 1)
	case "batch":
		took = insert(*producers, *batch)
	case "e2e":
		insert(1, *batch)
		client, err := river.NewClient(driver, &river.Config{
			FetchCooldown: *cooldown,
			Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: *workers}},
			Workers:       workersReg,
			Logger:        quiet,
		})
		if err != nil {
			log.Fatalf("client: %v", err)
		}
		start := time.Now()
		if err := client.Start(ctx); err != nil {
			log.Fatalf("start: %v", err)
		}
		<-worker.done
		// The worker ran every job; River completes them in batches after that.
		for {
			var completed int64
			if err := pool.QueryRow(ctx,
				"SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&completed); err != nil {
				log.Fatalf("count: %v", err)
			}
			if completed == int64(*msgs) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		took = time.Since(start)
		if err := client.Stop(ctx); err != nil {
			log.Fatalf("stop: %v", err)
		}
	default:
		log.Fatalf("unknown -mode %q", *mode)
	}
	fmt.Printf("peer=river mode=%s msgs=%d secs=%.3f rate=%.0f\n", *mode, *msgs, took.Seconds(),
		float64(*msgs)/took.Seconds())
}
