//! RDB, AOF and AOF rewrite give back the same lock state; holds whose lease
//! ran out while the server was down are gone; tokens never repeat.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

/// A mix of lock kinds and holders, with distinct deadlines and tokens.
fn populate(c: &mut Connection) -> Vec<i64> {
    vec![
        int(c, &["RLOCK.ACQUIRE", "r", "a", "PX", "600000"]),
        int(c, &["RLOCK.ACQUIRE", "r", "a", "PX", "500000"]),
        int(
            c,
            &["RLOCK.ACQUIRE", "{tag}r\x00bin", "owner\r\n", "EX", "700"],
        ),
        int(c, &["FAIRLOCK.ACQUIRE", "f", "x", "PX", "400000"]),
        int(c, &["RWLOCK.ACQUIRE", "rw", "READ", "r1", "PX", "300000"]),
        int(c, &["RWLOCK.ACQUIRE", "rw", "READ", "r2", "PX", "200000"]),
        int(c, &["RWLOCK.ACQUIRE", "rw", "READ", "r2", "PX", "250000"]),
    ]
}

fn assert_state(c: &mut Connection, tokens: &[i64]) {
    let info = info_map(c, &["RLOCK.INFO", "r"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "a");
    assert_eq!(as_int(&field(&info, "holds")), 2);
    assert_eq!(as_int(&field(&info, "token")), tokens[0]);
    let info = info_map(c, &["FAIRLOCK.INFO", "f"]).unwrap();
    assert_eq!(as_int(&field(&info, "token")), tokens[3]);
    let info = info_map(c, &["RWLOCK.INFO", "rw"]).unwrap();
    match field(&info, "readers") {
        Value::Array(readers) => assert_eq!(readers.len(), 2),
        other => panic!("{other:?}"),
    }
}

#[test]
fn debug_reload_gives_back_the_same_state() {
    let s = Server::start();
    let mut c = s.client();
    let tokens = populate(&mut c);
    let before = digest(&mut c);
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c), before);
    assert_state(&mut c, &tokens);
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "r", "a"]), 1);
    let t = int(&mut c, &["RLOCK.ACQUIRE", "new", "z"]);
    assert!(t > *tokens.iter().max().unwrap());
}

#[test]
fn rdb_save_and_restart_give_back_the_same_state() {
    let mut s = Server::start_with(&["--save", "", "--appendonly", "no"], &[]);
    let mut c = s.client();
    let tokens = populate(&mut c);
    let before = digest(&mut c);
    let _: () = cmd("SAVE").query(&mut c).unwrap();
    s.restart();
    let mut c = s.client();
    assert_eq!(digest(&mut c), before);
    assert_state(&mut c, &tokens);
}

fn aof_roundtrip(preamble: &str, rewrite: bool) {
    let mut s = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--aof-use-rdb-preamble",
            preamble,
        ],
        &[],
    );
    let mut c = s.client();
    let tokens = populate(&mut c);
    // Changes after the first writes, so the AOF holds a history, not one state.
    int(&mut c, &["RLOCK.ACQUIRE", "gone", "g"]);
    int(&mut c, &["RLOCK.RELEASE", "gone", "g"]);
    int(&mut c, &["RWLOCK.RENEW", "rw", "r1", "PX", "350000"]);
    // A key's TTL is the keyspace's, not the lock's: a rewritten lock takes it
    // from the PEXPIREAT Redis writes after it (none here), and the digest
    // below covers every key's TTL.
    assert_eq!(int(&mut c, &["PERSIST", "f"]), 1);
    if rewrite {
        let _: String = cmd("BGREWRITEAOF").query(&mut c).unwrap();
        wait_until(Duration::from_secs(30), || {
            let info: String = cmd("INFO").arg("persistence").query(&mut c).unwrap();
            info.contains("aof_rewrite_in_progress:0") && info.contains("aof_rewrite_scheduled:0")
        });
        // The rewrite must have succeeded: a crashed rewrite child leaves the old
        // AOF in place, which would replay to the same state and hide the crash.
        let info: String = cmd("INFO").arg("persistence").query(&mut c).unwrap();
        assert!(
            info.contains("aof_last_bgrewrite_status:ok"),
            "rewrite failed:\n{info}"
        );
        if preamble == "no" {
            let base = std::fs::read_dir(s.dir.join("appendonlydir"))
                .unwrap()
                .flatten()
                .find(|e| e.file_name().to_string_lossy().contains(".base.aof"))
                .expect("a rewritten base AOF");
            let text = String::from_utf8_lossy(&std::fs::read(base.path()).unwrap()).into_owned();
            // One compact RLOCK.DELTA per lock (whole holders), no SETSTATE.
            assert_eq!(
                text.matches("RLOCK.DELTA").count(),
                4,
                "the base AOF holds no lock state:\n{text}"
            );
        }
    }
    let before = digest(&mut c);
    let ttls = |c: &mut Connection| -> Vec<i64> {
        ["r", "f", "rw"]
            .iter()
            .map(|k| cmd("PEXPIRETIME").arg(*k).query(c).unwrap())
            .collect()
    };
    let ttls_before = ttls(&mut c);
    assert_eq!(ttls_before[1], -1, "PERSIST took the TTL off");
    s.restart();
    let mut c = s.client();
    assert_eq!(
        digest(&mut c),
        before,
        "preamble={preamble} rewrite={rewrite}"
    );
    assert_eq!(
        ttls(&mut c),
        ttls_before,
        "preamble={preamble} rewrite={rewrite}"
    );
    assert_state(&mut c, &tokens);
    assert_eq!(int(&mut c, &["EXISTS", "gone"]), 0);
    let t = int(&mut c, &["RLOCK.ACQUIRE", "after", "z"]);
    assert!(t > *tokens.iter().max().unwrap());
}

#[test]
fn aof_replay_gives_back_the_same_state() {
    aof_roundtrip("no", false);
}

#[test]
fn aof_rewrite_with_commands_gives_back_the_same_state() {
    aof_roundtrip("no", true);
}

#[test]
fn aof_rewrite_with_rdb_preamble_gives_back_the_same_state() {
    aof_roundtrip("yes", true);
}

/// `SAVE`, the server stopped for `down`, started again on its file: a client
/// of the new process.
fn save_and_restart_after(s: &mut Server, c: &mut Connection, down: Duration) -> Connection {
    let _: () = cmd("SAVE").query(c).unwrap();
    let _: redis::RedisResult<()> = cmd("SHUTDOWN").arg("NOSAVE").query(c);
    s.kill();
    sleep(down);
    s.start_again();
    s.client()
}

#[test]
fn holds_that_expired_while_down_are_dropped() {
    let mut s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "short", "a", "PX", "300"]);
    int(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "READ", "brief", "PX", "300"],
    );
    int(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "READ", "stays", "PX", "600000"],
    );
    int(&mut c, &["RLOCK.ACQUIRE", "long", "b", "PX", "600000"]);
    let mut c = save_and_restart_after(&mut s, &mut c, Duration::from_millis(500));
    wait_until(Duration::from_secs(2), || {
        int(&mut c, &["EXISTS", "short"]) == 0
    });
    assert!(info_map(&mut c, &["RLOCK.INFO", "short"]).is_none());
    assert!(info_map(&mut c, &["RLOCK.INFO", "long"]).is_some());
    // The expired reader is removed from the stored value, not just hidden.
    wait_until(Duration::from_secs(2), || {
        stat(&mut c, "lease_expirations") >= 1
    });
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw"]).unwrap();
    match field(&info, "readers") {
        Value::Array(r) => assert_eq!(r.len(), 1),
        other => panic!("{other:?}"),
    }
    assert!(error(&mut c, &["RWLOCK.RELEASE", "rw", "READ", "brief"]).starts_with("NOTOWNER"));
}

/// Keys whose TTL `PERSIST` took off keep their lock in the file; a load ends
/// those whose leases ran out meanwhile. Hundreds of them, so that most are
/// judged by a clock reading shared with the values before them (the loader
/// reads the clock once per 128 values), and the ones left held are too.
#[test]
fn persisted_locks_whose_leases_ended_while_down_are_ended_at_load() {
    let mut s = Server::start();
    let mut c = s.client();
    let (ended, held) = (600, 300);
    for i in 0..ended + held {
        let px = if i < ended { "300" } else { "600000" };
        int(&mut c, &["RLOCK.ACQUIRE", &format!("k{i}"), "a", "PX", px]);
        assert_eq!(int(&mut c, &["PERSIST", &format!("k{i}")]), 1);
    }
    let mut c = save_and_restart_after(&mut s, &mut c, Duration::from_millis(500));
    wait_until(Duration::from_secs(5), || {
        int(&mut c, &["DBSIZE"]) == held as i64
    });
    for i in 0..ended + held {
        let exists = int(&mut c, &["EXISTS", &format!("k{i}")]);
        assert_eq!(exists, (i >= ended) as i64, "k{i}");
    }
    assert_eq!(stat(&mut c, "locks"), held as i64);
}

#[test]
fn tokens_never_repeat_after_a_crash_with_nothing_persisted() {
    let mut s = Server::start();
    let mut c = s.client();
    let mut last = 0;
    for _ in 0..1000 {
        last = int(&mut c, &["RLOCK.ACQUIRE", "k", "a"]);
        int(&mut c, &["RLOCK.RELEASE", "k", "a"]);
    }
    s.kill();
    s.start_again();
    let mut c = s.client();
    assert_eq!(int(&mut c, &["DBSIZE"]), 0, "nothing was persisted");
    let next = int(&mut c, &["RLOCK.ACQUIRE", "k", "a"]);
    assert!(next > last, "token {next} repeats or goes below {last}");
}

#[test]
fn aof_switched_on_at_run_time_records_later_changes() {
    let mut s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "early", "a", "PX", "600000"]);
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("always")
        .query(&mut c)
        .unwrap();
    wait_until(Duration::from_secs(10), || {
        let info: String = cmd("INFO").arg("persistence").query(&mut c).unwrap();
        info.contains("aof_rewrite_in_progress:0") && info.contains("aof_enabled:1")
    });
    int(&mut c, &["RLOCK.ACQUIRE", "late", "b", "PX", "600000"]);
    int(&mut c, &["RLOCK.ACQUIRE", "early", "a", "PX", "500000"]);
    let before = digest(&mut c);
    // Restart with the AOF on, as the CONFIG SET left it.
    s.restart_with(&["--appendonly", "yes"]);
    let mut c = s.client();
    assert_eq!(digest(&mut c), before);
    let info = info_map(&mut c, &["RLOCK.INFO", "early"]).unwrap();
    assert_eq!(as_int(&field(&info, "holds")), 2);
}

/// The owner of a lock exactly as INFO gives it back (binary-safe).
fn owner_of(c: &mut Connection, cmd_name: &str, key: &str) -> Vec<u8> {
    let info = info_map(c, &[cmd_name, key]).expect("held");
    match field(&info, "owner") {
        Value::BulkString(bytes) => bytes,
        other => panic!("{other:?}"),
    }
}

/// A one-holder lock is kept packed when its owner is short or Redisson's
/// `<uuid>:<threadId>` (store.rs, lock/compact.rs). Every owner must come
/// back byte for byte, in every form and across every path: a replica, a
/// reload, a second holder joining (the lock outgrows its packed form) and
/// leaving.
#[test]
fn packed_and_unpacked_locks_keep_their_exact_owners() {
    let uuid = "0f3c2a9e-7b1d-4e5f-a6b7-c8d9e0f1a2b3";
    let upper = uuid.to_uppercase();
    let owners: Vec<String> = vec![
        format!("{uuid}:1"),
        format!("{uuid}:0"),
        format!("{uuid}:18446744073709551615"),
        // Not canonical: kept as they are, unpacked.
        format!("{uuid}:01"),
        format!("{uuid}:18446744073709551616"),
        format!("{upper}:1"),
        "a".into(),
        "x".repeat(24),
        "x".repeat(25),
        "\u{0}\r\n".into(),
    ];
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    for (i, owner) in owners.iter().enumerate() {
        int(
            &mut m,
            &["RLOCK.ACQUIRE", &format!("r{i}"), owner, "PX", "600000"],
        );
        int(
            &mut m,
            &["RLOCK.ACQUIRE", &format!("r{i}"), owner, "PX", "500000"],
        );
        // A read lock that grows to two holders and shrinks back to one.
        let rw = format!("rw{i}");
        int(
            &mut m,
            &["RWLOCK.ACQUIRE", &rw, "READ", owner, "PX", "600000"],
        );
        int(
            &mut m,
            &["RWLOCK.ACQUIRE", &rw, "READ", "other", "PX", "600000"],
        );
        int(&mut m, &["RWLOCK.RELEASE", &rw, "READ", "other"]);
    }
    let acked: i64 = cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    let before = digest(&mut m);
    assert_eq!(digest(&mut r), before, "the replica differs");
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
    assert_eq!(digest(&mut m), before, "a reload changed the dataset");
    for (i, owner) in owners.iter().enumerate() {
        for c in [&mut m, &mut r] {
            assert_eq!(
                owner_of(c, "RLOCK.INFO", &format!("r{i}")),
                owner.as_bytes()
            );
            let info = info_map(c, &["RWLOCK.INFO", &format!("rw{i}")]).unwrap();
            assert_eq!(as_int(&field(&info, "reader_count")), 1, "{owner}");
        }
        // The owner must match byte for byte to release.
        assert_eq!(int(&mut m, &["RLOCK.RELEASE", &format!("r{i}"), owner]), 1);
        assert_eq!(int(&mut m, &["RLOCK.RELEASE", &format!("r{i}"), owner]), 0);
        int(
            &mut m,
            &["RWLOCK.RELEASE", &format!("rw{i}"), "READ", owner],
        );
    }
    assert_eq!(int(&mut m, &["DBSIZE"]), 0);
    let acked: i64 = cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(int(&mut r, &["DBSIZE"]), 0);

    // Packed is smaller: a Redisson owner against a 25-byte one.
    int(&mut m, &["RLOCK.ACQUIRE", "packed", &owners[0]]);
    int(&mut m, &["RLOCK.ACQUIRE", "full", &owners[8]]);
    let packed = int(&mut m, &["MEMORY", "USAGE", "packed"]);
    let full = int(&mut m, &["MEMORY", "USAGE", "full"]);
    assert!(packed < full, "packed {packed} vs unpacked {full} bytes");
}
