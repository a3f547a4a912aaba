// BullMQ (npm bullmq, pinned in package.json / package-lock.json) against a redis-server,
// measured the way bench/redis_bench.cc measures the Redis driver (method:
// docs/benchmarks/peers.md):
//
//   --mode=e2e:  --msgs jobs are added first with Queue.addBulk (1,000 a call; not timed), then a
//                Worker at its defaults with --concurrency and a no-op processor drains the
//                queue; rate = msgs / time from creating the Worker until msgs jobs are settled
//                at the broker: the Worker's 'completed' event, which it emits after its
//                moveToFinished script has run (not when the processor returns).
//   --mode=send: --producers async callers each await Queue.add, one job per call, until --msgs
//                jobs are added; rate = msgs / time from the first call to the last reply.
//
// Prints the server's cost of the timed phase (`server phase=... cpu_us_per_msg=...`, as
// bench/peers/serverstats does), this process's CPU over it (`client cpu_us_per_msg=...`,
// process.cpuUsage: user + system) and then one line: peer=bullmq mode=MODE msgs=N secs=S
// rate=R.
//
//   node bench/peers/bullmq_bench/main.js --addr=127.0.0.1:6379 --mode=e2e --msgs=50000
'use strict';

const { Queue, Worker } = require('bullmq');
const IORedis = require('ioredis');

function flags() {
  const f = { addr: '127.0.0.1:6379', mode: 'e2e', msgs: 50000, payload: 100, producers: 8,
    concurrency: 8 };
  for (const arg of process.argv.slice(2)) {
    const m = /^--?([a-z]+)=(.*)$/.exec(arg);
    if (!m || !(m[1] in f)) {
      console.error(`unknown flag ${arg}`);
      process.exit(2);
    }
    f[m[1]] = typeof f[m[1]] === 'number' ? Number(m[2]) : m[2];
  }
  return f;
}

// INFO cpu and commandstats, as in bench/peers/serverstats/serverstats.go.
async function snapshot(redis) {
  const text = await redis.call('INFO', 'cpu', 'commandstats');
  const s = { at: process.hrtime.bigint(), cpu: 0, calls: new Map() };
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    const at = line.indexOf(':');
    if (at < 0) continue;
    const key = line.slice(0, at);
    const value = line.slice(at + 1);
    if (key === 'used_cpu_user' || key === 'used_cpu_sys') {
      s.cpu += Number(value);
    } else if (key.startsWith('cmdstat_')) {
      const calls = /^calls=(\d+)/.exec(value);
      if (calls) s.calls.set(key.slice('cmdstat_'.length), Number(calls[1]));
    }
  }
  return s;
}

const SCRIPTS = new Set(['eval', 'evalsha', 'eval_ro', 'evalsha_ro', 'fcall', 'fcall_ro']);

function printClient(msgs, before) {
  const used = process.cpuUsage(before);
  const secs = (used.user + used.system) / 1e6;
  console.log(`client cpu_s=${secs.toFixed(3)} cpu_us_per_msg=${(secs * 1e6 / msgs).toFixed(1)}`);
}

function printPhase(phase, msgs, before, after) {
  const secs = Number(after.at - before.at) / 1e9;
  const cpu = after.cpu - before.cpu;
  let cmds = 0;
  let scripts = 0;
  const all = [];
  for (const [name, n] of after.calls) {
    const d = n - (before.calls.get(name) || 0);
    if (d <= 0 || name === 'info') continue;
    if (SCRIPTS.has(name)) scripts += d; else cmds += d;
    all.push([name, d]);
  }
  all.sort((a, b) => (b[1] - a[1]) || (a[0] < b[0] ? -1 : 1));
  const top = all.slice(0, 10).map(([name, d]) => `${name}:${(d / msgs).toFixed(2)}`);
  console.log(`server phase=${phase} msgs=${msgs} secs=${secs.toFixed(3)} cpu_s=${cpu.toFixed(3)} ` +
    `cpu_us_per_msg=${(cpu * 1e6 / msgs).toFixed(1)} busy=${(cpu / secs).toFixed(2)} ` +
    `cmds_per_msg=${(cmds / msgs).toFixed(2)} scripts_per_msg=${(scripts / msgs).toFixed(3)} ` +
    `top=${top.join(',')}`);
}

async function main() {
  const f = flags();
  const [host, port] = f.addr.split(':');
  const connection = { host, port: Number(port) };
  const info = new IORedis(connection);
  const queue = new Queue('bench', { connection });
  const body = 'x'.repeat(f.payload);
  let secs;
  if (f.mode === 'send') {
    const before = await snapshot(info);
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    let next = 0;
    const caller = async () => {
      while (next++ < f.msgs) await queue.add('bench', body);
    };
    await Promise.all(Array.from({ length: f.producers }, caller));
    secs = Number(process.hrtime.bigint() - start) / 1e9;
    printPhase('send', f.msgs, before, await snapshot(info));
    printClient(f.msgs, cpu);
  } else if (f.mode === 'e2e') {
    for (let at = 0; at < f.msgs; at += 1000) {
      const n = Math.min(1000, f.msgs - at);
      await queue.addBulk(Array.from({ length: n }, () => ({ name: 'bench', data: body })));
    }
    const before = await snapshot(info);
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    let settled = 0;
    let worker;
    await new Promise((resolve, reject) => {
      worker = new Worker('bench', async () => {}, { connection, concurrency: f.concurrency });
      worker.on('completed', () => {
        if (++settled === f.msgs) resolve();
      });
      worker.on('error', reject);
      setTimeout(() => reject(new Error(`timed out after ${settled} of ${f.msgs} jobs`)),
        10 * 60 * 1000).unref();
    });
    secs = Number(process.hrtime.bigint() - start) / 1e9;
    printPhase('consume', f.msgs, before, await snapshot(info));
    printClient(f.msgs, cpu);
    await worker.close();
  } else {
    console.error(`unknown --mode ${f.mode}`);
    process.exit(2);
  }
  console.log(`peer=bullmq mode=${f.mode} msgs=${f.msgs} secs=${secs.toFixed(3)} ` +
    `rate=${(f.msgs / secs).toFixed(0)}`);
  await queue.close();
  await info.quit();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
