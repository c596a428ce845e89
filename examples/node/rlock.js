'use strict';
/**
 * A small helper for the rlock Redis module on ioredis.
 *
 *   const Redis = require('ioredis');
 *   const { Lock } = require('./rlock');
 *
 *   const lock = new Lock(new Redis(), 'orders:42', { leaseMs: 10000 });
 *   const token = await lock.acquire({ timeoutMs: 5000 });   // BLOCK on the server
 *   if (token !== null) {
 *     try { await writeSomewhere(token); } finally { await lock.release(); }
 *   }
 *
 * - Fencing tokens are 64-bit (larger than 2^53): they come back as BigInt.
 *   The helper talks through its own duplicates of your client with
 *   `stringNumbers` on, so no token loses precision.
 * - `acquire` parks on the server (`RLOCK.ACQUIRE ... BLOCK ms`) on a
 *   connection of its own (a BLOCK would stall a shared, multiplexed one);
 *   null when the time runs out.
 * - While held, `RLOCK.RENEW` runs every lease/3; if the server answers
 *   NOTOWNER (or no renewal got through for a whole lease), `lock.lost`
 *   becomes true and `onLost(lock)` is called.
 * - `acquireViaPubSub` waits without a parked connection: it subscribes to
 *   `__rlock@<db>__:<key>`, tries without BLOCK, and tries again on each
 *   message and when the holder's lease (PTTL) runs out.
 */

const crypto = require('crypto');

const END_MESSAGES = new Set(['released', 'expired', 'forced']);

function unlockChannel(db, key) {
  return `__rlock@${db}__:${key}`;
}

function isNotOwner(err) {
  return err && typeof err.message === 'string' && err.message.startsWith('NOTOWNER');
}

class Lock {
  /**
   * @param {import('ioredis').Redis} redis a connected (or lazily connecting) client
   * @param {string} key
   * @param {{owner?: string, leaseMs?: number, onLost?: (lock: Lock) => void}} [opts]
   */
  constructor(redis, key, opts = {}) {
    this.redis = redis;
    this.key = key;
    this.owner = opts.owner || `${crypto.randomUUID()}:${process.pid}`;
    this.leaseMs = opts.leaseMs || 30000;
    this.onLost = opts.onLost || null;
    this.token = null; // BigInt while held
    this.holds = 0;
    this.lost = false;
    this._conn = null;
    this._timer = null;
    this._lastRenewal = 0;
  }

  _db() {
    return Number(this.redis.options.db || 0);
  }

  /** The helper's own command connection (integers as strings). */
  _commands() {
    if (!this._conn) {
      this._conn = this.redis.duplicate({ stringNumbers: true, maxRetriesPerRequest: 0 });
    }
    return this._conn;
  }

  _acquireArgs(blockMs) {
    const args = [this.key, this.owner, 'PX', String(this.leaseMs)];
    if (blockMs !== undefined) args.push('BLOCK', String(blockMs));
    return args;
  }

  _granted(reply) {
    if (reply === null) return null;
    this.token = BigInt(reply);
    this.holds += 1;
    this.lost = false;
    if (!this._timer) this._startRenewal();
    return this.token;
  }

  /** One try without waiting: the token, or null when busy. */
  async tryAcquire() {
    const reply = await this._commands().call('RLOCK.ACQUIRE', ...this._acquireArgs());
    return this._granted(reply);
  }

  /**
   * Waits on the server until granted or `timeoutMs` passes (omitted: no
   * limit). Resolves to the token, or null on timeout.
   */
  async acquire({ timeoutMs } = {}) {
    const blockMs = timeoutMs === undefined ? 0 : Math.max(1, Math.round(timeoutMs));
    const waiter = this.redis.duplicate({
      stringNumbers: true,
      maxRetriesPerRequest: 0,
      commandTimeout: undefined,
      autoResendUnfulfilledCommands: false, // a resent ACQUIRE would queue again
    });
    try {
      const reply = await waiter.call('RLOCK.ACQUIRE', ...this._acquireArgs(blockMs));
      return this._granted(reply);
    } finally {
      waiter.disconnect();
    }
  }

  /**
   * Acquires without parking a connection on the server. Resolves to the
   * token, or null after `timeoutMs`. `safetyPollMs` bounds every wait (a
   * flush publishes nothing).
   */
  async acquireViaPubSub({ timeoutMs, safetyPollMs = 5000 } = {}) {
    const deadline = timeoutMs === undefined ? Infinity : Date.now() + timeoutMs;
    const sub = this.redis.duplicate();
    let wake = null;
    sub.on('message', (_channel, message) => {
      if (END_MESSAGES.has(String(message)) && wake) wake();
    });
    try {
      await sub.subscribe(unlockChannel(this._db(), this.key)); // before the first try
      for (;;) {
        const token = await this.tryAcquire();
        if (token !== null) return token;
        const pttl = Number(await this._commands().pttl(this.key));
        let wait = pttl === -2 ? 1 : pttl < 0 ? safetyPollMs : Math.min(safetyPollMs, pttl + 2);
        const left = deadline - Date.now();
        if (left <= 0) return null;
        wait = Math.min(wait, left);
        await new Promise((resolve) => {
          const t = setTimeout(resolve, wait);
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
        wake = null;
      }
    } finally {
      sub.disconnect();
    }
  }

  /** Drops one hold; resolves to the holds left (0: free). Rejects on NOTOWNER. */
  async release() {
    let left;
    try {
      left = Number(await this._commands().call('RLOCK.RELEASE', this.key, this.owner));
    } catch (err) {
      if (isNotOwner(err)) {
        this.holds = 0;
        this._stopRenewal();
        this._markLost();
      }
      throw err;
    }
    this.holds = left;
    if (left === 0) {
      this.token = null;
      this._stopRenewal();
    }
    return left;
  }

  /** `RLOCK.INFO` as an object (null when nobody holds the lock). */
  async info() {
    const reply = await this._commands().call('RLOCK.INFO', this.key);
    if (reply === null) return null;
    const out = {};
    for (let i = 0; i + 1 < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
    return out;
  }

  get renewing() {
    return this._timer !== null;
  }

  _startRenewal() {
    this._lastRenewal = Date.now();
    const tick = async () => {
      try {
        await this._commands().call('RLOCK.RENEW', this.key, this.owner, 'PX', String(this.leaseMs));
        this._lastRenewal = Date.now();
      } catch (err) {
        if (this._timer === null) return; // released meanwhile
        if (isNotOwner(err) || Date.now() - this._lastRenewal >= this.leaseMs) {
          this._stopRenewal();
          this._markLost();
        }
      }
    };
    this._timer = setInterval(tick, Math.max(1, Math.floor(this.leaseMs / 3)));
  }

  _stopRenewal() {
    if (this._timer) clearInterval(this._timer);
    this._timer = null;
  }

  _markLost() {
    if (this.lost) return;
    this.lost = true;
    if (this.onLost) this.onLost(this);
  }

  /** Stops renewing and closes the helper's connections (not your client). */
  close() {
    this._stopRenewal();
    if (this._conn) this._conn.disconnect();
    this._conn = null;
  }
}

module.exports = { Lock, unlockChannel, END_MESSAGES };
