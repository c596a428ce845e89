//! Replicated effects are deltas about single holders: a replica and an AOF
//! replay end in exactly the master's state after thousands of per-holder
//! changes on a many-holder lock; a change costs bytes in proportion to itself,
//! not to the holders; AOF files of the previous format still load; a delta
//! that does not fit the key is refused and leaves it as it was.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

fn repl_offset(c: &mut Connection, field_name: &str) -> i64 {
    let info: String = cmd("INFO").arg("replication").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field_name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field_name} in {info}"))
}

/// Waits until the replica has processed everything the master sent.
fn caught_up(m: &mut Connection, r: &mut Connection) {
    let target = repl_offset(m, "master_repl_offset");
    wait_until(Duration::from_secs(10), || {
        repl_offset(r, "slave_repl_offset") >= target
    });
}

fn pipe_all(c: &mut Connection, commands: &[Vec<String>]) {
    for chunk in commands.chunks(500) {
        let mut p = redis::pipe();
        for args in chunk {
            let mut one = cmd(&args[0]);
            args[1..].iter().for_each(|a| {
                one.arg(a);
            });
            p.add_command(one);
        }
        let _: Vec<Value> = p.query(c).unwrap();
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A seeded walk over grants, reentrant grants, releases, renewals and short
/// leases on one read-write key with hundreds of readers, plus a writer key.
fn mixed_changes(n: usize, seed: u64) -> Vec<Vec<String>> {
    let mut x = seed;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    (0..n)
        .map(|_| {
            // Half the owners in Redisson's `<uuid>:<threadId>` form, which a
            // one-holder lock keeps packed (lock/compact.rs).
            let id = rnd(600);
            let owner = match id % 2 {
                0 => format!("6b1c0d2e-3f4a-4b5c-8d6e-{id:012x}:{}", id % 7),
                _ => format!("reader-{id}"),
            };
            match rnd(10) {
                0..=3 => strings(&["RWLOCK.ACQUIRE", "rw", "READ", &owner, "PX", "600000"]),
                4 => strings(&["RWLOCK.ACQUIRE", "rw", "READ", &owner, "PX", "40"]),
                5 | 6 => strings(&["RWLOCK.RELEASE", "rw", "READ", &owner]),
                7 => strings(&["RWLOCK.RENEW", "rw", &owner, "PX", "500000"]),
                8 => strings(&["RLOCK.ACQUIRE", "x", &owner, "PX", "600000"]),
                _ => strings(&["RLOCK.RELEASE", "x", &owner]),
            }
        })
        .collect()
}

#[test]
fn replica_and_aof_replay_reach_the_masters_state() {
    let mut master = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "yes",
            // Written before each reply; a SIGKILL loses nothing the OS has.
            "--appendfsync",
            "no",
            "--aof-use-rdb-preamble",
            "no",
        ],
        &[],
    );
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    for (round, seed) in [7u64, 11, 13].into_iter().enumerate() {
        // One by one: NOTOWNER replies are part of the walk.
        for change in mixed_changes(3000, seed) {
            let args: Vec<&str> = change.iter().map(String::as_str).collect();
            let _ = call(&mut m, &args);
        }
        // Let the short leases run out: the master expires those readers itself.
        sleep(Duration::from_millis(150));
        if round == 1 {
            int(
                &mut m,
                &["RWLOCK.ACQUIRE", "rw", "READ", "late", "PX", "600000"],
            );
        }
    }
    wait_until(Duration::from_secs(5), || {
        stat(&mut m, "lease_expirations") > 0 && stat(&mut m, "lease_schedule") <= 1
    });
    let readers = match field(
        &info_map(&mut m, &["RWLOCK.INFO", "rw"]).unwrap(),
        "readers",
    ) {
        Value::Array(a) => a.len(),
        other => panic!("{other:?}"),
    };
    assert!(readers > 100, "only {readers} readers left");
    caught_up(&mut m, &mut r);
    let state = digest(&mut m);
    assert_eq!(digest(&mut r), state, "the replica differs from the master");

    // The AOF holds the same deltas: a restart from it gives the same state.
    master.kill();
    master.start_again();
    let mut m = master.client();
    assert_eq!(digest(&mut m), state, "AOF replay differs from the master");
    assert!(!master.log().contains("refused"), "{}", master.log());
}

#[test]
fn a_change_costs_bytes_for_itself_not_for_the_other_holders() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let big_owner = "o".repeat(1 << 20);
    let mut grants: Vec<Vec<String>> = (0..10_000)
        .map(|i| {
            strings(&[
                "RWLOCK.ACQUIRE",
                "rw",
                "READ",
                &format!("reader-{i}"),
                "PX",
                "600000",
            ])
        })
        .collect();
    grants.push(strings(&[
        "RWLOCK.ACQUIRE",
        "rw",
        "READ",
        &big_owner,
        "PX",
        "600000",
    ]));
    pipe_all(&mut m, &grants);
    caught_up(&mut m, &mut r);
    let changes: [&[&str]; 5] = [
        &["RWLOCK.ACQUIRE", "rw", "READ", "reader-5", "PX", "600000"],
        &["RWLOCK.RENEW", "rw", "reader-7", "PX", "700000"],
        &["RWLOCK.RENEW", "rw", &big_owner, "PX", "700000"],
        &["RWLOCK.RELEASE", "rw", "READ", "reader-9"],
        &["RWLOCK.RELEASE", "rw", "READ", &big_owner],
    ];
    for change in changes {
        let before = repl_offset(&mut m, "master_repl_offset");
        call(&mut m, change).unwrap();
        let bytes = repl_offset(&mut m, "master_repl_offset") - before;
        assert!(
            bytes <= 300,
            "{} bytes replicated for {:?}",
            bytes,
            &change[..3]
        );
    }
    caught_up(&mut m, &mut r);
    assert_eq!(digest(&mut m), digest(&mut r));
}

fn delta_new(kind: u8, token: u64, deadline: i64, owner: &[u8]) -> Vec<u8> {
    let mut d = vec![1, kind, b'N', b'w'];
    d.extend(token.to_le_bytes());
    d.extend(deadline.to_le_bytes());
    d.extend((owner.len() as u32).to_le_bytes());
    d.extend_from_slice(owner);
    d
}

/// One holder in the RDB form of a lock (a short raw owner, counts below 128).
fn encoded_holder(owner: &[u8], reads: u8, writes: u8, token: u64, deadline: i64) -> Vec<u8> {
    let mut d = vec![(owner.len() as u8) << 1];
    d.extend_from_slice(owner);
    d.extend([reads, writes]);
    d.extend(token.to_le_bytes());
    // The lease from the token's millisecond, zigzag varint.
    let lease = deadline - (token >> 20) as i64;
    let mut z = ((lease << 1) ^ (lease >> 63)) as u64;
    while z >= 0x80 {
        d.push(z as u8 | 0x80);
        z >>= 7;
    }
    d.push(z as u8);
    d
}

/// A whole lock of one writer as AOF rewrite writes it (a `W` step holding the
/// RDB form), `head` the delta's family and `body` the lock's.
fn delta_lock(head: u8, body: u8, token: u64, deadline: i64, owner: &[u8]) -> Vec<u8> {
    let mut d = vec![1, head, b'W', body, 1];
    d.extend(encoded_holder(owner, 0, 1, token, deadline));
    d
}

/// A whole lock of one writer as AOF rewrite wrote it before the `W` step:
/// the holder as an `S` step.
fn delta_whole(kind: u8, token: u64, deadline: i64, owner: &[u8]) -> Vec<u8> {
    let mut d = vec![1, kind, b'S'];
    d.extend(token.to_le_bytes());
    d.extend(deadline.to_le_bytes());
    d.extend(0u32.to_le_bytes());
    d.extend(1u32.to_le_bytes());
    d.extend((owner.len() as u32).to_le_bytes());
    d.extend_from_slice(owner);
    d
}

#[test]
fn old_aof_files_load_and_bad_deltas_change_nothing() {
    let now = unix_ms();
    let deadline = (now + 600_000).to_string();
    let token = ((now as u64) << 20).to_string();
    let token2 = (((now as u64) << 20) + 1).to_string();
    let mut aof = Vec::new();
    aof.extend(resp(&[b"SELECT", b"0"]));
    // The previous version replicated whole states with RLOCK.SETSTATE.
    aof.extend(resp(&[
        b"RLOCK.SETSTATE",
        b"old",
        b"rlock",
        b"1",
        b"a",
        b"0",
        b"2",
        token.as_bytes(),
        deadline.as_bytes(),
    ]));
    aof.extend(resp(&[b"PEXPIREAT", b"old", deadline.as_bytes()]));
    aof.extend(resp(&[
        b"RLOCK.SETSTATE",
        b"rw",
        b"rwlock",
        b"2",
        b"r1",
        b"1",
        b"0",
        token2.as_bytes(),
        deadline.as_bytes(),
        b"r2",
        b"3",
        b"0",
        b"77",
        deadline.as_bytes(),
    ]));
    aof.extend(resp(&[b"SET", b"plain", b"v"]));
    // Deltas that do not fit: a step for a holder that does not exist, a delta
    // for a string key, a delta of another lock family, garbage, a token far
    // beyond the clock. Each is refused and leaves its key as it was.
    let mut end_unknown = vec![1u8, 2, b'E'];
    end_unknown.extend(999u64.to_le_bytes());
    aof.extend(resp(&[b"RLOCK.DELTA", b"rw", &end_unknown]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"plain",
        &delta_new(0, 5, now + 1000, b"x"),
    ]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"old",
        &delta_new(1, 6, now + 1000, b"x"),
    ]));
    aof.extend(resp(&[b"RLOCK.DELTA", b"old", b"\x01\x00garbage"]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"far",
        &delta_new(0, u64::MAX / 2, now + 1000, b"x"),
    ]));
    // And one that fits: a new holder on a fresh key.
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"new",
        &delta_new(0, 42, now + 600_000, b"n"),
    ]));
    // A delta in the slots of a longer command (empty fillers after it), and
    // one whose filler is not empty: refused.
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"filled",
        &delta_new(0, 43, now + 600_000, b"f"),
        b"",
        b"",
    ]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"overfilled",
        &delta_new(0, 44, now + 600_000, b"o"),
        b"",
        b"x",
    ]));
    // Several changes in one `RLOCK.DELTAS` (a KEEPALIVE tick's renewals),
    // applied in turn: one refused (a string key) leaves the others applied;
    // one malformed, or a key without its delta, leaves every key as it was.
    let fresh = |token: u64, owner: &[u8]| delta_new(0, token, now + 600_000, owner);
    let (b1, b2, x, b3, b4) = (
        fresh(45, b"b1"),
        fresh(46, b"b2"),
        fresh(47, b"x"),
        fresh(48, b"b3"),
        fresh(49, b"b4"),
    );
    for args in [
        &[&b"batch1"[..], &b1, b"batch2", &b2][..],
        &[b"plain", &x, b"batch3", &b3],
        &[b"batch4", &b4, b"batch5", b"\x01\x00garbage"],
        &[b"batch6", &fresh(50, b"b6"), b"batch7"],
    ] {
        aof.extend(resp(&[&[&b"RLOCK.DELTAS"[..]][..], args].concat()));
    }
    // Rewritten locks: as this version writes them and as the one before did,
    // each with the PEXPIREAT Redis writes after it (the key's TTL).
    let (t3, t4) = (((now as u64) << 20) + 3, ((now as u64) << 20) + 4);
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"w",
        &delta_lock(0, 0, t3, now + 600_000, b"ow"),
    ]));
    aof.extend(resp(&[b"PEXPIREAT", b"w", deadline.as_bytes()]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"s",
        &delta_whole(0, t4, now + 600_000, b"os"),
    ]));
    aof.extend(resp(&[b"PEXPIREAT", b"s", deadline.as_bytes()]));
    // A rewritten read lock with two readers (not the packed one-holder form)
    // whose tokens are a day ahead of this clock: later grants go above them.
    let ahead = ((now as u64 + 86_400_000) << 20) + 5;
    let mut readers = vec![1u8, 2, b'W', 2, 2];
    readers.extend(encoded_holder(b"ra", 1, 0, ahead, now + 600_000));
    readers.extend(encoded_holder(b"rb", 2, 0, ahead + 1, now + 600_000));
    aof.extend(resp(&[b"RLOCK.DELTA", b"readers", &readers]));
    // A whole lock over a lock, of another family than its delta says, cut,
    // or with a token beyond the clock: refused too.
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"w",
        &delta_lock(0, 0, t3 + 10, now + 600_000, b"x"),
    ]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"mixed",
        &delta_lock(0, 1, t3 + 11, now + 600_000, b"x"),
    ]));
    let cut = delta_lock(0, 0, t3 + 12, now + 600_000, b"x");
    aof.extend(resp(&[b"RLOCK.DELTA", b"cut", &cut[..cut.len() - 1]]));
    aof.extend(resp(&[
        b"RLOCK.DELTA",
        b"far2",
        &delta_lock(0, 0, u64::MAX / 2, now + 600_000, b"x"),
    ]));

    // A semaphore's holding as an `S` step: after its `L` step (its limit)
    // it loads; alone it would make a semaphore without a limit, refused.
    let mut semaphore_holding = vec![b'S'];
    semaphore_holding.extend((t4 + 1).to_le_bytes());
    semaphore_holding.extend((now + 600_000).to_le_bytes());
    semaphore_holding.extend(3u32.to_le_bytes());
    semaphore_holding.extend(0u32.to_le_bytes());
    semaphore_holding.extend(1u32.to_le_bytes());
    semaphore_holding.push(b'a');
    let mut limited = vec![1, 3, b'L'];
    limited.extend(5u32.to_le_bytes());
    limited.extend(&semaphore_holding);
    aof.extend(resp(&[b"RLOCK.DELTA", b"sem-limited", &limited]));
    let mut unlimited = vec![1, 3];
    unlimited.extend(&semaphore_holding);
    aof.extend(resp(&[b"RLOCK.DELTA", b"sem-unlimited", &unlimited]));

    let s = Server::start_on_aof(&aof);
    let mut c = s.client();
    let info = info_map(&mut c, &["SEMAPHORE.INFO", "sem-limited"]).expect("L then S loads");
    assert_eq!(as_int(&field(&info, "limit")), 5);
    assert_eq!(as_int(&field(&info, "used")), 3);
    assert_eq!(int(&mut c, &["EXISTS", "sem-unlimited"]), 0);
    let info = info_map(&mut c, &["RLOCK.INFO", "old"]).expect("old SETSTATE loads");
    assert_eq!(as_string(&field(&info, "owner")), "a");
    assert_eq!(as_int(&field(&info, "holds")), 2);
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw"]).expect("old SETSTATE loads");
    match field(&info, "readers") {
        Value::Array(a) => assert_eq!(a.len(), 2),
        other => panic!("{other:?}"),
    }
    assert_eq!(as_string(&call(&mut c, &["GET", "plain"]).unwrap()), "v");
    assert_eq!(int(&mut c, &["EXISTS", "far"]), 0);
    assert_eq!(
        as_int(&field(
            &info_map(&mut c, &["RLOCK.INFO", "new"]).unwrap(),
            "token"
        )),
        42
    );
    for (key, owner, token) in [("w", "ow", t3), ("s", "os", t4)] {
        let info = info_map(&mut c, &["RLOCK.INFO", key]).expect("a rewritten lock loads");
        assert_eq!(as_string(&field(&info, "owner")), owner);
        assert_eq!(as_int(&field(&info, "token")), token as i64);
        let expires: i64 = cmd("PEXPIRETIME").arg(key).query(&mut c).unwrap();
        assert_eq!(expires.to_string(), deadline, "{key}");
    }
    let info = info_map(&mut c, &["RWLOCK.INFO", "readers"]).expect("rewritten readers load");
    match field(&info, "readers") {
        Value::Array(a) => assert_eq!(a.len(), 2),
        other => panic!("{other:?}"),
    }
    let after = int(&mut c, &["RLOCK.ACQUIRE", "after-readers", "z"]);
    assert!(after > (ahead + 1) as i64, "{after} after {}", ahead + 1);
    let info = info_map(&mut c, &["RLOCK.INFO", "filled"]).expect("a filled delta applies");
    assert_eq!(as_int(&field(&info, "token")), 43);
    for key in ["mixed", "cut", "far2", "overfilled"] {
        assert_eq!(int(&mut c, &["EXISTS", key]), 0, "{key}");
    }
    for (key, token) in [("batch1", 45), ("batch2", 46), ("batch3", 48)] {
        let info = info_map(&mut c, &["RLOCK.INFO", key]).expect("a batched delta applies");
        assert_eq!(as_int(&field(&info, "token")), token, "{key}");
    }
    for key in ["batch4", "batch5", "batch6", "batch7"] {
        assert_eq!(int(&mut c, &["EXISTS", key]), 0, "{key}");
    }
    let refused = s.log().matches("refused a replicated change").count();
    assert_eq!(refused, 13, "{}", s.log());
    // A refused step is logged with the steps and what the key held.
    let log = s.log();
    let over = log
        .lines()
        .find(|l| l.contains("change to key 'w'"))
        .expect("the refusal for 'w' is logged");
    let held = format!("here: Reentrant with 1 holder(s) [ow/{t3}/0/1/");
    assert!(
        over.contains("steps [Lock {") && over.contains(&held),
        "{over}"
    );
    // Later tokens are above everything loaded, and nothing was poisoned.
    let t = int(&mut c, &["RLOCK.ACQUIRE", "next", "z"]);
    assert!(t > token2.parse::<i64>().unwrap());
    // The internal commands stay refused from clients.
    let e = error(&mut c, &["RLOCK.DELTA", "x", "whatever"]);
    assert!(e.contains("internal"), "{e}");
    let e = error(&mut c, &["RLOCK.DELTAS", "x", "whatever"]);
    assert!(e.contains("internal"), "{e}");
}

/// A MONITOR connection to `s`.
fn monitor(s: &Server) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::{BufRead, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut ok = String::new();
    reader.read_line(&mut ok).unwrap();
    assert_eq!(ok, "+OK\r\n");
    reader
}

/// The next command MONITOR shows that names `prefix`, from its first argument.
fn monitored(reader: &mut std::io::BufReader<std::net::TcpStream>, prefix: &str) -> String {
    use std::io::BufRead;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("MONITOR went quiet");
        if let Some(at) = line.find(&format!("\"{prefix}")) {
            return line[at..].trim_end().to_string();
        }
    }
}

#[test]
fn a_command_is_seen_as_sent_and_its_delta_replicated_in_its_slots() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query(&mut m)
        .unwrap();
    let mut on_master = monitor(&master);
    let mut on_replica = monitor(&replica);
    let sent = ["RLOCK.ACQUIRE", "k", "owner", "PX", "600000"];
    int(&mut m, &sent);
    caught_up(&mut m, &mut r);

    // What the client sent is what MONITOR and the slowlog show.
    assert_eq!(
        monitored(&mut on_master, "RLOCK."),
        r#""RLOCK.ACQUIRE" "k" "owner" "PX" "600000""#
    );
    let log: Vec<Value> = cmd("SLOWLOG").arg("GET").arg(10).query(&mut m).unwrap();
    let logged: Vec<Vec<String>> = log
        .iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => match &fields[3] {
                Value::Array(args) => Some(args.iter().map(as_string).collect()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert!(
        logged.iter().any(|args| args == &sent),
        "slowlog: {logged:?}"
    );
    // The replica got the delta (a new holder: its owner last) in the
    // command's five slots, the two left over empty.
    let applied = monitored(&mut on_replica, "RLOCK.");
    assert!(
        applied.starts_with(r#""RLOCK.DELTA" "k" ""#) && applied.ends_with(r#"owner" "" """#),
        "{applied}"
    );
    assert_eq!(digest(&mut m), digest(&mut r));

    // A command without room for a delta (two slots) replicates it as a
    // plain `RLOCK.DELTA key delta` (a forced release is the one step `F`).
    int(&mut m, &["RLOCK.FORCERELEASE", "k"]);
    let applied = monitored(&mut on_replica, "RLOCK.");
    assert!(
        applied.starts_with(r#""RLOCK.DELTA" "k" ""#) && applied.ends_with(r#"F""#),
        "{applied}"
    );
    // A multi-key command's deltas take its slots in turn, one per key.
    let _: Value = cmd("RLOCK.ACQUIREALL")
        .arg(2)
        .arg("a")
        .arg("b")
        .arg("owner")
        .query(&mut m)
        .unwrap();
    for key in ["a", "b"] {
        let applied = monitored(&mut on_replica, "RLOCK.");
        assert!(
            applied.starts_with(&format!(r#""RLOCK.DELTA" "{key}" ""#))
                && applied.ends_with(r#"owner" "" """#),
            "{applied}"
        );
    }
    assert_eq!(
        monitored(&mut on_master, "RLOCK.ACQUIREALL"),
        r#""RLOCK.ACQUIREALL" "2" "a" "b" "owner""#
    );
    caught_up(&mut m, &mut r);
    assert_eq!(digest(&mut m), digest(&mut r));
}

#[test]
fn scripts_and_transactions_replicate_the_same_state() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let script = "local t = redis.call('RLOCK.ACQUIRE', KEYS[1], ARGV[1], 'PX', '600000') \
                  redis.call('RLOCK.ACQUIRE', KEYS[1], ARGV[1]) \
                  redis.call('RLOCK.RELEASE', KEYS[1], ARGV[1]) \
                  redis.call('RWLOCK.ACQUIRE', KEYS[2], 'READ', ARGV[1], 'PX', '600000') \
                  return t";
    let token: i64 = cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg("s")
        .arg("rw")
        .arg("o")
        .query(&mut m)
        .unwrap();
    assert!(token > 0);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("RLOCK.ACQUIRE")
        .arg("t")
        .arg("o")
        .arg("PX")
        .arg(600_000)
        .cmd("RLOCK.RENEW")
        .arg("t")
        .arg("o")
        .arg("PX")
        .arg(700_000)
        .cmd("SEMAPHORE.ACQUIRE")
        .arg("sem")
        .arg("o")
        .arg("LIMIT")
        .arg(3)
        .arg("PERMITS")
        .arg(1)
        .query(&mut m)
        .unwrap();
    assert_eq!(replies.len(), 3, "{replies:?}");
    caught_up(&mut m, &mut r);
    assert_eq!(digest(&mut m), digest(&mut r));
    let info = info_map(&mut r, &["RLOCK.INFO", "s"]).expect("the script's lock");
    assert_eq!(as_int(&field(&info, "token")), token);
    assert_eq!(as_int(&field(&info, "holds")), 1);
}

/// The number of times `name` ran on the server `c` is connected to.
fn calls(c: &mut Connection, name: &str) -> i64 {
    let stats: String = cmd("INFO").arg("commandstats").query(c).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// KEEPALIVE renewals a tick makes go out as one `RLOCK.DELTAS` per
/// database: a replica and its own replica (to which the first passes the
/// command on once, as it came) and the master's AOF end in the master's
/// state, holdings in two databases alike.
#[test]
fn a_ticks_renewals_go_out_as_one_deltas_per_database() {
    let master = Server::start_with(&["--appendonly", "yes", "--appendfsync", "no"], &[]);
    let replica = Server::start();
    replica.replicate_from(&master);
    let chained = Server::start();
    chained.replicate_from(&replica);
    let (mut m, mut r, mut c) = (master.client(), replica.client(), chained.client());
    let mut on_replica = monitor(&replica);
    // 40 holdings in db 0 and 40 in db 3, bound to one open connection.
    let mut holder = master.client();
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for db in ["0", "3"] {
        let _: () = cmd("SELECT").arg(db).query(&mut holder).unwrap();
        assert_eq!(acquire_keepalive(&mut holder, &keys, "o", 600).len(), 40);
    }
    // About seven renewal rounds (every 200 ms).
    sleep(Duration::from_millis(1500));
    let renewals = stat(&mut m, "keepalive_renewals");
    assert!(renewals >= 400, "{renewals} renewals");
    // Renewals the replica applied: many keys in one command (holdings bound
    // within a few ms of each other are renewed in one tick).
    let most = (0..20)
        .map(|_| monitored(&mut on_replica, "RLOCK.DELTAS"))
        .map(|applied| applied.matches(r#"" "k"#).count())
        .max();
    assert!(
        most >= Some(10),
        "at most {most:?} keys in one RLOCK.DELTAS"
    );
    // Writes paused: no more renewals, so every copy can be compared.
    pause_writes(&mut m, 10_000);
    let renewals = stat(&mut m, "keepalive_renewals");
    caught_up(&mut m, &mut r);
    caught_up(&mut r, &mut c);
    let batches = calls(&mut r, "rlock.deltas");
    assert!(
        batches >= 2 && renewals >= 10 * batches,
        "{renewals} renewals in {batches} RLOCK.DELTAS"
    );
    assert_eq!(
        calls(&mut c, "rlock.deltas"),
        batches,
        "passed on once each"
    );
    // `RLOCK.DELTA` carried the 80 grants only.
    assert_eq!(calls(&mut r, "rlock.delta"), 80);
    let expected = digest(&mut m);
    assert_eq!(digest(&mut r), expected);
    assert_eq!(digest(&mut c), expected);
    for db in ["0", "3"] {
        for conn in [&mut m, &mut r, &mut c] {
            let _: () = cmd("SELECT").arg(db).query(conn).unwrap();
            assert_eq!(int(conn, &["DBSIZE"]), 40, "db {db}");
        }
    }
    // The master's AOF, loaded again, gives the same state.
    let _: () = cmd("DEBUG").arg("LOADAOF").query(&mut m).unwrap();
    assert_eq!(digest(&mut m), expected);
    let _: () = cmd("CLIENT").arg("UNPAUSE").query(&mut m).unwrap();
    assert!(!master.log().contains("refused"), "{}", master.log());
    assert!(!replica.log().contains("refused"), "{}", replica.log());
}
