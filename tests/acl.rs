//! ACL key patterns apply to every lock command (SPEC: "Every command touches
//! one key at a fixed position, so Redis Cluster routes it and ACL key patterns
//! apply"), and `COMMAND GETKEYS` finds that key.

mod common;

use std::time::{Duration, Instant};

use common::*;

const FAMILIES: [&str; 3] = ["RLOCK", "FAIRLOCK", "RWLOCK"];

fn connect_as(s: &Server, user: &str, pass: &str) -> Connection {
    redis::Client::open(format!("redis://{user}:{pass}@127.0.0.1:{}/", s.port))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn setuser(c: &mut Connection, rules: &[&str]) {
    let mut command = cmd("ACL");
    command.arg("SETUSER");
    for r in rules {
        command.arg(*r);
    }
    let _: () = command.query(c).unwrap();
}

/// Every command of a family with plausible arguments on `key`, as (label, argv).
fn every_command(family: &str, key: &str) -> Vec<Vec<String>> {
    let rw = family == "RWLOCK";
    let v = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let acquire = format!("{family}.ACQUIRE");
    let release = format!("{family}.RELEASE");
    let mut out = Vec::new();
    if rw {
        out.push(v(&[&acquire, key, "WRITE", "o", "PX", "60000"]));
        out.push(v(&[&acquire, key, "READ", "o", "BLOCK", "100"]));
        out.push(v(&[&release, key, "WRITE", "o"]));
    } else {
        out.push(v(&[&acquire, key, "o", "PX", "60000"]));
        out.push(v(&[&acquire, key, "o", "EX", "60", "BLOCK", "100"]));
        out.push(v(&[&release, key, "o"]));
    }
    out.push(v(&[&format!("{family}.RENEW"), key, "o", "PX", "60000"]));
    out.push(v(&[&format!("{family}.FORCERELEASE"), key]));
    out.push(v(&[&format!("{family}.INFO"), key]));
    out
}

fn refs(argv: &[String]) -> Vec<&str> {
    argv.iter().map(|s| s.as_str()).collect()
}

#[test]
fn restricted_user_uses_every_command_on_its_keys() {
    let s = Server::start();
    let mut admin = s.client();
    setuser(&mut admin, &["app", "on", ">pw", "~app:*", "+@all"]);
    let mut app = connect_as(&s, "app", "pw");
    for family in FAMILIES {
        let key = format!("app:{}", family.to_lowercase());
        let key = key.as_str();
        let rw = family == "RWLOCK";
        let acquire = |owner: &'static str| -> Vec<String> {
            let mut v = vec![format!("{family}.ACQUIRE"), key.to_string()];
            if rw {
                v.push("WRITE".into());
            }
            v.extend([owner.to_string(), "PX".into(), "60000".into()]);
            v
        };
        let release = |owner: &str| -> Vec<String> {
            let mut v = vec![format!("{family}.RELEASE"), key.to_string()];
            if rw {
                v.push("WRITE".into());
            }
            v.push(owner.to_string());
            v
        };
        let t1 = int(&mut app, &refs(&acquire("o")));
        assert_eq!(
            int(&mut app, &refs(&acquire("o"))),
            t1,
            "{family}: reentrant"
        );
        let info = info_map(&mut app, &[&format!("{family}.INFO"), key]).unwrap();
        assert_eq!(as_string(&field(&info, "kind")), family.to_lowercase());
        assert_eq!(
            int(
                &mut app,
                &[&format!("{family}.RENEW"), key, "o", "PX", "90000"]
            ),
            1
        );
        let pttl = int(&mut app, &["PTTL", key]);
        assert!(pttl > 80_000, "{family}: renewed lease, PTTL {pttl}");
        assert_eq!(int(&mut app, &refs(&release("o"))), 1);
        assert_eq!(int(&mut app, &refs(&release("o"))), 0);
        assert_eq!(int(&mut app, &["EXISTS", key]), 0);

        // A waiter of the restricted user is parked and handed the lock.
        let t2 = int(&mut app, &refs(&acquire("o")));
        assert!(t2 > t1);
        let mut blocked = acquire("p");
        blocked.extend(["BLOCK".to_string(), "10000".to_string()]);
        let waiter = {
            let mut c = connect_as(&s, "app", "pw");
            std::thread::spawn(move || {
                let start = Instant::now();
                (call(&mut c, &refs(&blocked)), start.elapsed())
            })
        };
        wait_parked(&mut admin, 1);
        assert_eq!(int(&mut app, &refs(&release("o"))), 0);
        let (r, waited) = waiter.join().unwrap();
        match r {
            Ok(Value::Int(t3)) => assert!(t3 > t2, "{family}: handed-over token"),
            other => panic!("{family}: parked app waiter got {other:?}"),
        }
        assert!(waited < Duration::from_secs(5), "{family}: {waited:?}");
        assert_eq!(
            int(&mut app, &[&format!("{family}.FORCERELEASE"), key]),
            1,
            "{family}: force release by the restricted user"
        );
        assert!(info_map(&mut app, &[&format!("{family}.INFO"), key]).is_none());
    }
}

#[test]
fn restricted_user_gets_noperm_on_other_keys_with_every_command() {
    let s = Server::start();
    let mut admin = s.client();
    setuser(&mut admin, &["app", "on", ">pw", "~app:*", "+@all"]);
    let mut app = connect_as(&s, "app", "pw");
    // Held by someone else, so a FORCERELEASE or RELEASE that slipped through
    // would show; and free keys, so an ACQUIRE that slipped through would.
    for family in FAMILIES {
        let key = format!("other:{}", family.to_lowercase());
        let mut v = vec![format!("{family}.ACQUIRE"), key];
        if family == "RWLOCK" {
            v.push("WRITE".into());
        }
        v.extend(["o".into(), "PX".into(), "600000".into()]);
        int(&mut admin, &refs(&v));
    }
    let before = digest(&mut admin);
    let grants = stat(&mut admin, "grants");
    for family in FAMILIES {
        let held = format!("other:{}", family.to_lowercase());
        for key in [held.as_str(), "free", "App:k", "app", "xapp:k", "{app:}k"] {
            for argv in every_command(family, key) {
                let start = Instant::now();
                let e = error(&mut app, &refs(&argv));
                assert!(e.starts_with("NOPERM "), "{argv:?}: {e}");
                assert!(
                    start.elapsed() < Duration::from_secs(2),
                    "{argv:?} must be refused at once, not parked"
                );
            }
        }
    }
    let e = error(&mut app, &["RLOCK.SETSTATE", "other:rlock", "rlock", "0"]);
    assert!(e.starts_with("NOPERM "), "RLOCK.SETSTATE: {e}");
    // Every key of `key delta` pairs is checked, not only the first.
    let e = error(
        &mut app,
        &["RLOCK.DELTAS", "app:a", "d", "other:rlock", "d"],
    );
    assert!(e.starts_with("NOPERM "), "RLOCK.DELTAS: {e}");
    // Multi-key commands: every key is checked, wherever it is in the list.
    for keys in [
        ["app:a", "free"],
        ["free", "app:a"],
        ["other:rlock", "app:b"],
    ] {
        for name in ["RLOCK.ACQUIREALL", "RLOCK.RELEASEALL", "RLOCK.RENEWALL"] {
            let argv = [name, "2", keys[0], keys[1], "o"];
            let e = error(&mut app, &argv);
            assert!(e.starts_with("NOPERM "), "{argv:?}: {e}");
        }
    }
    let e = error(
        &mut app,
        &["RLOCK.ACQUIREALL", "2", "app:a", "free", "o", "BLOCK", "0"],
    );
    assert!(e.starts_with("NOPERM "), "{e}");
    let all = call(&mut app, &["RLOCK.ACQUIREALL", "2", "app:a", "app:b", "o"]).unwrap();
    assert!(matches!(all, Value::Array(_)), "{all:?}");
    call(&mut app, &["RLOCK.RELEASEALL", "2", "app:a", "app:b", "o"]).unwrap();
    // In a script the key check applies as well.
    let e = error(
        &mut app,
        &[
            "EVAL",
            "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o')",
            "1",
            "free",
        ],
    );
    assert!(e.contains("NOPERM") || e.contains("access"), "EVAL: {e}");
    let token = int(
        &mut app,
        &[
            "EVAL",
            "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o')",
            "1",
            "app:script",
        ],
    );
    assert!(token > 0);
    assert_eq!(int(&mut app, &["RLOCK.RELEASE", "app:script", "o"]), 0);

    assert_eq!(digest(&mut admin), before, "refused calls changed nothing");
    assert_eq!(
        stat(&mut admin, "grants"),
        grants + 3,
        "only app:a, app:b (ACQUIREALL) and app:script"
    );
    assert_eq!(stat(&mut admin, "waiters"), 0);
    let log: Vec<Value> = cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    assert!(!log.is_empty(), "refusals are in ACL LOG");
}

#[test]
fn read_only_key_permission_allows_info_only() {
    let s = Server::start();
    let mut admin = s.client();
    setuser(&mut admin, &["reader", "on", ">pw", "%R~app:*", "+@all"]);
    let mut ro = connect_as(&s, "reader", "pw");
    for family in FAMILIES {
        let key = format!("app:{}", family.to_lowercase());
        let mut v = vec![format!("{family}.ACQUIRE"), key.clone()];
        if family == "RWLOCK" {
            v.push("READ".into());
        }
        v.extend(["o".into(), "PX".into(), "600000".into()]);
        int(&mut admin, &refs(&v));
        let before = digest(&mut admin);
        for argv in every_command(family, &key) {
            let is_info = argv[0].ends_with(".INFO");
            match call(&mut ro, &refs(&argv)) {
                Ok(v) if is_info => {
                    assert!(
                        matches!(v, Value::Array(_) | Value::Map(_)),
                        "{argv:?}: {v:?}"
                    )
                }
                Err(e) if !is_info => assert_eq!(e.code(), Some("NOPERM"), "{argv:?}: {e}"),
                other => panic!(
                    "{argv:?} by a user with read-only key access: {other:?} (INFO is read-only, the rest write)"
                ),
            }
        }
        assert_eq!(digest(&mut admin), before, "{family}");
    }
}

#[test]
fn command_getkeys_names_the_key_of_every_command() {
    let s = Server::start();
    let mut c = s.client();
    for key in ["k", "{order:42}:lock", "PX", "READ"] {
        let mut vectors: Vec<Vec<String>> = FAMILIES
            .iter()
            .flat_map(|f| every_command(f, key))
            .collect();
        // Options whose values look like keys or option words.
        vectors.push(
            ["RLOCK.ACQUIRE", key, "k2", "BLOCK", "5", "px", "100"]
                .map(String::from)
                .to_vec(),
        );
        vectors.push(
            ["RWLOCK.ACQUIRE", key, "read", "other", "ex", "1"]
                .map(String::from)
                .to_vec(),
        );
        vectors.push(
            ["RWLOCK.RENEW", key, "owner", "EX", "5"]
                .map(String::from)
                .to_vec(),
        );
        vectors.push(
            [
                "RLOCK.SETSTATE",
                key,
                "rlock",
                "1",
                "o",
                "0",
                "1",
                "1",
                "99999999999999",
            ]
            .map(String::from)
            .to_vec(),
        );
        for argv in vectors {
            let mut command = cmd("COMMAND");
            command.arg("GETKEYS");
            for a in &argv {
                command.arg(a.as_str());
            }
            let keys: Vec<String> = command
                .query(&mut c)
                .unwrap_or_else(|e| panic!("COMMAND GETKEYS {argv:?}: {e}"));
            assert_eq!(keys, vec![key.to_string()], "COMMAND GETKEYS {argv:?}");
        }
    }
    // Lower-case command names are the same commands.
    let keys: Vec<String> = cmd("COMMAND")
        .arg("GETKEYS")
        .arg("fairlock.acquire")
        .arg("x")
        .arg("o")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, vec!["x".to_string()]);
    // Nothing was executed.
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
}

/// "redis 8.2.3" or "valkey 8.1.8": what the server under test says it is.
fn server_name(c: &mut Connection) -> String {
    match server_info(c, "valkey_version") {
        Some(v) => format!("valkey {v}"),
        None => format!("redis {}", server_info(c, "redis_version").unwrap()),
    }
}

/// `make test` runs the suites once per server and names each run; this checks
/// the name against the server the harness really started (`RLOCK_SERVER`), so
/// a banner cannot claim a server the tests did not run on.
#[test]
fn runs_on_the_server_make_test_names() {
    let s = Server::start();
    let mut c = s.client();
    let name = server_name(&mut c);
    eprintln!("server under test: {name} ({})", server_binary());
    if let Ok(expected) = std::env::var("RLOCK_SERVER_NAME") {
        assert!(
            name.starts_with(&expected),
            "make test announced {expected:?}, the server is {name:?}"
        );
    }
}

/// Redis 7.2+ and Valkey let modules put commands in ACL categories; 7.0 has
/// no such API. rlock detects it at load: on 7.2+ `-@blocking` takes
/// `*.ACQUIRE` away, `+@read` grants `*.INFO`; on 7.0 module commands are in
/// no category at all.
#[test]
fn acl_categories_where_the_server_has_them() {
    let s = Server::start();
    let mut admin = s.client();
    let name = server_name(&mut admin);
    let version = server_info(&mut admin, "redis_version").unwrap();
    let numbers: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    let has_api = name.starts_with("valkey") || (numbers[0], numbers[1]) >= (7, 2);
    let category = |c: &mut Connection, cat: &str| -> Vec<String> {
        cmd("ACL").arg("CAT").arg(cat).query(c).unwrap()
    };
    let blocking = category(&mut admin, "blocking");
    let read = category(&mut admin, "read");
    let write = category(&mut admin, "write");
    for family in ["rlock", "fairlock", "rwlock", "semaphore"] {
        let acquire = format!("{family}.acquire");
        let info = format!("{family}.info");
        let release = format!("{family}.release");
        assert_eq!(blocking.contains(&acquire), has_api, "{name}: {blocking:?}");
        assert_eq!(read.contains(&info), has_api, "{name}: {read:?}");
        assert_eq!(write.contains(&release), has_api, "{name}: {write:?}");
        assert!(!read.contains(&acquire) && !blocking.contains(&release));
    }
    setuser(
        &mut admin,
        &["noblock", "on", ">pw", "~*", "+@all", "-@blocking"],
    );
    let mut user = connect_as(&s, "noblock", "pw");
    let acquire = call(&mut user, &["RLOCK.ACQUIRE", "k", "o", "BLOCK", "10"]);
    if has_api {
        let e = acquire.expect_err("-@blocking must refuse RLOCK.ACQUIRE");
        assert_eq!(e.code(), Some("NOPERM"), "{e}");
        assert_eq!(int(&mut user, &["RLOCK.FORCERELEASE", "k"]), 0);
    } else {
        assert!(acquire.is_ok(), "7.0: module commands are in no category");
    }
}
