'use strict';
// Tests of rlock.js against a real server with the module: `node --test test.js`
// (make test runs it when node is installed). RLOCK_SERVER names the server
// binary (default redis-server), RLOCK_MODULE the module.

const { test, before, after, beforeEach } = require('node:test');
const assert = require('node:assert');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const Redis = require('ioredis');
const { Lock } = require('./rlock');

const MODULE =
  process.env.RLOCK_MODULE || path.join(__dirname, '..', '..', 'target', 'release', 'librlock.so');
const SERVER = process.env.RLOCK_SERVER || 'redis-server';

let server;
let port;
let dir;
let admin;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => resolve(p));
    });
    s.on('error', reject);
  });
}

async function waitFor(cond, limitMs = 5000) {
  const end = Date.now() + limitMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`condition not met within ${limitMs} ms`);
    await sleep(5);
  }
}

async function stat(name) {
  const info = await admin.info('rlock');
  const m = info.match(new RegExp(`rlock_${name}:(\\d+)`));
  return Number(m[1]);
}

function client() {
  return new Redis({ port, host: '127.0.0.1', lazyConnect: false });
}

before(async () => {
  assert.ok(fs.existsSync(MODULE), `${MODULE} is missing: run cargo build --release`);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rlock-node-'));
  port = await freePort();
  server = spawn(
    SERVER,
    ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '', '--appendonly', 'no',
      '--loadmodule', MODULE],
    { stdio: 'ignore' },
  );
  process.on('exit', () => server.kill('SIGKILL')); // also when a test run is cut short
  admin = new Redis({ port, host: '127.0.0.1', retryStrategy: (n) => (n > 200 ? null : 20) });
  admin.on('error', () => {}); // refused until the server listens: retried
  await waitFor(async () => (await admin.ping().catch(() => null)) === 'PONG', 10000);
  const info = await admin.info('server');
  // Our child, not another test's server that took the port first.
  assert.match(info, new RegExp(`process_id:${server.pid}\\r\\n`));
  const name = /valkey_version:(\S+)/.exec(info)
    ? `valkey ${/valkey_version:(\S+)/.exec(info)[1]}`
    : `redis ${/redis_version:(\S+)/.exec(info)[1]}`;
  console.log(`node helper tests on ${name} (${SERVER})`);
});

after(async () => {
  admin.disconnect();
  server.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

beforeEach(async () => {
  await admin.config('SET', 'rlock.notify-channel', 'yes');
  await admin.flushall();
});

test('acquire with BLOCK, release, and a hand-over with a larger token', async () => {
  const r = client();
  const holder = new Lock(r, 'k', { leaseMs: 5000 });
  const first = await holder.acquire();
  assert.strictEqual(typeof first, 'bigint');
  assert.ok(first > 2n ** 53n, 'tokens keep their 64 bits');
  const info = await holder.info();
  assert.strictEqual(String(info.owner), holder.owner);
  assert.strictEqual(BigInt(info.token), first);

  const waiter = new Lock(r, 'k');
  const pending = waiter.acquire({ timeoutMs: 5000 });
  await waitFor(async () => (await stat('waiters')) === 1);
  assert.strictEqual(await holder.release(), 0);
  const second = await pending;
  assert.ok(second > first);
  assert.strictEqual(await waiter.release(), 0);
  assert.strictEqual(await admin.exists('k'), 0);
  holder.close();
  waiter.close();
  r.disconnect();
});

test('BLOCK timeout resolves to null and leaves no waiter', async () => {
  const r = client();
  const holder = new Lock(r, 'busy');
  await holder.acquire();
  const other = new Lock(r, 'busy');
  assert.strictEqual(await other.tryAcquire(), null);
  const start = Date.now();
  assert.strictEqual(await other.acquire({ timeoutMs: 200 }), null);
  assert.ok(Date.now() - start >= 190);
  assert.strictEqual(await stat('waiters'), 0);
  await holder.release();
  holder.close();
  other.close();
  r.disconnect();
});

test('renewal keeps a 300 ms lease alive for 2 s, then stops', async () => {
  const r = client();
  const lock = new Lock(r, 'renewed', { leaseMs: 300 });
  const token = await lock.acquire();
  const end = Date.now() + 2000;
  while (Date.now() < end) {
    const info = await lock.info();
    assert.ok(info, 'the lease ran out despite renewal');
    assert.strictEqual(BigInt(info.token), token);
    await sleep(50);
  }
  assert.strictEqual(lock.lost, false);
  assert.strictEqual(await lock.release(), 0);
  assert.strictEqual(lock.renewing, false);
  lock.close();
  r.disconnect();
});

test('a forced release is reported as lost', async () => {
  const r = client();
  const reported = [];
  const lock = new Lock(r, 'lost', { leaseMs: 300, onLost: (l) => reported.push(l) });
  await lock.acquire();
  assert.strictEqual(await admin.call('RLOCK.FORCERELEASE', 'lost'), 1);
  await waitFor(async () => lock.lost, 2000);
  assert.deepStrictEqual(reported, [lock]);
  assert.strictEqual(lock.renewing, false);
  await assert.rejects(lock.release(), /NOTOWNER/);
  lock.close();
  r.disconnect();
});

test('pub/sub path: granted on the release message, nothing parked', async () => {
  const r = client();
  const holder = new Lock(r, 'ps');
  const first = await holder.acquire();
  const waiter = new Lock(r, 'ps');
  const pending = waiter.acquireViaPubSub({ timeoutMs: 5000, safetyPollMs: 10000 });
  await waitFor(async () => (await admin.pubsub('NUMSUB', '__rlock@0__:ps'))[1] === 1);
  await sleep(100);
  assert.strictEqual(await stat('waiters'), 0);
  const start = Date.now();
  await holder.release();
  const token = await pending;
  assert.ok(Date.now() - start < 1000, 'the message, not the poll');
  assert.ok(token > first);
  await waiter.release();
  holder.close();
  waiter.close();
  r.disconnect();
});

test('pub/sub path: retries when the holder lease runs out, times out with null', async () => {
  await admin.config('SET', 'rlock.notify-channel', 'no');
  await admin.call('RLOCK.ACQUIRE', 'quiet', 'gone', 'PX', '400');
  const r = client();
  const waiter = new Lock(r, 'quiet');
  const start = Date.now();
  const token = await waiter.acquireViaPubSub({ timeoutMs: 5000, safetyPollMs: 10000 });
  const waited = Date.now() - start;
  assert.ok(token !== null);
  assert.ok(waited > 300 && waited < 1500, `${waited} ms`);
  const other = new Lock(r, 'quiet');
  assert.strictEqual(await other.acquireViaPubSub({ timeoutMs: 300 }), null);
  await waiter.release();
  waiter.close();
  other.close();
  r.disconnect();
});
