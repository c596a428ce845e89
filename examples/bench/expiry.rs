//! (c) Expiry handoff: a holder takes the lock with a short lease and vanishes
//! (its connection closes, it never releases). One waiter is already waiting.
//! Measured: the waiter's grant time minus the holder's lease deadline.
//!
//! The deadline is read back with PEXPIRETIME (the lock key's TTL is the
//! deadline, for the native lock and for Redisson's hash alike), in unix ms on
//! the same clock the client reads. A hold is valid through its deadline
//! millisecond (Redis's TTL rule), so no grant can come earlier than
//! deadline + 1 ms; the delay is counted from the deadline itself.

use std::time::{Duration, Instant};

use crate::cmd;
use crate::contention::RedissonClient;
use crate::locks::{now_us, owner, Impl, Lock};
use crate::server::Server;
use crate::Env;

pub struct Handoff {
    pub lock: Lock,
    pub delays_us: Vec<i64>,
}

impl Handoff {
    pub fn percentile_ms(&self, p: f64) -> f64 {
        let mut s = self.delays_us.clone();
        if s.is_empty() {
            return f64::NAN;
        }
        s.sort_unstable();
        let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
        s[rank.clamp(1, s.len()) - 1] as f64 / 1000.0
    }
    pub fn max_ms(&self) -> f64 {
        self.delays_us.iter().copied().max().unwrap_or(0) as f64 / 1000.0
    }
    pub fn min_ms(&self) -> f64 {
        self.delays_us.iter().copied().min().unwrap_or(0) as f64 / 1000.0
    }
}

pub fn run(env: &Env, lock: Lock) -> Handoff {
    let srv = Server::start(&env.module, None);
    let s = &*env.scripts;
    s.load(&mut srv.conn());
    let holder = owner(7, 1);
    let waiter = owner(8, 1);
    let mut native = srv.conn();
    let mut redisson = RedissonClient::new(srv.port, lock);
    let mut rng: u64 = 0x2545_F491_4F6C_DD1D ^ now_us() as u64;
    let mut delays = Vec::with_capacity(env.cfg.expiry_trials);
    for i in 0..env.cfg.expiry_trials {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let lease = 30 + rng % 50;
        let key = format!("expiry:{i}");
        let deadline_ms = {
            let mut h = srv.conn();
            lock.queue_acquire(&mut h, s, &key, &holder, lease, None);
            h.flush().expect("send");
            let v = h.read().expect("reply");
            assert_eq!(lock.acquire_result(&v), Ok(None), "holder acquire");
            cmd!(h; "PEXPIRETIME", key)
                .expect("PEXPIRETIME")
                .int()
                .expect("lock key has a deadline")
            // The holder's connection closes here: it vanished.
        };
        let granted_at = match lock.imp {
            Impl::Native => {
                lock.queue_acquire(&mut native, s, &key, &waiter, 30_000, Some(10_000));
                native.flush().expect("send");
                let v = native.read().expect("reply");
                let t = now_us();
                assert_eq!(lock.acquire_result(&v), Ok(None), "waiter not granted");
                lock.queue_release(&mut native, s, &key, &waiter, 30_000);
                native.flush().expect("send");
                assert!(lock.released(&native.read().expect("reply")));
                t
            }
            _ => {
                let give_up = Instant::now() + Duration::from_secs(10);
                redisson
                    .acquire(s, &key, &waiter, 30_000, give_up)
                    .expect("Redisson waiter");
                let t = now_us();
                redisson.release(s, &key, &waiter).expect("release");
                t
            }
        };
        delays.push(granted_at - deadline_ms * 1000);
    }
    Handoff {
        lock,
        delays_us: delays,
    }
}
