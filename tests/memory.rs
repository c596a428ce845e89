//! Memory comes back: the module allocates through Redis (RedisModule_Alloc),
//! so `used_memory` counts every byte it holds. Park and drop 10,000 waiters,
//! churn locks through every path, and the server returns to its baseline.

mod common;

use std::time::Duration;

use common::*;

/// Memory after the server settled (client buffers freed, lazy frees done).
fn settled_memory(c: &mut Connection) -> i64 {
    std::thread::sleep(Duration::from_millis(200));
    used_memory(c)
}

/// Memory once Redis has finished trimming its pools: two samples in a row
/// within a few KB. Not exactly equal: after its client pool is trimmed
/// (megabytes per sample) Valkey 8.1 keeps growing `used_memory` by 16 bytes
/// per sample for several seconds, which on a slow machine outlasted the wait.
fn quiesced_memory(c: &mut Connection) -> i64 {
    const STILL: i64 = 4096;
    let mut last = used_memory(c);
    for _ in 0..60 {
        std::thread::sleep(Duration::from_millis(500));
        let now = used_memory(c);
        if (now - last).abs() < STILL {
            return now;
        }
        last = now;
    }
    panic!("used_memory never settled (last {last})");
}

/// Redis 7.0 gives every blocked module client two pooled temporary clients
/// (about 17 KB each) and trims that pool over a few seconds once they are
/// gone, so "memory came back" means: back to the baseline within a while.
fn wait_back_to(c: &mut Connection, baseline: i64, slack: i64) {
    let mut last = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    while std::time::Instant::now() < deadline {
        last = used_memory(c);
        if last - baseline < slack {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("memory not returned: baseline {baseline}, now {last}");
}

/// The middle value (the upper one of the two middles for an even count).
fn median(values: &[i64]) -> i64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

#[test]
fn ten_thousand_disconnected_waiters_give_their_memory_back() {
    let s = Server::start();
    let mut c = s.client();
    // Held through the whole test: it runs longer than the default lease
    // (30 s) when connecting is slow (seen with `--io-threads 4`).
    int(&mut c, &["RLOCK.ACQUIRE", "k", "holder", "PX", "3600000"]);
    int(
        &mut c,
        &["FAIRLOCK.ACQUIRE", "f", "holder", "PX", "3600000"],
    );
    let cold = settled_memory(&mut c);
    let mut baseline = 0;
    let mut peaks = Vec::new();
    for batch in 0..11 {
        let mut waiters = Vec::new();
        for i in 0..1000 {
            let mut w = s.client();
            let key = if i % 2 == 0 { "k" } else { "f" };
            let family = if i % 2 == 0 {
                "RLOCK.ACQUIRE"
            } else {
                "FAIRLOCK.ACQUIRE"
            };
            let owner = format!("owner-{batch}-{i}-{}", "x".repeat(64));
            w.send_packed_command(
                &cmd(family)
                    .arg(key)
                    .arg(owner)
                    .arg("BLOCK")
                    .arg(0)
                    .get_packed_command(),
            )
            .unwrap();
            waiters.push(w);
        }
        wait_parked(&mut c, 1000);
        // With all 1000 parked, Redis's temp-client pool is fully in use, so
        // the peak is the same every batch unless something leaks per waiter.
        let this_peak = used_memory(&mut c);
        drop(waiters);
        wait_until(Duration::from_secs(10), || stat(&mut c, "waiters") == 0);
        match batch {
            0 => {
                // Warm-up: hash tables of Redis and the module reach their working size.
                baseline = quiesced_memory(&mut c);
                assert!(
                    baseline - cold < 1_000_000,
                    "warm-up kept too much: {cold} -> {baseline}"
                );
            }
            _ => peaks.push(this_peak),
        }
    }
    // A peak varies by up to ~360 KB from batch to batch (Valkey 8.1: client
    // buffers caught at different moments), with no trend, and now and then
    // one batch reads ~500 KB below the rest. A leak is a trend: the median
    // peak of the last five batches against the median of the first five
    // (60 bytes kept per waiter would add 300 KB); a median, unlike the
    // lowest peak, is not moved by one odd batch.
    let (early, late) = peaks.split_at(5);
    let (early, late) = (median(early), median(late));
    assert!(
        late - early < 300_000,
        "memory grows across batches: median peak {early} -> {late} ({peaks:?})"
    );
    let peak = *peaks.iter().max().unwrap();
    assert!(
        peak > baseline + 1_000_000,
        "1000 waiters should be visible: {baseline} -> {peak}"
    );
    wait_back_to(&mut c, baseline, 200_000);
    // The locks and their (now empty) queues still work.
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "k", "holder"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn lock_churn_through_every_path_leaves_nothing_behind() {
    let s = Server::start();
    let mut c = s.client();
    let mut baseline = 0;
    // Round 0 warms up Redis's and the module's tables; rounds 1..=3 must not grow them.
    for round in 0..4 {
        if round == 1 {
            baseline = quiesced_memory(&mut c);
        }
        for i in 0..300 {
            let k = format!("churn:{i}");
            int(&mut c, &["RLOCK.ACQUIRE", &k, "a", "PX", "60000"]);
            int(&mut c, &["RLOCK.ACQUIRE", &k, "a"]);
            int(&mut c, &["RLOCK.RENEW", &k, "a", "PX", "60000"]);
            int(&mut c, &["RLOCK.RELEASE", &k, "a"]);
            int(&mut c, &["RLOCK.RELEASE", &k, "a"]);
            int(&mut c, &["RWLOCK.ACQUIRE", &k, "READ", "r1"]);
            int(&mut c, &["RWLOCK.ACQUIRE", &k, "READ", "r2"]);
            int(&mut c, &["RWLOCK.FORCERELEASE", &k]);
            int(&mut c, &["FAIRLOCK.ACQUIRE", &k, "f", "PX", "50"]);
            let _ = call(&mut c, &["RLOCK.RELEASE", &k, "nobody"]);
            let _ = call(&mut c, &["RLOCK.ACQUIRE", &k, "", "PX", "1"]);
        }
        // Blocked waiters that time out, and ones that get the lock on expiry.
        let waiters: Vec<_> = (0..20)
            .map(|i| {
                spawn_call(
                    &s,
                    &[
                        "FAIRLOCK.ACQUIRE",
                        &format!("churn:{i}"),
                        "w",
                        "BLOCK",
                        "2000",
                        "PX",
                        "50",
                    ],
                )
            })
            .collect();
        for w in waiters {
            assert!(
                matches!(w.join().unwrap().0.unwrap(), Value::Int(_)),
                "round {round}"
            );
        }
        wait_until(Duration::from_secs(5), || int(&mut c, &["DBSIZE"]) == 0);
        int(&mut c, &["RLOCK.ACQUIRE", "held", "a"]);
        let timeouts: Vec<_> = (0..20)
            .map(|_| spawn_call(&s, &["RLOCK.ACQUIRE", "held", "w", "BLOCK", "20"]))
            .collect();
        for w in timeouts {
            assert_eq!(w.join().unwrap().0.unwrap(), Value::Nil);
        }
        int(&mut c, &["RLOCK.FORCERELEASE", "held"]);
        let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    }
    assert_eq!(stat(&mut c, "locks"), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);
    wait_back_to(&mut c, baseline, 100_000);
}

#[test]
fn a_hundred_thousand_readers_leave_nothing_behind() {
    let s = Server::start();
    let mut c = s.client();
    int(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "READ", "first", "PX", "600000"],
    );
    // Redis allocates a latency histogram per command at its first call: make
    // those calls before the baseline.
    int(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "READ", "warm", "PX", "1000"],
    );
    info_map(&mut c, &["RWLOCK.INFO", "rw"]).unwrap();
    int(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "warm"]);
    let baseline = settled_memory(&mut c);
    for round in 0..2 {
        // Bulk traffic on its own connection, so its buffers go with it.
        let mut bulk = s.client();
        for chunk in (0..100_000).collect::<Vec<_>>().chunks(1000) {
            let mut p = redis::pipe();
            for i in chunk {
                p.cmd("RWLOCK.ACQUIRE")
                    .arg("rw")
                    .arg("READ")
                    .arg(format!("reader-{round}-{i}"))
                    .arg("PX")
                    .arg(600_000);
            }
            let _: Vec<i64> = p.query(&mut bulk).unwrap();
        }
        let info = info_map(&mut bulk, &["RWLOCK.INFO", "rw"]).unwrap();
        match field(&info, "readers") {
            Value::Array(a) => assert_eq!(a.len(), 100_001),
            other => panic!("{other:?}"),
        }
        assert!(used_memory(&mut c) > baseline + 10_000_000);
        for chunk in (0..100_000).collect::<Vec<_>>().chunks(1000) {
            let mut p = redis::pipe();
            for i in chunk {
                p.cmd("RWLOCK.RELEASE")
                    .arg("rw")
                    .arg("READ")
                    .arg(format!("reader-{round}-{i}"));
            }
            let _: Vec<i64> = p.query(&mut bulk).unwrap();
        }
        drop(bulk);
        wait_back_to(&mut c, baseline, 64 * 1024);
    }
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw"]).unwrap();
    match field(&info, "readers") {
        Value::Array(a) => assert_eq!(a.len(), 1),
        other => panic!("{other:?}"),
    }
}

/// 20,000 KEEPALIVE holdings on one connection: closing it ends them all (in
/// bounded batches, so the server keeps answering), and the module's binding
/// registry gives its memory back (it kept its peak size: ~200 bytes a
/// holding).
#[test]
fn twenty_thousand_keepalive_holdings_end_and_leave_nothing_behind() {
    let s = Server::start();
    let mut c = s.client();
    let baseline = settled_memory(&mut c);
    let mut holder = s.client();
    let mut pipe = redis::pipe();
    for i in 0..20_000 {
        pipe.cmd("RLOCK.ACQUIRE")
            .arg(format!("ka:{i}"))
            .arg("o")
            .arg("PX")
            .arg(60_000)
            .arg("KEEPALIVE")
            .ignore();
    }
    let _: () = pipe.query(&mut holder).unwrap();
    assert_eq!(stat(&mut c, "keepalive_holds"), 20_000);
    drop(holder);
    wait_until(Duration::from_secs(10), || stat(&mut c, "locks") == 0);
    assert_eq!(stat(&mut c, "keepalive_holds"), 0);
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
    wait_back_to(&mut c, baseline, 1_500_000);
}

/// A lock with many holders is freed off the main thread when it is removed
/// lazily (`UNLINK`), as Redis frees a large hash; a one-holder lock is
/// freed at once (not worth a hand-off).
#[test]
fn a_lock_with_many_holders_is_freed_in_the_background_on_unlink() {
    let s = Server::start();
    let mut c = s.client();
    let mut pipe = redis::pipe();
    for i in 0..1000 {
        pipe.cmd("RWLOCK.ACQUIRE")
            .arg("readers")
            .arg("READ")
            .arg(format!("r{i}"));
        pipe.ignore();
    }
    let _: () = pipe.query(&mut c).unwrap();
    int(&mut c, &["SEMAPHORE.ACQUIRE", "one", "a", "LIMIT", "5"]);
    let before = lazyfreed(&mut c);
    assert_eq!(int(&mut c, &["UNLINK", "one"]), 1);
    assert_eq!(int(&mut c, &["UNLINK", "readers"]), 1);
    wait_until(Duration::from_secs(10), || lazyfreed(&mut c) > before);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(lazyfreed(&mut c), before + 1, "only the many-holder lock");
    assert_eq!(stat(&mut c, "locks"), 0);
}

/// Objects Redis has freed on its background thread (INFO memory).
fn lazyfreed(c: &mut Connection) -> i64 {
    let info: String = cmd("INFO").arg("memory").query(c).unwrap();
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("lazyfreed_objects:"));
    line.expect("INFO memory has lazyfreed_objects")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_lock_the_engine_deletes_once_empty_is_freed_at_once() {
    // Under lazyfree-lazy-server-del (Valkey's default) Redis frees a value
    // the module deletes in the background unless its free effort is small;
    // an empty lock (released, forced, its lease over) must not count as
    // unknown effort.
    let s = Server::start();
    let mut c = s.client();
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("lazyfree-lazy-server-del")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let before = lazyfreed(&mut c);
    int(&mut c, &["RLOCK.ACQUIRE", "released", "a"]);
    int(&mut c, &["RLOCK.RELEASE", "released", "a"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "forced", "READ", "a"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "forced", "READ", "b"]);
    int(&mut c, &["RWLOCK.FORCERELEASE", "forced"]);
    int(
        &mut c,
        &["SEMAPHORE.ACQUIRE", "leased", "a", "LIMIT", "2", "PX", "50"],
    );
    int(
        &mut c,
        &["SEMAPHORE.ACQUIRE", "leased", "b", "LIMIT", "2", "PX", "60"],
    );
    wait_until(Duration::from_secs(5), || {
        int(&mut c, &["EXISTS", "leased"]) == 0
    });
    assert_eq!(stat(&mut c, "locks"), 0, "freed when deleted");
    assert_eq!(lazyfreed(&mut c), before, "none freed in the background");
}
