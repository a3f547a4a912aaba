-- pgbench's script of the PostgreSQL driver's reserve (drivers/postgres/internal/queue_sql.h: kReserveSql
-- and kNextDueSql, in one round trip as the consumer sends them), on the queue `pgbench` of the
-- schema `pgbench_reserve` that `postgres_bench --mode=fill` filled. The lease is 0 µs, so the
-- leased rows are due again at once, behind the others: the queue never drains, and every
-- transaction reserves :batch rows. Messages/s the server can reserve = tps x :batch.
--   pgbench -n -M prepared -f bench/postgres_reserve.sql -D batch=256 -c 8 -j 8 -T 10 URL
\set owner random(1, 9000000000000000000)
\startpipeline
UPDATE pgbench_reserve.queue_messages m SET attempts = m.attempts + 1, lease_owner = :owner,
  due_at = now() + 0 * interval '1 microsecond'
WHERE m.id = ANY (ARRAY(SELECT id FROM pgbench_reserve.queue_messages
  WHERE queue = 'pgbench' AND due_at <= now()
  ORDER BY due_at, id LIMIT :batch FOR UPDATE SKIP LOCKED))
RETURNING m.id, m.payload, m.attempts;
SELECT (extract(epoch FROM min(due_at) - now()) * 1000000)::bigint
FROM pgbench_reserve.queue_messages WHERE queue = 'pgbench';
\endpipeline
