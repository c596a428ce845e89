//! `maxmemory`: under `noeviction` a server at its limit refuses new locks
//! (ACQUIRE is `deny-oom`) while holders can still release and renew and
//! waiters are still handed the lock; under an evicting policy Redis may evict
//! lock keys like any other (the module says so in the log), and a lock that
//! goes that way sends its waiters to retry and leaves nothing behind.

mod common;

use std::time::Duration;

use common::*;

fn config_set(c: &mut Connection, name: &str, value: &str) {
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .unwrap();
}

fn warnings(s: &Server) -> Vec<String> {
    s.log()
        .lines()
        .filter(|l| l.contains("Redis may evict lock keys"))
        .map(str::to_owned)
        .collect()
}

/// Logged at load and each time CONFIG SET turns eviction on; not for a limit
/// of 0 or `noeviction`, nor again for other changes while it stays on.
#[test]
fn an_evicting_policy_is_named_in_the_log() {
    let s = Server::start_with(
        &["--maxmemory", "1gb", "--maxmemory-policy", "volatile-ttl"],
        &[],
    );
    let mut c = s.client();
    let logged = warnings(&s);
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(
        logged[0].contains("maxmemory-policy volatile-ttl"),
        "{logged:?}"
    );
    assert!(logged[0].contains("evicts locks first"), "{logged:?}");
    config_set(&mut c, "maxmemory-policy", "allkeys-lru");
    config_set(&mut c, "hz", "20");
    assert_eq!(warnings(&s).len(), 1);
    config_set(&mut c, "maxmemory-policy", "noeviction");
    config_set(&mut c, "maxmemory-policy", "allkeys-random");
    let logged = warnings(&s);
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert!(
        logged[1].contains("maxmemory-policy allkeys-random"),
        "{logged:?}"
    );
    assert!(!logged[1].contains("evicts locks first"), "{logged:?}");
    config_set(&mut c, "maxmemory", "0");
    config_set(&mut c, "maxmemory", "2gb");
    assert_eq!(warnings(&s).len(), 3);

    let quiet = Server::start_with(&["--maxmemory", "1gb"], &[]);
    let unlimited = Server::start_with(&["--maxmemory-policy", "allkeys-lru"], &[]);
    assert!(warnings(&quiet).is_empty(), "{}", quiet.log());
    assert!(warnings(&unlimited).is_empty(), "{}", unlimited.log());
}

/// At the limit under `noeviction`: new and reentrant acquisitions get OOM
/// and change nothing; RENEW, KEEPALIVE renewals, RELEASE (with its hand-over
/// to a parked waiter) and FORCERELEASE still work.
#[test]
fn at_the_limit_acquire_is_refused_and_holders_carry_on() {
    let s = Server::start();
    let mut c = s.client();
    let token = int(&mut c, &["RLOCK.ACQUIRE", "a", "h", "PX", "60000"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "r", "READ", "h", "PX", "60000"]);
    int(
        &mut c,
        &["SEMAPHORE.ACQUIRE", "s", "h", "LIMIT", "2", "PX", "60000"],
    );
    let mut bound = s.client();
    acquire_keepalive(&mut bound, &["kept".to_string()], "h", 300);
    let waiter = spawn_call(&s, &["RLOCK.ACQUIRE", "a", "w", "BLOCK", "10000"]);
    wait_parked(&mut c, 1);
    // Not DEBUG DIGEST: the KEEPALIVE renewals change the whole dataset's.
    let digests = |c: &mut Connection| -> Vec<String> {
        let keys = ["a", "r", "s", "new", "f", "other"];
        cmd("DEBUG")
            .arg("DIGEST-VALUE")
            .arg(&keys[..])
            .query(c)
            .unwrap()
    };
    let before = digests(&mut c);
    config_set(&mut c, "maxmemory", "1");

    for args in [
        &["RLOCK.ACQUIRE", "new", "h"][..],
        &["RLOCK.ACQUIRE", "a", "h"],
        &["FAIRLOCK.ACQUIRE", "f", "h"],
        &["RWLOCK.ACQUIRE", "r", "READ", "h"],
        &["SEMAPHORE.ACQUIRE", "s", "x", "LIMIT", "2"],
        &["RLOCK.ACQUIREALL", "2", "new", "other", "h"],
    ] {
        let e = call(&mut c, args).unwrap_err();
        assert_eq!(e.code(), Some("OOM"), "{args:?}: {e}");
    }
    assert_eq!(digests(&mut c), before);
    assert_eq!(stat(&mut c, "waiters"), 1);
    // The server keeps renewing the KEEPALIVE holding past its lease.
    let renewals = stat(&mut c, "keepalive_renewals");
    std::thread::sleep(Duration::from_millis(700));
    assert!(stat(&mut c, "keepalive_renewals") >= renewals + 2);
    let info = info_map(&mut c, &["RLOCK.INFO", "kept"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "h");

    assert_eq!(int(&mut c, &["RLOCK.RENEW", "a", "h", "PX", "120000"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "r", "h"]), 1);
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "a", "h"]), 0);
    let (reply, _) = waiter.join().unwrap();
    let Ok(Value::Int(handed)) = reply else {
        panic!("{reply:?}")
    };
    assert!(handed > token, "{handed} after {token}");
    let info = info_map(&mut c, &["RLOCK.INFO", "a"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "w");
    assert_eq!(int(&mut c, &["RWLOCK.RELEASE", "r", "READ", "h"]), 0);
    assert_eq!(int(&mut c, &["SEMAPHORE.RELEASE", "s", "h"]), 0);
    assert_eq!(int(&mut c, &["RLOCK.FORCERELEASE", "a"]), 1);
    assert_eq!(int(&mut bound, &["RLOCK.RELEASE", "kept", "h"]), 0);
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);

    config_set(&mut c, "maxmemory", "0");
    assert!(int(&mut c, &["RLOCK.ACQUIRE", "new", "h"]) > handed);
    assert!(warnings(&s).is_empty());
}

/// Every kind of lock, a many-holder RWLOCK (freed in the background under
/// lazy eviction), a KEEPALIVE holding and parked waiters of each family,
/// evicted by `volatile-ttl` (lock keys are the only keys with a TTL here):
/// every waiter gets TRYAGAIN, nothing of the module's is left, and the keys
/// can be locked again.
fn evicted_locks_send_their_waiters_to_retry(lazy: &str) {
    let s = Server::start_with(
        &[
            "--maxmemory-policy",
            "volatile-ttl",
            "--lazyfree-lazy-eviction",
            lazy,
        ],
        &[],
    );
    let mut c = s.client();
    let mut bound = s.client();
    let _: () = cmd("SET").arg("plain").arg("value").query(&mut c).unwrap();
    for i in 0..20 {
        let k = |p: &str| format!("{p}{i}");
        int(&mut c, &["RLOCK.ACQUIRE", &k("l"), "h", "PX", "60000"]);
        int(&mut c, &["FAIRLOCK.ACQUIRE", &k("f"), "h", "PX", "60000"]);
        int(
            &mut c,
            &["RWLOCK.ACQUIRE", &k("w"), "WRITE", "h", "PX", "60000"],
        );
        int(
            &mut c,
            &[
                "SEMAPHORE.ACQUIRE",
                &k("s"),
                "h",
                "LIMIT",
                "1",
                "PX",
                "60000",
            ],
        );
    }
    for i in 0..200 {
        int(
            &mut c,
            &[
                "RWLOCK.ACQUIRE",
                "readers",
                "READ",
                &format!("r{i}"),
                "PX",
                "60000",
            ],
        );
    }
    acquire_keepalive(&mut bound, &["kept".to_string()], "h", 1000);
    let mut waiters = Vec::new();
    for i in 0..20 {
        let k = |p: &str| format!("{p}{i}");
        for args in [
            vec!["RLOCK.ACQUIRE", &k("l"), "w", "BLOCK", "20000"],
            vec!["FAIRLOCK.ACQUIRE", &k("f"), "w", "BLOCK", "20000"],
            vec!["RWLOCK.ACQUIRE", &k("w"), "READ", "w", "BLOCK", "20000"],
            vec![
                "SEMAPHORE.ACQUIRE",
                &k("s"),
                "w",
                "LIMIT",
                "1",
                "BLOCK",
                "20000",
            ],
        ] {
            waiters.push(spawn_call(&s, &args));
        }
    }
    waiters.push(spawn_call(
        &s,
        &["RWLOCK.ACQUIRE", "readers", "WRITE", "w", "BLOCK", "20000"],
    ));
    waiters.push(spawn_call(
        &s,
        &[
            "RLOCK.ACQUIREALL",
            "2",
            "kept",
            "free",
            "w",
            "BLOCK",
            "20000",
        ],
    ));
    wait_parked(&mut c, 82);
    assert_eq!(stat(&mut c, "keepalive_holds"), 1);

    config_set(&mut c, "maxmemory", "1");
    wait_until(Duration::from_secs(10), || int(&mut c, &["DBSIZE"]) == 1);
    for w in waiters {
        let (reply, waited) = w.join().unwrap();
        let e = reply.unwrap_err();
        assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }
    assert_eq!(int(&mut c, &["EXISTS", "plain"]), 1);
    // Only the 200-reader lock is worth a background free (effort > 64).
    let memory: String = cmd("INFO").arg("memory").query(&mut c).unwrap();
    let expected = if lazy == "yes" { "1" } else { "0" };
    assert!(
        memory.contains(&format!("lazyfreed_objects:{expected}\r\n")),
        "{memory}"
    );
    // A KEEPALIVE binding is dropped at its next renewal (a third of its lease).
    wait_until(Duration::from_secs(5), || {
        stat(&mut c, "locks") == 0 && stat(&mut c, "keepalive_holds") == 0
    });
    for name in ["waiters", "lease_schedule"] {
        assert_eq!(stat(&mut c, name), 0, "{name}");
    }
    let renewals = stat(&mut c, "keepalive_renewals");
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(stat(&mut c, "keepalive_renewals"), renewals);

    config_set(&mut c, "maxmemory", "0");
    assert!(int(&mut c, &["RLOCK.ACQUIRE", "l0", "w"]) > 0);
    assert!(int(&mut c, &["RWLOCK.ACQUIRE", "readers", "WRITE", "w"]) > 0);
    assert!(int(&mut bound, &["RLOCK.ACQUIRE", "kept", "h", "PX", "1000"]) > 0);
}

#[test]
fn evicted_locks_send_their_waiters_to_retry_freed_at_once() {
    evicted_locks_send_their_waiters_to_retry("no");
}

#[test]
fn evicted_locks_send_their_waiters_to_retry_freed_in_the_background() {
    evicted_locks_send_their_waiters_to_retry("yes");
}
