//! How an application uses the rlock Rust client library (`clients/rust`,
//! crate `rlock-client`): a guarded critical section kept alive by the server
//! (`KEEPALIVE`), two workers served in turn by the server, the pub/sub path
//! with its renewal thread, a multi-key lock, and RedLock.
//!
//! Which renewal to use: where the holder has a connection of its own for as
//! long as it holds (a guard of a keepalive lock keeps one), `keepalive(true)`
//! lets the server renew the lease while that connection is open and free the
//! lock the moment it closes. Where no connection is dedicated to the holder
//! (the pub/sub path, multiplexed clients), the guard's renewal thread sends
//! RENEW every lease/3.
//!
//! ```text
//! cargo run --release --example rust_client -- <port> [<port> ...]
//! ```
//!
//! The lock logic lives in the library; this file only calls it.

use std::time::Duration;

use redis::Client;
use rlock_client::{Lock, MultiLock, RedLock};

/// Runs the demonstration against the servers on `ports` (the first one for
/// the single-server locks, all of them for RedLock) and returns what it saw.
pub fn demo(ports: &[u16]) -> Result<Vec<String>, rlock_client::Error> {
    let clients: Vec<Client> = ports
        .iter()
        .map(|p| Client::open(format!("redis://127.0.0.1:{p}/")))
        .collect::<Result<_, _>>()?;
    let client = &clients[0];
    let mut log = Vec::new();

    // 1. A guard on a connection dedicated to the holder: KEEPALIVE, the
    //    server renews the 300 ms lease while the guard lives (no renewal
    //    thread); released on drop.
    {
        let lock = Lock::new(client, "demo:job")
            .lease(Duration::from_millis(300))
            .keepalive(true);
        let guard = lock.acquire(None)?.expect("BLOCK 0 waits until granted");
        log.push(format!("acquired demo:job, token {}", guard.token()));
        std::thread::sleep(Duration::from_millis(700));
        let alive = lock.info()?.is_some();
        log.push(format!(
            "still held after 700 ms with a 300 ms lease: {alive}"
        ));
        log.push(format!(
            "renewed by the server, no renewal thread: {}",
            !guard.is_renewing()
        ));
    }
    let mut conn = client.get_connection()?;
    let exists: bool = redis::cmd("EXISTS").arg("demo:job").query(&mut conn)?;
    log.push(format!("released on drop: {}", !exists));

    // 2. Two workers, one lock: the second waits on the server and is handed
    //    the lock when the first releases. Each worker's wait and holding have
    //    a connection of their own: KEEPALIVE.
    let workers: Vec<_> = ["worker-a", "worker-b"]
        .into_iter()
        .map(|owner| {
            let lock = Lock::new(client, "demo:shared")
                .owner(owner)
                .keepalive(true);
            std::thread::spawn(move || -> Result<(String, i64), rlock_client::Error> {
                let guard = lock
                    .acquire(Some(Duration::from_secs(5)))?
                    .expect("granted within 5 s");
                std::thread::sleep(Duration::from_millis(100));
                Ok((lock.owner_name().to_string(), guard.token()))
            })
        })
        .collect();
    for w in workers {
        let (owner, token) = w.join().expect("worker thread")?;
        log.push(format!("{owner} held demo:shared with token {token}"));
    }

    // 3. The pub/sub path: wait for a release without a parked connection.
    //    This path dedicates no connection to the holder, so its lease is kept
    //    by the guard's renewal thread (RENEW every lease/3), not KEEPALIVE.
    let holder = Lock::new(client, "demo:ps").acquire(None)?.expect("free");
    let waiter = Lock::new(client, "demo:ps").lease(Duration::from_millis(300));
    let handle = std::thread::spawn(move || {
        waiter.acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(1))
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(holder);
    let guard = handle.join().expect("pub/sub thread")?;
    log.push(format!(
        "pub/sub waiter acquired after release: {}",
        guard.is_some()
    ));
    if let Some(guard) = guard {
        std::thread::sleep(Duration::from_millis(500));
        let kept = guard.is_renewing() && guard.lock().info()?.is_some();
        log.push(format!("pub/sub holder kept by its renewal thread: {kept}"));
    }

    // 4. Several keys at once, all or nothing (RLOCK.ACQUIREALL): a transfer
    //    between two accounts (one hash tag, so one cluster slot).
    {
        let multi = MultiLock::new(client, ["demo:{acct}:1", "demo:{acct}:2"]).keepalive(true);
        let guard = multi
            .acquire(Some(Duration::from_secs(5)))?
            .expect("both accounts free");
        log.push(format!(
            "multi-lock holds {} keys, one token each: {}",
            multi.keys().len(),
            guard.tokens().len() == multi.keys().len()
        ));
    }
    let left: i64 = redis::cmd("EXISTS")
        .arg("demo:{acct}:1")
        .arg("demo:{acct}:2")
        .query(&mut conn)?;
    log.push(format!("multi-lock released every key: {}", left == 0));

    // 5. RedLock over every server given (one server is a quorum of one).
    let redlock = RedLock::new(&clients, "demo:red").lease(Duration::from_secs(5));
    if let Some(guard) = redlock.acquire(Some(Duration::from_secs(2)))? {
        log.push(format!(
            "redlock granted by {} of {} servers, valid for {} ms",
            guard.granted(),
            clients.len(),
            guard.validity().as_millis()
        ));
    }
    Ok(log)
}

#[allow(dead_code)] // the entry point of the example, not of the test that includes this file
fn main() {
    let ports: Vec<u16> = std::env::args()
        .skip(1)
        .filter_map(|p| p.parse().ok())
        .collect();
    let ports = if ports.is_empty() { vec![6379] } else { ports };
    match demo(&ports) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => {
            eprintln!("rust_client: {e}");
            std::process::exit(1);
        }
    }
}
