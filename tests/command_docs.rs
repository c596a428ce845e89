//! `COMMAND DOCS`, `COMMAND INFO` and `COMMAND GETKEYS` describe every command
//! as they describe Redis's own, and Redis itself enforces the arity.

mod common;

use common::*;

/// Every command with its documented syntax (rendered from `COMMAND DOCS` the
/// way redis.io renders core commands), its argument types, arity, command
/// flag, and the key-spec flags.
struct Expected {
    name: &'static str,
    syntax: &'static str,
    types: &'static str,
    arity: i64,
    flag: &'static str,
    key_flags: &'static [&'static str],
    keys: KeySearch,
}

/// Where a command's keys are, as its key spec says.
#[derive(Clone, Copy, PartialEq, Debug)]
enum KeySearch {
    /// One key at 1.
    One,
    /// `key delta [key delta ...]`: every other argument from 1.
    Pairs,
    /// `numkeys key [key ...]`: a keynum key spec.
    NumKeys,
}

const ACQUIRE_TYPES: &str =
    "key:key owner:string lease:oneof(milliseconds:integer seconds:integer) timeout:integer keepalive:pure-token";
const RW_ACQUIRE_TYPES: &str = "key:key mode:oneof(read:pure-token write:pure-token) owner:string lease:oneof(milliseconds:integer seconds:integer) timeout:integer keepalive:pure-token";
const RENEW_TYPES: &str = "key:key owner:string lease:oneof(milliseconds:integer seconds:integer)";

const ACQUIRE_SYNTAX: &str = "key owner [PX milliseconds | EX seconds] [BLOCK timeout] [KEEPALIVE]";
const RENEW_SYNTAX: &str = "key owner [PX milliseconds | EX seconds]";

const ACQUIRE_FLAGS: &[&str] = &["RW", "access", "update"];
const DELETE_FLAGS: &[&str] = &["RW", "delete"];
const RENEW_FLAGS: &[&str] = &["RW", "update"];
const INFO_FLAGS: &[&str] = &["RO", "access"];

fn family(prefix: &'static str) -> [Expected; 5] {
    // Leaked once per test run: names must be 'static to share the table type.
    let name =
        |cmd: &str| -> &'static str { Box::leak(format!("{prefix}.{cmd}").into_boxed_str()) };
    [
        Expected {
            name: name("acquire"),
            syntax: ACQUIRE_SYNTAX,
            types: ACQUIRE_TYPES,
            arity: -3,
            flag: "write",
            key_flags: ACQUIRE_FLAGS,
            keys: KeySearch::One,
        },
        Expected {
            name: name("release"),
            syntax: "key owner",
            types: "key:key owner:string",
            arity: 3,
            flag: "write",
            key_flags: DELETE_FLAGS,
            keys: KeySearch::One,
        },
        Expected {
            name: name("renew"),
            syntax: RENEW_SYNTAX,
            types: RENEW_TYPES,
            arity: -3,
            flag: "write",
            key_flags: RENEW_FLAGS,
            keys: KeySearch::One,
        },
        Expected {
            name: name("forcerelease"),
            syntax: "key",
            types: "key:key",
            arity: 2,
            flag: "write",
            key_flags: DELETE_FLAGS,
            keys: KeySearch::One,
        },
        Expected {
            name: name("info"),
            syntax: "key [COUNT count]",
            types: "key:key count:integer",
            arity: -2,
            flag: "readonly",
            key_flags: INFO_FLAGS,
            keys: KeySearch::One,
        },
    ]
}

fn all_commands() -> Vec<Expected> {
    let mut all: Vec<Expected> = family("rlock").into_iter().collect();
    all.extend(family("fairlock"));
    let mut rw = family("rwlock");
    rw[0].syntax =
        "key <READ | WRITE> owner [PX milliseconds | EX seconds] [BLOCK timeout] [KEEPALIVE]";
    rw[0].types = RW_ACQUIRE_TYPES;
    rw[0].arity = -4;
    rw[1].syntax = "key <READ | WRITE> owner";
    rw[1].types = "key:key mode:oneof(read:pure-token write:pure-token) owner:string";
    rw[1].arity = 4;
    all.extend(rw);
    let mut sem = family("semaphore");
    sem[0].syntax = "key owner LIMIT limit [PERMITS permits] [PX milliseconds | EX seconds] [BLOCK timeout] [KEEPALIVE]";
    sem[0].types = "key:key owner:string limit:integer permits:integer lease:oneof(milliseconds:integer seconds:integer) timeout:integer keepalive:pure-token";
    sem[0].arity = -3;
    sem[1].syntax = "key owner [PERMITS permits]";
    sem[1].types = "key:key owner:string permits:integer";
    sem[1].arity = -3;
    all.extend(sem);
    all.push(Expected {
        name: "rlock.setstate",
        syntax: "key kind count [owner reads writes token deadline [owner reads writes token deadline ...]]",
        types: "key:key kind:string count:integer holder:block(owner:string reads:integer writes:integer token:integer deadline:unix-time)",
        arity: -4,
        flag: "write",
        key_flags: &["OW", "update"],
        keys: KeySearch::One,
    });
    all.push(Expected {
        name: "rlock.delta",
        syntax: "key delta [filler [filler ...]]",
        types: "key:key delta:string filler:string",
        arity: -3,
        flag: "write",
        key_flags: &["RW", "update"],
        keys: KeySearch::One,
    });
    all.push(Expected {
        name: "rlock.deltas",
        syntax: "key delta [key delta ...]",
        types: "change:block(key:key delta:string)",
        arity: -3,
        flag: "write",
        key_flags: &["RW", "update"],
        keys: KeySearch::Pairs,
    });
    all.push(Expected {
        name: "rlock.acquireall",
        syntax: "numkeys key [key ...] owner [PX milliseconds | EX seconds] [BLOCK timeout] [KEEPALIVE]",
        types: "numkeys:integer key:key owner:string lease:oneof(milliseconds:integer seconds:integer) timeout:integer keepalive:pure-token",
        arity: -4,
        flag: "write",
        key_flags: ACQUIRE_FLAGS,
        keys: KeySearch::NumKeys,
    });
    all.push(Expected {
        name: "rlock.releaseall",
        syntax: "numkeys key [key ...] owner",
        types: "numkeys:integer key:key owner:string",
        arity: -4,
        flag: "write",
        key_flags: DELETE_FLAGS,
        keys: KeySearch::NumKeys,
    });
    all.push(Expected {
        name: "rlock.renewall",
        syntax: "numkeys key [key ...] owner [PX milliseconds | EX seconds]",
        types: "numkeys:integer key:key owner:string lease:oneof(milliseconds:integer seconds:integer)",
        arity: -4,
        flag: "write",
        key_flags: RENEW_FLAGS,
        keys: KeySearch::NumKeys,
    });
    assert_eq!(all.len(), 26);
    all
}

/// A RESP2 flat field-value array or a RESP3 map, as pairs.
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| (as_string(&kv[0]), kv[1].clone()))
            .collect(),
        Value::Map(items) => items
            .iter()
            .map(|(k, v)| (as_string(k), v.clone()))
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

fn get(map: &[(String, Value)], name: &str) -> Option<Value> {
    map.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

fn list(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items.clone(),
        other => panic!("not an array: {other:?}"),
    }
}

fn strings(v: &Value) -> Vec<String> {
    list(v).iter().map(as_string).collect()
}

/// Renders an argument list like the syntax line of a command page.
fn render(args: &[Value]) -> String {
    args.iter()
        .map(|a| {
            let a = pairs(a);
            let name = as_string(&get(&a, "name").unwrap());
            let ty = as_string(&get(&a, "type").unwrap());
            let token = get(&a, "token").map(|t| as_string(&t));
            let flags = get(&a, "flags").map(|f| strings(&f)).unwrap_or_default();
            let sub = get(&a, "arguments").map(|s| list(&s));
            let mut text = match (ty.as_str(), token) {
                ("oneof", _) => render(&sub.unwrap()).replace('\u{1}', " | "),
                ("block", _) => render(&sub.unwrap()).replace('\u{1}', " "),
                ("pure-token", Some(t)) => t,
                (_, Some(t)) => format!("{t} {name}"),
                (_, None) => name,
            };
            if flags.iter().any(|f| f == "multiple") {
                text = format!("{text} [{text} ...]");
            }
            if flags.iter().any(|f| f == "optional") {
                format!("[{text}]")
            } else if ty == "oneof" {
                format!("<{text}>")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        // \u{1} separates siblings so the caller picks " " or " | ".
        .join("\u{1}")
}

fn syntax(args: &[Value]) -> String {
    render(args).replace('\u{1}', " ")
}

/// `name:type`, with sub-arguments in parentheses.
fn types(args: &[Value]) -> String {
    args.iter()
        .map(|a| {
            let a = pairs(a);
            let name = as_string(&get(&a, "name").unwrap());
            let ty = as_string(&get(&a, "type").unwrap());
            match get(&a, "arguments") {
                Some(sub) => format!("{name}:{ty}({})", types(&list(&sub))),
                None => format!("{name}:{ty}"),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn docs(c: &mut Connection, name: &str) -> Vec<(String, Value)> {
    let reply = call(c, &["COMMAND", "DOCS", name]).unwrap();
    let mut all = pairs(&reply);
    assert_eq!(all.len(), 1, "{name}: {all:?}");
    let (got, doc) = all.remove(0);
    assert_eq!(got, name);
    pairs(&doc)
}

#[test]
fn command_docs_describe_every_command() {
    let s = Server::start();
    let mut c = s.client();
    for e in all_commands() {
        let doc = docs(&mut c, e.name);
        let text = |f: &str| {
            as_string(&get(&doc, f).unwrap_or_else(|| panic!("{}: no {f} in {doc:?}", e.name)))
        };
        assert!(
            text("summary").len() > 20,
            "{}: {}",
            e.name,
            text("summary")
        );
        assert_eq!(text("since"), "1.0.0", "{}", e.name);
        assert_eq!(text("group"), "module", "{}", e.name);
        assert_eq!(text("module"), "rlock", "{}", e.name);
        assert!(text("complexity").starts_with("O("), "{}", e.name);
        let args = list(&get(&doc, "arguments").unwrap());
        assert_eq!(syntax(&args), e.syntax, "{}", e.name);
        assert_eq!(types(&args), e.types, "{}", e.name);
        // The key argument points at the command's one key spec.
        let key = match e.keys {
            KeySearch::One => pairs(&args[0]),
            KeySearch::NumKeys => pairs(&args[1]),
            // The first of the block's two.
            KeySearch::Pairs => pairs(&list(&get(&pairs(&args[0]), "arguments").unwrap())[0]),
        };
        assert_eq!(
            get(&key, "key_spec_index"),
            Some(Value::Int(0)),
            "{}",
            e.name
        );
    }
}

#[test]
fn command_docs_with_resp3_and_for_several_commands() {
    let s = Server::start();
    let mut c = s.client_resp3();
    let reply = call(&mut c, &["COMMAND", "DOCS", "rwlock.acquire", "rlock.info"]).unwrap();
    let all = pairs(&reply);
    assert_eq!(all.len(), 2);
    let rw = pairs(&all.iter().find(|(n, _)| n == "rwlock.acquire").unwrap().1);
    let args = list(&get(&rw, "arguments").unwrap());
    // The mode word: a required one-of of two pure tokens.
    let mode = pairs(&args[1]);
    assert_eq!(get(&mode, "flags"), None);
    let words: Vec<String> = list(&get(&mode, "arguments").unwrap())
        .iter()
        .map(|a| as_string(&get(&pairs(a), "token").unwrap()))
        .collect();
    assert_eq!(words, ["READ", "WRITE"]);
    // Every argument carries a summary.
    for a in &args {
        assert!(get(&pairs(a), "summary").is_some(), "{a:?}");
    }
    // Plain COMMAND DOCS lists them among Redis's own commands.
    let everything = pairs(&call(&mut c, &["COMMAND", "DOCS"]).unwrap());
    for e in all_commands() {
        assert!(everything.iter().any(|(n, _)| n == e.name), "{}", e.name);
    }
    assert!(everything.iter().any(|(n, _)| n == "set"));
}

#[test]
fn command_info_shows_arity_flags_and_key_specs() {
    let s = Server::start();
    let mut c = s.client();
    for e in all_commands() {
        let reply = list(&call(&mut c, &["COMMAND", "INFO", e.name]).unwrap());
        let info = list(&reply[0]);
        assert_eq!(as_string(&info[0]), e.name);
        assert_eq!(as_int(&info[1]), e.arity, "{}", e.name);
        let flags = strings(&info[2]);
        assert!(flags.iter().any(|f| f == e.flag), "{}: {flags:?}", e.name);
        assert!(flags.iter().any(|f| f == "module"), "{}: {flags:?}", e.name);
        // Legacy first/last/step: the one key at position 1, every other
        // argument from 1 (none for multi-key commands: Redis finds their
        // keys by the key spec).
        let legacy = match e.keys {
            KeySearch::One => (1, 1, 1),
            KeySearch::Pairs => (1, -1, 2),
            KeySearch::NumKeys => (0, 0, 0),
        };
        assert_eq!(
            (as_int(&info[3]), as_int(&info[4]), as_int(&info[5])),
            legacy,
            "{}",
            e.name
        );
        assert_eq!(
            flags.iter().any(|f| f == "movablekeys"),
            e.keys == KeySearch::NumKeys,
            "{}: {flags:?}",
            e.name
        );
        let specs = list(&info[8]);
        assert_eq!(specs.len(), 1, "{}: {specs:?}", e.name);
        let spec = pairs(&specs[0]);
        let mut key_flags = strings(&get(&spec, "flags").unwrap());
        key_flags.sort();
        let mut expected: Vec<String> = e.key_flags.iter().map(|f| f.to_string()).collect();
        expected.sort();
        assert_eq!(key_flags, expected, "{}", e.name);
        let begin = pairs(&get(&spec, "begin_search").unwrap());
        assert_eq!(as_string(&get(&begin, "type").unwrap()), "index");
        let pos = pairs(&get(&begin, "spec").unwrap());
        assert_eq!(get(&pos, "index"), Some(Value::Int(1)), "{}", e.name);
        let find = pairs(&get(&spec, "find_keys").unwrap());
        let found = pairs(&get(&find, "spec").unwrap());
        let step = if e.keys == KeySearch::NumKeys {
            assert_eq!(as_string(&get(&find, "type").unwrap()), "keynum");
            assert_eq!(get(&found, "keynumidx"), Some(Value::Int(0)), "{}", e.name);
            assert_eq!(get(&found, "firstkey"), Some(Value::Int(1)), "{}", e.name);
            1
        } else {
            assert_eq!(as_string(&get(&find, "type").unwrap()), "range");
            let (last, step) = if e.keys == KeySearch::Pairs {
                (-1, 2)
            } else {
                (0, 1)
            };
            assert_eq!(get(&found, "lastkey"), Some(Value::Int(last)), "{}", e.name);
            step
        };
        assert_eq!(get(&found, "keystep"), Some(Value::Int(step)), "{}", e.name);
    }
    // Tips for clients: the token and the TTLs vary between calls.
    let info = list(&list(&call(&mut c, &["COMMAND", "INFO", "rlock.acquire"]).unwrap())[0]);
    assert_eq!(strings(&info[7]), ["nondeterministic_output"]);
}

#[test]
fn command_getkeys_names_the_key_of_every_command() {
    let s = Server::start();
    let mut c = s.client();
    let calls: [&[&str]; 20] = [
        &["RLOCK.ACQUIRE", "{t}:k", "a"],
        &["RLOCK.ACQUIRE", "{t}:k", "a", "PX", "10", "BLOCK", "0"],
        &["RLOCK.RELEASE", "{t}:k", "a"],
        &["RLOCK.RENEW", "{t}:k", "a", "EX", "5"],
        &["RLOCK.FORCERELEASE", "{t}:k"],
        &["RLOCK.INFO", "{t}:k"],
        &["FAIRLOCK.ACQUIRE", "{t}:k", "a", "BLOCK", "10"],
        &["FAIRLOCK.RELEASE", "{t}:k", "a"],
        &["FAIRLOCK.RENEW", "{t}:k", "a"],
        &["FAIRLOCK.FORCERELEASE", "{t}:k"],
        &["FAIRLOCK.INFO", "{t}:k"],
        &["RWLOCK.ACQUIRE", "{t}:k", "READ", "a"],
        &[
            "RWLOCK.ACQUIRE",
            "{t}:k",
            "write",
            "a",
            "EX",
            "1",
            "BLOCK",
            "5",
        ],
        &["RWLOCK.RELEASE", "{t}:k", "WRITE", "a"],
        &["RWLOCK.RENEW", "{t}:k", "a", "PX", "100"],
        &["RWLOCK.FORCERELEASE", "{t}:k"],
        &["RWLOCK.INFO", "{t}:k"],
        &["RLOCK.SETSTATE", "{t}:k", "rlock", "0"],
        &[
            "RLOCK.SETSTATE",
            "{t}:k",
            "rlock",
            "1",
            "a",
            "0",
            "1",
            "7",
            "99",
        ],
        &["rlock.acquire", "{t}:k", "a"],
    ];
    for args in calls {
        let mut getkeys = vec!["COMMAND", "GETKEYS"];
        getkeys.extend_from_slice(args);
        let keys = strings(&call(&mut c, &getkeys).unwrap());
        assert_eq!(keys, ["{t}:k"], "{args:?}");
    }
    // Multi-key commands: every key, whatever follows.
    for (args, keys) in [
        (&["RLOCK.ACQUIREALL", "1", "a", "o"][..], &["a"][..]),
        (
            &[
                "RLOCK.ACQUIREALL",
                "3",
                "a",
                "b",
                "c",
                "o",
                "PX",
                "5",
                "KEEPALIVE",
            ],
            &["a", "b", "c"],
        ),
        (&["RLOCK.RELEASEALL", "2", "b", "a", "o"], &["b", "a"]),
        (&["RLOCK.DELTAS", "a", "d1"], &["a"]),
        (
            &["RLOCK.DELTAS", "b", "d1", "a", "d2", "c", "d3"],
            &["b", "a", "c"],
        ),
        (
            &["RLOCK.RENEWALL", "2", "a", "b", "o", "EX", "1"],
            &["a", "b"],
        ),
    ] {
        let mut getkeys = vec!["COMMAND", "GETKEYS"];
        getkeys.extend_from_slice(args);
        assert_eq!(strings(&call(&mut c, &getkeys).unwrap()), keys, "{args:?}");
    }
    // Arity applies to GETKEYS too, as for core commands.
    let e = error(&mut c, &["COMMAND", "GETKEYS", "RLOCK.ACQUIRE", "k"]);
    assert!(e.starts_with("ERR Invalid number of arguments"), "{e}");
}

#[test]
fn arity_errors_come_from_redis_itself() {
    let s = Server::start();
    let mut c = s.client();
    let too_few: [&[&str]; 21] = [
        &["RLOCK.ACQUIRE", "k"],
        &["RLOCK.RELEASE", "k"],
        &["RLOCK.RENEW", "k"],
        &["RLOCK.FORCERELEASE"],
        &["RLOCK.INFO"],
        &["FAIRLOCK.ACQUIRE", "k"],
        &["FAIRLOCK.RELEASE", "k"],
        &["FAIRLOCK.RENEW", "k"],
        &["FAIRLOCK.FORCERELEASE"],
        &["FAIRLOCK.INFO"],
        &["RWLOCK.ACQUIRE", "k", "READ"],
        &["RWLOCK.RELEASE", "k", "READ"],
        &["RWLOCK.RENEW", "k"],
        &["RWLOCK.FORCERELEASE"],
        &["RWLOCK.INFO"],
        &["RLOCK.SETSTATE", "k", "rlock"],
        &["RLOCK.DELTA", "k"],
        &["RLOCK.DELTAS", "k"],
        &["RLOCK.ACQUIREALL", "1", "k"],
        &["RLOCK.RELEASEALL", "1", "k"],
        &["RLOCK.RENEWALL", "1"],
    ];
    // (`*.INFO key x` is not an arity error: INFO takes an optional COUNT n.)
    let too_many: [&[&str]; 5] = [
        &["RLOCK.RELEASE", "k", "a", "x"],
        &["RLOCK.FORCERELEASE", "k", "x"],
        &["FAIRLOCK.RELEASE", "k", "a", "x"],
        &["RWLOCK.RELEASE", "k", "READ", "a", "x"],
        &["RWLOCK.FORCERELEASE", "k", "x"],
    ];
    let _: () = cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    for args in too_few.iter().chain(too_many.iter()) {
        let name = args[0].to_lowercase();
        assert_eq!(
            error(&mut c, args),
            format!("ERR wrong number of arguments for '{name}' command"),
            "{args:?}"
        );
    }
    // The module was never called: Redis counted the calls as rejected.
    let stats: String = cmd("INFO").arg("commandstats").query(&mut c).unwrap();
    for (name, rejected) in [
        ("rlock.acquire", 1),
        ("rlock.release", 2),
        ("rlock.info", 1),
        ("rlock.delta", 1),
        ("rlock.deltas", 1),
        ("rwlock.release", 2),
        ("rlock.setstate", 1),
    ] {
        let line = stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
            .unwrap_or_else(|| panic!("no cmdstat for {name}:\n{stats}"));
        assert!(line.contains("calls=0,"), "{line}");
        assert!(
            line.contains(&format!("rejected_calls={rejected},")),
            "{line}"
        );
    }
    // Inside MULTI the command is refused when queued and EXEC aborts, as for
    // core commands.
    let _: () = cmd("MULTI").query(&mut c).unwrap();
    let e = error(&mut c, &["RLOCK.ACQUIRE", "k"]);
    assert_eq!(
        e,
        "ERR wrong number of arguments for 'rlock.acquire' command"
    );
    let e = error(&mut c, &["EXEC"]);
    assert!(e.starts_with("EXECABORT"), "{e}");
    // Right arity still reaches the module and its own checks.
    assert_eq!(
        error(&mut c, &["RLOCK.ACQUIRE", "k", "a", "PX"]),
        "ERR syntax error"
    );
    assert!(!is_nil(&mut c, &["RLOCK.ACQUIRE", "k", "a", "PX", "1000"]));
}
