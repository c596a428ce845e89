//! Integration tests of the read-write lock family (`RWLOCK.*`) against real
//! `redis-server` processes loading the module.

mod common;

use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

/// "At once": a woken waiter must have its reply within this bound.
const AT_ONCE: Duration = Duration::from_millis(500);

type Pending = JoinHandle<(redis::RedisResult<Value>, Duration)>;

/// A server with the module; the harness enables `DEBUG` (RELOAD, DIGEST).
fn server() -> Server {
    Server::start()
}

/// `RWLOCK.ACQUIRE key mode owner [opts...]`: `Some(token)` or `None` (nil).
fn acquire(c: &mut Connection, key: &str, mode: &str, owner: &str, opts: &[&str]) -> Option<i64> {
    let mut args = vec!["RWLOCK.ACQUIRE", key, mode, owner];
    args.extend_from_slice(opts);
    match call(c, &args) {
        Ok(Value::Int(token)) => Some(token),
        Ok(Value::Nil) => None,
        other => panic!("{args:?}: expected a token or nil, got {other:?}"),
    }
}

/// An acquisition that must be granted at once.
fn grant(c: &mut Connection, key: &str, mode: &str, owner: &str, opts: &[&str]) -> i64 {
    acquire(c, key, mode, owner, opts)
        .unwrap_or_else(|| panic!("{mode} {owner} on {key} {opts:?} was not granted"))
}

fn release(c: &mut Connection, key: &str, mode: &str, owner: &str) -> i64 {
    int(c, &["RWLOCK.RELEASE", key, mode, owner])
}

fn rw_info(c: &mut Connection, key: &str) -> Vec<(String, Value)> {
    info_map(c, &["RWLOCK.INFO", key]).unwrap_or_else(|| panic!("RWLOCK.INFO {key} is nil"))
}

fn field_str(info: &[(String, Value)], name: &str) -> Option<String> {
    match field(info, name) {
        Value::Nil => None,
        v => Some(as_string(&v)),
    }
}

fn field_int(info: &[(String, Value)], name: &str) -> i64 {
    as_int(&field(info, name))
}

/// A nested field-value pair list: RESP2 flat array or RESP3 map.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => {
            assert!(items.len() % 2 == 0, "odd field list {items:?}");
            items
                .chunks(2)
                .map(|kv| (as_string(&kv[0]), kv[1].clone()))
                .collect()
        }
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| (as_string(k), v.clone()))
            .collect(),
        other => panic!("expected a map or flat array, got {other:?}"),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Reader {
    owner: String,
    holds: i64,
    token: i64,
    ttl: i64,
}

/// The `readers` field of an INFO reply, sorted by owner.
fn readers(info: &[(String, Value)]) -> Vec<Reader> {
    let list = match field(info, "readers") {
        Value::Array(items) => items,
        Value::Set(items) => items,
        other => panic!("readers is not an array: {other:?}"),
    };
    let mut out: Vec<Reader> = list
        .iter()
        .map(|entry| {
            let p = pairs(entry);
            Reader {
                owner: as_string(&field(&p, "owner")),
                holds: field_int(&p, "holds"),
                token: field_int(&p, "token"),
                ttl: field_int(&p, "ttl"),
            }
        })
        .collect();
    out.sort_by(|a, b| a.owner.cmp(&b.owner));
    out
}

/// Readers as (owner, holds, token): what must not drift with time.
fn reader_ids(info: &[(String, Value)]) -> Vec<(String, i64, i64)> {
    readers(info)
        .into_iter()
        .map(|r| (r.owner, r.holds, r.token))
        .collect()
}

fn reader<'a>(list: &'a [Reader], owner: &str) -> &'a Reader {
    list.iter()
        .find(|r| r.owner == owner)
        .unwrap_or_else(|| panic!("no reader {owner} in {list:?}"))
}

fn owners(list: &[Reader]) -> Vec<&str> {
    list.iter().map(|r| r.owner.as_str()).collect()
}

fn pttl(c: &mut Connection, key: &str) -> i64 {
    int(c, &["PTTL", key])
}

fn digest_value(c: &mut Connection, key: &str) -> String {
    let v: Vec<String> = cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(c).unwrap();
    v.concat()
}

/// Waits for a parked call's reply, which must come within `limit`.
fn reply_within(h: Pending, limit: Duration, what: &str) -> redis::RedisResult<Value> {
    let deadline = Instant::now() + limit;
    while !h.is_finished() {
        assert!(
            Instant::now() < deadline,
            "{what}: no reply within {limit:?}"
        );
        sleep(Duration::from_millis(2));
    }
    h.join().expect("client thread panicked").0
}

/// A parked acquisition that must now be granted at once; returns its token.
fn granted_at_once(h: Pending, what: &str) -> i64 {
    match reply_within(h, AT_ONCE, what) {
        Ok(Value::Int(token)) => token,
        other => panic!("{what}: expected a token, got {other:?}"),
    }
}

fn assert_waiting(h: &Pending, what: &str) {
    assert!(
        !h.is_finished(),
        "{what} was answered while it should still wait"
    );
}

fn block_acquire(s: &Server, key: &str, mode: &str, owner: &str, block_ms: &str) -> Pending {
    spawn_call(s, &["RWLOCK.ACQUIRE", key, mode, owner, "BLOCK", block_ms])
}

#[test]
fn readers_share_the_lock() {
    let s = server();
    let mut c = s.client();
    let t1 = grant(&mut c, "rw", "READ", "r1", &[]);
    let t2 = grant(&mut c, "rw", "READ", "r2", &[]);
    let t3 = grant(&mut c, "rw", "read", "r3", &["PX", "10000"]);
    assert!(
        t1 < t2 && t2 < t3,
        "each new reader gets a greater token: {t1} {t2} {t3}"
    );

    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "mode").as_deref(), Some("read"));
    assert_eq!(field_str(&info, "writer"), None);
    let list = readers(&info);
    assert_eq!(owners(&list), ["r1", "r2", "r3"]);
    assert_eq!(
        list.iter().map(|r| (r.holds, r.token)).collect::<Vec<_>>(),
        [(1, t1), (1, t2), (1, t3)]
    );

    assert_eq!(release(&mut c, "rw", "READ", "r2"), 0);
    assert_eq!(owners(&readers(&rw_info(&mut c, "rw"))), ["r1", "r3"]);
    assert_eq!(release(&mut c, "rw", "READ", "r1"), 0);
    assert_eq!(release(&mut c, "rw", "READ", "r3"), 0);
    assert_eq!(
        int(&mut c, &["EXISTS", "rw"]),
        0,
        "the key goes with its last holder"
    );
    assert!(info_map(&mut c, &["RWLOCK.INFO", "rw"]).is_none());
}

#[test]
fn write_excludes_readers_and_writers() {
    let s = server();
    let mut c = s.client();
    let tw = grant(&mut c, "rw", "WRITE", "w", &[]);
    assert_eq!(
        acquire(&mut c, "rw", "READ", "r", &[]),
        None,
        "READ while written"
    );
    assert_eq!(
        acquire(&mut c, "rw", "WRITE", "w2", &[]),
        None,
        "WRITE while written"
    );
    // A short BLOCK times out with nil and leaves nothing behind.
    let start = Instant::now();
    assert_eq!(acquire(&mut c, "rw", "READ", "r", &["BLOCK", "100"]), None);
    assert!(start.elapsed() >= Duration::from_millis(90));
    assert_eq!(stat(&mut c, "waiters"), 0);
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&info, "writer_token"), tw);
    assert!(readers(&info).is_empty());

    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 0);
    let tr = grant(&mut c, "rw", "READ", "r", &[]);
    assert!(tr > tw);
    assert_eq!(
        acquire(&mut c, "rw", "WRITE", "w", &[]),
        None,
        "WRITE while read"
    );
    assert_eq!(
        acquire(&mut c, "rw", "WRITE", "w", &["BLOCK", "100"]),
        None,
        "WRITE while read, BLOCK times out"
    );
    assert_eq!(release(&mut c, "rw", "READ", "r"), 0);
    let tw2 = grant(&mut c, "rw", "WRITE", "w", &[]);
    assert!(tw2 > tr, "a new tenure gets a new, greater token");
}

#[test]
fn reentrancy_keeps_the_token_in_both_modes() {
    let s = server();
    let mut c = s.client();
    // READ is reentrant.
    let tr = grant(&mut c, "rw", "READ", "r", &[]);
    assert_eq!(grant(&mut c, "rw", "READ", "r", &[]), tr);
    assert_eq!(grant(&mut c, "rw", "READ", "r", &["PX", "5000"]), tr);
    assert_eq!(readers(&rw_info(&mut c, "rw"))[0].holds, 3);
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "WRITE", "r"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "x"]).starts_with("NOTOWNER"));
    assert_eq!(release(&mut c, "rw", "READ", "r"), 2);
    assert_eq!(release(&mut c, "rw", "READ", "r"), 1);
    assert_eq!(release(&mut c, "rw", "READ", "r"), 0);
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "r"]).starts_with("NOTOWNER"));

    // WRITE is reentrant, and the writer may also take READ: same token throughout.
    let tw = grant(&mut c, "rw", "WRITE", "w", &[]);
    assert!(tw > tr);
    assert_eq!(grant(&mut c, "rw", "WRITE", "w", &[]), tw);
    assert_eq!(grant(&mut c, "rw", "READ", "w", &[]), tw);
    assert_eq!(grant(&mut c, "rw", "READ", "w", &["BLOCK", "1000"]), tw);
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "mode").as_deref(), Some("write"));
    assert_eq!(field_str(&info, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&info, "writer_holds"), 2);
    assert_eq!(field_int(&info, "writer_token"), tw);
    assert_eq!(reader_ids(&info), [("w".to_string(), 2, tw)]);
    assert_eq!(acquire(&mut c, "rw", "READ", "other", &[]), None);

    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 1);
    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 0);
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "WRITE", "w"]).starts_with("NOTOWNER"));
    // Still the same tenure while it holds READ.
    assert_eq!(grant(&mut c, "rw", "READ", "w", &[]), tw);
    assert_eq!(release(&mut c, "rw", "READ", "w"), 2);
    assert_eq!(release(&mut c, "rw", "READ", "w"), 1);
    assert_eq!(release(&mut c, "rw", "READ", "w"), 0);
    assert_eq!(int(&mut c, &["EXISTS", "rw"]), 0);
    let next = grant(&mut c, "rw", "WRITE", "w", &[]);
    assert!(
        next > tw,
        "a new tenure after the last release: {next} > {tw}"
    );
}

#[test]
fn releasing_write_while_reading_downgrades_and_lets_queued_readers_in() {
    let s = server();
    let mut c = s.client();
    let tw = grant(&mut c, "rw", "WRITE", "w", &[]);
    assert_eq!(grant(&mut c, "rw", "READ", "w", &[]), tw);
    let r1 = block_acquire(&s, "rw", "READ", "r1", "5000");
    wait_parked(&mut c, 1);
    let r2 = block_acquire(&s, "rw", "READ", "r2", "5000");
    wait_parked(&mut c, 2);
    let w2 = block_acquire(&s, "rw", "WRITE", "w2", "5000");
    wait_parked(&mut c, 3);
    sleep(Duration::from_millis(100));
    assert_waiting(&r1, "r1 behind the writer");
    assert_waiting(&r2, "r2 behind the writer");

    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 0);
    let t1 = granted_at_once(r1, "r1 after the downgrade");
    let t2 = granted_at_once(r2, "r2 after the downgrade");
    assert!(tw < t1 && t1 < t2, "tokens {tw} {t1} {t2}");
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "mode").as_deref(), Some("read"));
    assert_eq!(field_str(&info, "writer"), None);
    assert_eq!(field_int(&info, "writer_holds"), 0);
    assert_eq!(field(&info, "writer_token"), Value::Nil);
    assert_eq!(
        reader_ids(&info),
        [
            ("r1".to_string(), 1, t1),
            ("r2".to_string(), 1, t2),
            ("w".to_string(), 1, tw),
        ]
    );
    assert_eq!(field_int(&info, "waiters"), 1);

    // The downgraded owner holds only READ now: taking WRITE back is an upgrade.
    assert!(error(&mut c, &["RWLOCK.ACQUIRE", "rw", "WRITE", "w"]).starts_with("ERR"));
    // The queued writer still waits for every reader.
    assert_eq!(release(&mut c, "rw", "READ", "w"), 0);
    assert_eq!(release(&mut c, "rw", "READ", "r1"), 0);
    sleep(Duration::from_millis(100));
    assert_waiting(&w2, "w2 while r2 reads");
    assert_eq!(release(&mut c, "rw", "READ", "r2"), 0);
    let t3 = granted_at_once(w2, "w2 after the last reader");
    assert!(t3 > t2);
}

/// A downgrade makes room for readers: clients on the unlock channel (which
/// cannot park a connection) are told, as on any release that frees room.
#[test]
fn a_downgrade_is_published_on_the_unlock_channel() {
    let s = server();
    let mut c = s.client();
    let mut sub = s.client();
    sub.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("__rlock@0__:dg").unwrap();
    grant(&mut c, "dg", "WRITE", "a", &[]);
    grant(&mut c, "dg", "READ", "a", &[]);
    assert!(is_nil(&mut c, &["RWLOCK.ACQUIRE", "dg", "READ", "b"]));
    assert_eq!(release(&mut c, "dg", "WRITE", "a"), 0);
    let m = ps.get_message().unwrap();
    assert_eq!(m.get_payload::<String>().unwrap(), "released");
    // b, retrying on the message, gets in next to a's READ.
    grant(&mut c, "dg", "READ", "b", &[]);
}
#[test]
fn upgrade_is_refused_even_with_block_and_changes_nothing() {
    let s = server();
    let mut c = s.client();
    // Sole reader, then one of two readers.
    for others in [&[][..], &["r2"][..]] {
        let key = format!("rw{}", others.len());
        let key = key.as_str();
        let t = grant(&mut c, key, "READ", "r", &["PX", "60000"]);
        for o in others {
            grant(&mut c, key, "READ", o, &["PX", "60000"]);
        }
        let before = rw_info(&mut c, key);
        let digest_before = digest_value(&mut c, key);
        let pttl_before = pttl(&mut c, key);

        let e = error(&mut c, &["RWLOCK.ACQUIRE", key, "WRITE", "r"]);
        assert!(e.starts_with("ERR"), "upgrade without BLOCK: {e}");
        let start = Instant::now();
        let e = error(
            &mut c,
            &[
                "RWLOCK.ACQUIRE",
                key,
                "WRITE",
                "r",
                "PX",
                "1000",
                "BLOCK",
                "2000",
            ],
        );
        assert!(e.starts_with("ERR"), "upgrade with BLOCK: {e}");
        assert!(start.elapsed() < AT_ONCE, "the refusal must not wait");
        let e = error(&mut c, &["RWLOCK.ACQUIRE", key, "WRITE", "r", "BLOCK", "0"]);
        assert!(e.starts_with("ERR"), "upgrade with BLOCK 0: {e}");

        assert_eq!(
            stat(&mut c, "waiters"),
            0,
            "the refused caller is not parked"
        );
        let after = rw_info(&mut c, key);
        assert_eq!(reader_ids(&after), reader_ids(&before));
        assert_eq!(field_str(&after, "writer"), None);
        assert_eq!(field_str(&after, "mode").as_deref(), Some("read"));
        assert_eq!(field_int(&after, "waiters"), 0);
        assert_eq!(digest_value(&mut c, key), digest_before, "state unchanged");
        assert!(
            pttl(&mut c, key) <= pttl_before,
            "lease not reset by the refusal"
        );
        // The reader still holds READ and may keep reentering it.
        assert_eq!(grant(&mut c, key, "READ", "r", &["PX", "60000"]), t);
    }
}

#[test]
fn each_reader_lease_is_its_own() {
    let s = server();
    let mut c = s.client();
    let t1 = grant(&mut c, "rw", "READ", "r1", &["PX", "200"]);
    let t2 = grant(&mut c, "rw", "READ", "r2", &["PX", "5000"]);
    let at0 = Instant::now();
    let info0 = rw_info(&mut c, "rw");
    let list0 = readers(&info0);
    assert_eq!(owners(&list0), ["r1", "r2"]);
    assert_eq!(reader(&list0, "r1").token, t1);
    let ttl1 = reader(&list0, "r1").ttl;
    let ttl2 = reader(&list0, "r2").ttl;
    assert!(ttl1 <= 200 && ttl1 > 0, "r1 ttl {ttl1}");
    assert!(ttl2 <= 5000 && ttl2 > 4000, "r2 ttl {ttl2}");
    assert_eq!(
        field_int(&info0, "ttl"),
        ttl2,
        "key ttl is the latest deadline"
    );

    let w = block_acquire(&s, "rw", "WRITE", "w", "10000");
    wait_parked(&mut c, 1);
    sleep(Duration::from_millis(400));

    // r1 expired on its own; r2's lease neither shortened nor extended.
    let info1 = rw_info(&mut c, "rw");
    let gap = at0.elapsed().as_millis() as i64;
    let list1 = readers(&info1);
    assert_eq!(owners(&list1), ["r2"], "r1 must have expired");
    let r2 = reader(&list1, "r2");
    assert_eq!((r2.holds, r2.token), (1, t2));
    assert!(
        r2.ttl <= ttl2 - 400 + 5 && r2.ttl >= ttl2 - gap - 5,
        "r2 ttl went from {ttl2} to {} over {gap} ms (at least 400)",
        r2.ttl
    );
    assert_eq!(field_int(&info1, "ttl"), r2.ttl);
    let key_ttl = pttl(&mut c, "rw");
    assert!(
        key_ttl <= r2.ttl + 5 && key_ttl > r2.ttl - 500,
        "PTTL {key_ttl}"
    );
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "r1"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["RWLOCK.RENEW", "rw", "r1"]).starts_with("NOTOWNER"));
    assert!(stat(&mut c, "lease_expirations") >= 1);

    // The writer waits for r2, not only for r1.
    assert_waiting(&w, "the writer while r2 still reads");
    assert_eq!(stat(&mut c, "waiters"), 1);
    assert_eq!(field_int(&info1, "waiters"), 1);
    assert_eq!(release(&mut c, "rw", "READ", "r2"), 0);
    let tw = granted_at_once(w, "the writer after r2 released");
    assert!(tw > t2);
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&info, "writer_token"), tw);
    assert!(readers(&info).is_empty());
}

#[test]
fn queued_writer_gets_the_lock_when_readers_leave_and_stops_later_readers() {
    let s = server();
    let mut c = s.client();
    let t1 = grant(&mut c, "rw", "READ", "r1", &[]);
    let t2 = grant(&mut c, "rw", "READ", "r2", &[]);
    let w = block_acquire(&s, "rw", "WRITE", "w", "10000");
    wait_parked(&mut c, 1);

    // A newcomer reader does not overtake the queued writer.
    assert_eq!(acquire(&mut c, "rw", "READ", "r3", &[]), None);
    assert_eq!(readers(&rw_info(&mut c, "rw")).len(), 2);
    // A current reader reenters regardless of the queue.
    assert_eq!(grant(&mut c, "rw", "READ", "r1", &[]), t1);
    // A blocking newcomer queues behind the writer.
    let r4 = block_acquire(&s, "rw", "READ", "r4", "10000");
    wait_parked(&mut c, 2);
    assert_eq!(field_int(&rw_info(&mut c, "rw"), "waiters"), 2);

    assert_eq!(release(&mut c, "rw", "READ", "r1"), 1);
    assert_eq!(release(&mut c, "rw", "READ", "r1"), 0);
    sleep(Duration::from_millis(100));
    assert_waiting(&w, "the writer while r2 reads");
    assert_waiting(&r4, "r4 behind the writer");

    assert_eq!(release(&mut c, "rw", "READ", "r2"), 0);
    let tw = granted_at_once(w, "the writer after the readers left");
    assert!(tw > t2);
    sleep(Duration::from_millis(100));
    assert_waiting(&r4, "r4 while the writer holds");
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "mode").as_deref(), Some("write"));
    assert_eq!(field_str(&info, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&info, "waiters"), 1);
    assert_eq!(stat(&mut c, "waiters"), 1);

    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 0);
    let t4 = granted_at_once(r4, "r4 after the writer");
    assert!(t4 > tw);
    assert_eq!(
        reader_ids(&rw_info(&mut c, "rw")),
        [("r4".to_string(), 1, t4)]
    );
}

#[test]
fn consecutive_queued_readers_are_granted_together() {
    let s = server();
    let mut c = s.client();
    let tw = grant(&mut c, "rw", "WRITE", "w", &[]);
    let mut queued = Vec::new();
    for (i, owner) in ["r1", "r2", "r3"].into_iter().enumerate() {
        queued.push(block_acquire(&s, "rw", "READ", owner, "5000"));
        wait_parked(&mut c, i as i64 + 1);
    }
    let w2 = block_acquire(&s, "rw", "WRITE", "w2", "5000");
    wait_parked(&mut c, 4);
    let r4 = block_acquire(&s, "rw", "READ", "r4", "5000");
    wait_parked(&mut c, 5);
    sleep(Duration::from_millis(100));
    assert!(
        queued.iter().all(|h| !h.is_finished()),
        "readers answered while written"
    );

    assert_eq!(release(&mut c, "rw", "WRITE", "w"), 0);
    let tokens: Vec<i64> = queued
        .into_iter()
        .zip(["r1", "r2", "r3"])
        .map(|(h, owner)| granted_at_once(h, owner))
        .collect();
    assert!(
        tw < tokens[0] && tokens[0] < tokens[1] && tokens[1] < tokens[2],
        "{tokens:?}"
    );
    let info = rw_info(&mut c, "rw");
    assert_eq!(field_str(&info, "mode").as_deref(), Some("read"));
    assert_eq!(
        reader_ids(&info),
        [
            ("r1".to_string(), 1, tokens[0]),
            ("r2".to_string(), 1, tokens[1]),
            ("r3".to_string(), 1, tokens[2]),
        ]
    );
    // The run stops at the queued writer; the reader behind it keeps waiting.
    assert_eq!(field_int(&info, "waiters"), 2);
    assert_eq!(stat(&mut c, "waiters"), 2);
    sleep(Duration::from_millis(100));
    assert_waiting(&w2, "w2 while the readers hold");
    assert_waiting(&r4, "r4 behind w2");

    assert_eq!(release(&mut c, "rw", "READ", "r1"), 0);
    assert_eq!(release(&mut c, "rw", "READ", "r2"), 0);
    sleep(Duration::from_millis(100));
    assert_waiting(&w2, "w2 while r3 reads");
    assert_eq!(release(&mut c, "rw", "READ", "r3"), 0);
    let t5 = granted_at_once(w2, "w2 after the readers");
    assert!(t5 > tokens[2]);
    sleep(Duration::from_millis(100));
    assert_waiting(&r4, "r4 while w2 writes");
    assert_eq!(release(&mut c, "rw", "WRITE", "w2"), 0);
    let t6 = granted_at_once(r4, "r4 after w2");
    assert!(t6 > t5);
}

#[test]
fn renew_resets_every_hold_of_the_owner() {
    let s = server();
    let mut c = s.client();
    grant(&mut c, "rw", "READ", "r1", &["PX", "1000"]);
    grant(&mut c, "rw", "READ", "r2", &["PX", "1000"]);
    assert!(pttl(&mut c, "rw") <= 1000);

    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw", "r1", "PX", "10000"]), 1);
    let key_ttl = pttl(&mut c, "rw");
    assert!(key_ttl > 9000 && key_ttl <= 10000, "PTTL grew to {key_ttl}");
    let list = readers(&rw_info(&mut c, "rw"));
    assert!(reader(&list, "r1").ttl > 9000);
    assert!(reader(&list, "r2").ttl <= 1000, "r2's lease is its own");

    // Without PX/EX: the default lease (30 s); EX in seconds; shorter is allowed.
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw", "r1"]), 1);
    assert!(pttl(&mut c, "rw") > 29000);
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw", "r1", "EX", "60"]), 1);
    assert!(pttl(&mut c, "rw") > 59000);
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw", "r1", "PX", "2000"]), 1);
    let key_ttl = pttl(&mut c, "rw");
    assert!(
        key_ttl <= 2000 && key_ttl > 1000,
        "renewed shorter: PTTL {key_ttl}"
    );

    // A renewed hold outlives its first lease.
    grant(&mut c, "rw2", "READ", "r", &["PX", "300"]);
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw2", "r", "PX", "5000"]), 1);
    sleep(Duration::from_millis(500));
    assert_eq!(owners(&readers(&rw_info(&mut c, "rw2"))), ["r"]);

    // A writer that also reads: both holds move with one renew.
    let tw = grant(&mut c, "rw3", "WRITE", "w", &["PX", "1000"]);
    grant(&mut c, "rw3", "READ", "w", &["PX", "1000"]);
    assert_eq!(int(&mut c, &["RWLOCK.RENEW", "rw3", "w", "PX", "20000"]), 1);
    let info = rw_info(&mut c, "rw3");
    assert!(field_int(&info, "ttl") > 19000);
    assert!(reader(&readers(&info), "w").ttl > 19000);
    assert_eq!(field_int(&info, "writer_token"), tw);
    assert!(pttl(&mut c, "rw3") > 19000);

    // Non-holders and missing keys.
    assert!(error(&mut c, &["RWLOCK.RENEW", "rw", "nobody"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["RWLOCK.RENEW", "missing", "r1"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["RWLOCK.RENEW", "rw3", "r1", "PX", "5000"]).starts_with("NOTOWNER"));
    assert_eq!(int(&mut c, &["EXISTS", "missing"]), 0);
}

fn check_info_fields(s: &Server, c: &mut Connection, key: &str) {
    assert!(
        info_map(c, &["RWLOCK.INFO", key]).is_none(),
        "nil when no lock"
    );

    // Write mode: a reentrant writer that also reads, and a queued reader.
    let tw = grant(c, key, "WRITE", "w", &["PX", "10000"]);
    grant(c, key, "WRITE", "w", &["PX", "10000"]);
    grant(c, key, "READ", "w", &["PX", "10000"]);
    let r = block_acquire(s, key, "READ", "r", "5000");
    wait_parked(c, 1);
    let info = rw_info(c, key);
    let names: Vec<&str> = info.iter().map(|(k, _)| k.as_str()).collect();
    for name in [
        "kind",
        "mode",
        "writer",
        "writer_holds",
        "writer_token",
        "readers",
        "ttl",
        "waiters",
    ] {
        assert!(names.contains(&name), "INFO lacks {name}: {names:?}");
    }
    assert_eq!(field_str(&info, "kind").as_deref(), Some("rwlock"));
    assert_eq!(field_str(&info, "mode").as_deref(), Some("write"));
    assert_eq!(field_str(&info, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&info, "writer_holds"), 2);
    assert_eq!(field_int(&info, "writer_token"), tw);
    let list = readers(&info);
    assert_eq!(owners(&list), ["w"]);
    assert_eq!((list[0].holds, list[0].token), (1, tw));
    assert!(list[0].ttl > 9000 && list[0].ttl <= 10000);
    let ttl = field_int(&info, "ttl");
    assert!(ttl > 9000 && ttl <= 10000, "ttl {ttl}");
    assert_eq!(field_int(&info, "waiters"), 1);

    // Read mode: readers with their own holds, tokens and ttls; ttl is the latest.
    assert_eq!(release(c, key, "WRITE", "w"), 1);
    assert_eq!(release(c, key, "WRITE", "w"), 0);
    assert_eq!(release(c, key, "READ", "w"), 0);
    let tr = granted_at_once(r, "queued reader after the writer left");
    grant(c, key, "READ", "r", &["PX", "20000"]);
    let t2 = grant(c, key, "READ", "r2", &["PX", "40000"]);
    let info = rw_info(c, key);
    assert_eq!(field_str(&info, "kind").as_deref(), Some("rwlock"));
    assert_eq!(field_str(&info, "mode").as_deref(), Some("read"));
    assert_eq!(field(&info, "writer"), Value::Nil);
    assert_eq!(field_int(&info, "writer_holds"), 0);
    assert_eq!(field(&info, "writer_token"), Value::Nil);
    assert_eq!(field_int(&info, "waiters"), 0);
    let list = readers(&info);
    assert_eq!(owners(&list), ["r", "r2"]);
    assert_eq!((list[0].holds, list[0].token), (2, tr));
    assert_eq!((list[1].holds, list[1].token), (1, t2));
    assert!(list[0].ttl > 19000 && list[0].ttl <= 20000, "{list:?}");
    assert!(list[1].ttl > 39000 && list[1].ttl <= 40000, "{list:?}");
    assert_eq!(field_int(&info, "ttl"), list[1].ttl);

    // Nested reader entries have exactly the documented fields.
    let Value::Array(entries) = field(&info, "readers") else {
        panic!("readers is not an array");
    };
    for entry in &entries {
        let keys: Vec<String> = pairs(entry).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["owner", "holds", "token", "ttl", "keepalive"]);
    }

    assert_eq!(int(c, &["RWLOCK.FORCERELEASE", key]), 1);
    assert!(info_map(c, &["RWLOCK.INFO", key]).is_none());
}

#[test]
fn info_reports_every_field_in_resp2_and_resp3() {
    let s = server();
    let mut c2 = s.client();
    check_info_fields(&s, &mut c2, "rw2");
    let mut c3 = s.client_resp3();
    check_info_fields(&s, &mut c3, "rw3");
    // RESP3 gives maps, at the top level and for each reader.
    grant(&mut c3, "rw3", "READ", "r", &[]);
    match call(&mut c3, &["RWLOCK.INFO", "rw3"]).unwrap() {
        Value::Map(top) => {
            let readers = top
                .iter()
                .find(|(k, _)| as_string(k) == "readers")
                .map(|(_, v)| v.clone())
                .expect("readers");
            match readers {
                Value::Array(entries) => {
                    assert!(matches!(entries[0], Value::Map(_)), "{entries:?}")
                }
                other => panic!("readers: {other:?}"),
            }
        }
        other => panic!("RESP3 INFO is not a map: {other:?}"),
    }
    // RESP2 gives flat arrays.
    match call(&mut c2, &["RWLOCK.INFO", "rw3"]).unwrap() {
        Value::Array(top) => {
            let i = top
                .iter()
                .position(|v| matches!(v, Value::BulkString(b) if b == b"readers"))
                .expect("readers");
            match &top[i + 1] {
                Value::Array(entries) => {
                    assert!(matches!(entries[0], Value::Array(_)), "{entries:?}")
                }
                other => panic!("readers: {other:?}"),
            }
        }
        other => panic!("RESP2 INFO is not a flat array: {other:?}"),
    }
}

#[test]
fn forcerelease_ends_every_hold_and_serves_waiters() {
    let s = server();
    let mut c = s.client();
    assert_eq!(int(&mut c, &["RWLOCK.FORCERELEASE", "rw"]), 0);
    let t1 = grant(&mut c, "rw", "READ", "r1", &[]);
    grant(&mut c, "rw", "READ", "r2", &[]);
    let w = block_acquire(&s, "rw", "WRITE", "w", "5000");
    wait_parked(&mut c, 1);
    assert_eq!(int(&mut c, &["RWLOCK.FORCERELEASE", "rw"]), 1);
    let tw = granted_at_once(w, "the writer after FORCERELEASE");
    assert!(tw > t1);
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "r1"]).starts_with("NOTOWNER"));
    assert_eq!(
        field_str(&rw_info(&mut c, "rw"), "writer").as_deref(),
        Some("w")
    );
    assert_eq!(int(&mut c, &["RWLOCK.FORCERELEASE", "rw"]), 1);
    assert_eq!(int(&mut c, &["RWLOCK.FORCERELEASE", "rw"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "rw"]), 0);
}

#[test]
fn debug_reload_keeps_readers_with_their_own_deadlines_and_tokens() {
    let s = server();
    let mut c = s.client();
    let t1 = grant(&mut c, "rw", "READ", "r1", &["PX", "60000"]);
    let t2 = grant(&mut c, "rw", "READ", "r2", &["PX", "120000"]);
    assert_eq!(grant(&mut c, "rw", "READ", "r2", &["PX", "120000"]), t2);
    let t3 = grant(&mut c, "rw", "READ", "r3", &["EX", "300"]);
    let tw = grant(&mut c, "wr", "WRITE", "w", &["PX", "90000"]);
    grant(&mut c, "wr", "READ", "w", &["PX", "90000"]);

    let digest_before = digest(&mut c);
    let before = rw_info(&mut c, "rw");
    let w_before = rw_info(&mut c, "wr");
    let at = Instant::now();
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    let gap = at.elapsed().as_millis() as i64;
    assert_eq!(
        digest(&mut c),
        digest_before,
        "DEBUG DIGEST changed across DEBUG RELOAD"
    );

    let after = rw_info(&mut c, "rw");
    assert_eq!(
        reader_ids(&after),
        [
            ("r1".to_string(), 1, t1),
            ("r2".to_string(), 2, t2),
            ("r3".to_string(), 1, t3),
        ]
    );
    for (b, a) in readers(&before).iter().zip(readers(&after).iter()) {
        assert!(
            a.ttl <= b.ttl && a.ttl >= b.ttl - gap - 200,
            "{}: ttl {} -> {} across the reload",
            a.owner,
            b.ttl,
            a.ttl
        );
    }
    assert_eq!(field_int(&after, "waiters"), 0);
    let w_after = rw_info(&mut c, "wr");
    assert_eq!(field_str(&w_after, "writer").as_deref(), Some("w"));
    assert_eq!(field_int(&w_after, "writer_holds"), 1);
    assert_eq!(field_int(&w_after, "writer_token"), tw);
    assert_eq!(reader_ids(&w_after), reader_ids(&w_before));
    let key_ttl = pttl(&mut c, "rw");
    assert!(
        key_ttl > 299_000 - gap && key_ttl <= 300_000,
        "PTTL {key_ttl}"
    );

    // Still enforced, and tokens keep growing.
    assert_eq!(acquire(&mut c, "rw", "WRITE", "x", &[]), None);
    assert_eq!(acquire(&mut c, "wr", "READ", "x", &[]), None);
    assert_eq!(grant(&mut c, "rw", "READ", "r1", &[]), t1);
    let t4 = grant(&mut c, "rw", "READ", "r4", &[]);
    assert!(t4 > t1.max(t2).max(t3).max(tw), "{t4} after the reload");
}

#[test]
fn replica_holds_identical_readers_and_tokens() {
    let master = server();
    let replica = server();
    let mut m = master.client();
    // r1 reaches the replica through the initial sync, the rest through the stream.
    let t1 = grant(&mut m, "rw", "READ", "r1", &["PX", "60000"]);
    replica.replicate_from(&master);
    let mut r = replica.client();
    let t2 = grant(&mut m, "rw", "READ", "r2", &["PX", "90000"]);
    assert_eq!(grant(&mut m, "rw", "READ", "r2", &["PX", "90000"]), t2);
    // r3's lease ends during the test; under valgrind (~20x slower) it gets
    // more time, or it could end between reading the master's and the replica's digest.
    let r3_lease = if valgrind() { "8000" } else { "1500" };
    let t3 = grant(&mut m, "rw", "READ", "r3", &["PX", r3_lease]);
    let tw = grant(&mut m, "wr", "WRITE", "w", &["PX", "30000"]);
    grant(&mut m, "wr", "READ", "w", &["PX", "45000"]);

    let compare = |m: &mut Connection, r: &mut Connection, expected: &[(&str, i64, i64)]| {
        let acked = int(m, &["WAIT", "1", "1000"]);
        assert!(acked >= 1, "WAIT 1 1000 acknowledged by {acked}");
        let mi = rw_info(m, "rw");
        let ri = rw_info(r, "rw");
        let expected: Vec<(String, i64, i64)> = expected
            .iter()
            .map(|(o, h, t)| (o.to_string(), *h, *t))
            .collect();
        assert_eq!(reader_ids(&mi), expected);
        assert_eq!(reader_ids(&ri), expected, "replica readers");
        for (a, b) in readers(&mi).iter().zip(readers(&ri).iter()) {
            assert!(
                (a.ttl - b.ttl).abs() <= 200,
                "{}: ttl {} vs {}",
                a.owner,
                a.ttl,
                b.ttl
            );
        }
        let mw = rw_info(m, "wr");
        let rw = rw_info(r, "wr");
        for name in ["writer", "writer_holds", "writer_token", "mode"] {
            assert_eq!(field(&rw, name), field(&mw, name), "replica {name}");
        }
        assert_eq!(reader_ids(&rw), reader_ids(&mw));
        assert_eq!(digest(r), digest(m), "DEBUG DIGEST of replica and master");
    };
    compare(
        &mut m,
        &mut r,
        &[("r1", 1, t1), ("r2", 2, t2), ("r3", 1, t3)],
    );
    let mw = rw_info(&mut m, "wr");
    assert_eq!(field_int(&mw, "writer_token"), tw);

    // The master's release and r3's own expiry reach the replica as well.
    assert_eq!(release(&mut m, "rw", "READ", "r1"), 0);
    // INFO shows a hold past its deadline as gone at once; the lease timer
    // ends it (and replicates that) a moment later: wait for the end itself.
    wait_until(Duration::from_secs(15), || {
        readers(&rw_info(&mut m, "rw")).len() == 1 && stat(&mut m, "lease_expirations") == 1
    });
    compare(&mut m, &mut r, &[("r2", 2, t2)]);

    // The replica rejects writes.
    let e = error(&mut r, &["RWLOCK.ACQUIRE", "rw", "READ", "x"]);
    assert!(e.starts_with("READONLY"), "{e}");
}

/// xorshift64*: a small PRNG so the test needs no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        (self.next() >> 33) % n
    }
}

#[test]
fn sixteen_clients_mixing_readers_and_writers_stay_consistent() {
    const CLIENTS: usize = 16;
    const ITERATIONS: usize = 13; // 208 in all
    let s = server();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("stress seed {seed}");
    let mut c = s.client();
    let workers: Vec<JoinHandle<(u64, u64)>> = (0..CLIENTS)
        .map(|i| {
            let mut conn = s.client();
            let mut rng =
                Rng(seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(i as u64 + 1)) | 1);
            std::thread::spawn(move || {
                let owner = format!("client-{i}");
                let (mut writes, mut reads) = (0u64, 0u64);
                let get = |conn: &mut Connection, key: &str| -> i64 {
                    let v: Option<i64> = cmd("GET").arg(key).query(conn).unwrap();
                    v.unwrap_or(0)
                };
                for n in 0..ITERATIONS {
                    let write = rng.below(100) < 40;
                    let mode = if write { "WRITE" } else { "READ" };
                    let token = acquire(
                        &mut conn,
                        "rw",
                        mode,
                        &owner,
                        &["PX", "2000", "BLOCK", "5000"],
                    )
                    .unwrap_or_else(|| {
                        panic!("{owner} iteration {n}: {mode} not granted within 5 s")
                    });
                    if write {
                        // Non-atomic read-modify-write, safe only under WRITE.
                        let fence = get(&mut conn, "fence");
                        assert!(
                            token > fence,
                            "{owner}: token {token} not above the last writer's {fence}"
                        );
                        let v = get(&mut conn, "counter");
                        sleep(Duration::from_millis(1 + rng.below(2)));
                        let _: () = cmd("SET")
                            .arg("counter")
                            .arg(v + 1)
                            .query(&mut conn)
                            .unwrap();
                        let _: () = cmd("SET").arg("fence").arg(token).query(&mut conn).unwrap();
                        writes += 1;
                    } else {
                        let a = get(&mut conn, "counter");
                        sleep(Duration::from_millis(1 + rng.below(3)));
                        let b = get(&mut conn, "counter");
                        assert_eq!(a, b, "{owner}: counter changed while it held READ");
                        reads += 1;
                    }
                    assert_eq!(
                        release(&mut conn, "rw", mode, &owner),
                        0,
                        "{owner} {mode} release"
                    );
                }
                (writes, reads)
            })
        })
        .collect();
    let (mut writes, mut reads) = (0, 0);
    for w in workers {
        let (wr, rd) = w.join().expect("a client failed (see its panic above)");
        writes += wr;
        reads += rd;
    }
    assert_eq!(writes + reads, (CLIENTS * ITERATIONS) as u64);
    assert!(writes > 0 && reads > 0, "{writes} writes, {reads} reads");
    let counter: i64 = cmd("GET").arg("counter").query(&mut c).unwrap();
    assert_eq!(
        counter, writes as i64,
        "lost updates: every writer increments once"
    );
    assert_eq!(
        int(&mut c, &["EXISTS", "rw"]),
        0,
        "the lock is free at the end"
    );
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn info_count_caps_the_lists_not_the_counts() {
    let s = Server::start();
    let mut c = s.client();
    for i in 0..50 {
        int(
            &mut c,
            &[
                "RWLOCK.ACQUIRE",
                "rw",
                "READ",
                &format!("r{i}"),
                "PX",
                "60000",
            ],
        );
    }
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw", "COUNT", "3"]).unwrap();
    match field(&info, "readers") {
        Value::Array(r) => assert_eq!(r.len(), 3),
        other => panic!("{other:?}"),
    }
    assert_eq!(as_int(&field(&info, "reader_count")), 50);
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw", "count", "0"]).unwrap();
    assert!(matches!(field(&info, "readers"), Value::Array(r) if r.is_empty()));
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw"]).unwrap();
    assert!(matches!(field(&info, "readers"), Value::Array(r) if r.len() == 50));

    int(&mut c, &["FAIRLOCK.ACQUIRE", "f", "holder"]);
    let mut waiters = Vec::new();
    for i in 0..5 {
        let owner = format!("w{i}");
        waiters.push(spawn_call(
            &s,
            &["FAIRLOCK.ACQUIRE", "f", &owner, "BLOCK", "5000"],
        ));
        wait_parked(&mut c, i + 1);
    }
    let info = info_map(&mut c, &["FAIRLOCK.INFO", "f", "COUNT", "2"]).unwrap();
    assert_eq!(as_int(&field(&info, "waiters")), 5);
    match field(&info, "queue") {
        Value::Array(q) => assert_eq!(q.iter().map(as_string).collect::<Vec<_>>(), ["w0", "w1"]),
        other => panic!("{other:?}"),
    }
    for bad in [
        &["COUNT", "-1"][..],
        &["COUNT", "x"],
        &["LIMIT", "2"],
        &["COUNT"],
    ] {
        let mut args = vec!["RWLOCK.INFO", "rw"];
        args.extend_from_slice(bad);
        let e = error(&mut c, &args);
        assert!(e.starts_with("ERR"), "{bad:?}: {e}");
    }
    int(&mut c, &["FAIRLOCK.FORCERELEASE", "f"]);
    for _ in 0..5 {
        int(&mut c, &["FAIRLOCK.FORCERELEASE", "f"]);
    }
    for w in waiters {
        w.join().unwrap().0.unwrap();
    }
}
