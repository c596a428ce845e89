//! Command metadata for `COMMAND INFO` / `COMMAND DOCS`: summary, complexity,
//! arity, key specs and the argument tree of every command, set with
//! `RedisModule_SetCommandInfo` right after the command is created.
//!
//! The four families share one description (`COMMANDS`); a `Family` fills in
//! what differs (name prefix, what kind of lock it is, the READ|WRITE word of
//! RWLOCK, costs, SEMAPHORE's own ACQUIRE and RELEASE arguments).
//! `RLOCK.SETSTATE` has its own entry.
//!
//! ABI notes (checked against Redis 7.0.15's module.c and redismodule.h):
//! - `RedisModule_CurrentCommandInfoVersion` is a `static const` in the C
//!   header, not an exported symbol, so we build the version struct ourselves:
//!   version 1 with the sizes of the structs we pass. Redis walks the arrays
//!   with those sizes. The bindgen'd `RedisModuleCommandArg` is the 7.2+ layout
//!   (an extra trailing `display_text`); 7.0 reads only the fields it knows, at
//!   the same offsets, so the one layout fits both.
//! - Redis copies everything (`zstrdup` of every string, `moduleCopyCommandArgs`
//!   for the argument tree, key specs into its own array), so the buffers built
//!   here only have to live for the duration of the call and are dropped right
//!   after it, once per command at load.
//! - The arity set here makes Redis reject wrong argument counts itself, with
//!   its own `ERR wrong number of arguments for '<name>' command`. The handlers
//!   keep their own checks (they are still reached on servers without this API).

use std::ffi::{CStr, CString};
use std::mem::size_of;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::raw;

use crate::ffi::{self, Ctx};

/// The module version that introduced every command.
const SINCE: &str = "1.0.0";

const OPTIONAL: u32 = raw::REDISMODULE_CMD_ARG_OPTIONAL;
const MULTIPLE: u32 = raw::REDISMODULE_CMD_ARG_MULTIPLE;

/// Key-spec flags (`REDISMODULE_CMD_KEY_*`).
const KEY_RO: u64 = raw::REDISMODULE_CMD_KEY_RO as u64;
const KEY_RW: u64 = raw::REDISMODULE_CMD_KEY_RW as u64;
const KEY_OW: u64 = raw::REDISMODULE_CMD_KEY_OW as u64;
const KEY_ACCESS: u64 = raw::REDISMODULE_CMD_KEY_ACCESS as u64;
const KEY_UPDATE: u64 = raw::REDISMODULE_CMD_KEY_UPDATE as u64;
const KEY_DELETE: u64 = raw::REDISMODULE_CMD_KEY_DELETE as u64;

/// The type of an argument, with the sub-arguments of groups.
#[derive(Clone, Copy)]
enum Type {
    Key,
    String,
    Integer,
    UnixTime,
    /// A word with no value (`token` is the word).
    PureToken,
    /// Exactly one of the sub-arguments.
    OneOf(&'static [Arg]),
    /// The sub-arguments together.
    Block(&'static [Arg]),
}

/// One argument as `COMMAND DOCS` shows it.
#[derive(Clone, Copy)]
struct Arg {
    name: &'static str,
    ty: Type,
    token: Option<&'static str>,
    summary: Option<&'static str>,
    /// `REDISMODULE_CMD_ARG_*`.
    flags: u32,
}

const fn arg(name: &'static str, ty: Type, summary: &'static str) -> Arg {
    Arg {
        name,
        ty,
        token: None,
        summary: Some(summary),
        flags: 0,
    }
}

const fn token(word: &'static str, name: &'static str, ty: Type, summary: &'static str) -> Arg {
    Arg {
        token: Some(word),
        ..arg(name, ty, summary)
    }
}

const fn optional(a: Arg) -> Arg {
    Arg {
        flags: a.flags | OPTIONAL,
        ..a
    }
}

const KEY: Arg = arg("key", Type::Key, "the lock key");
const OWNER: Arg = arg(
    "owner",
    Type::String,
    "non-empty name of the holder, e.g. <client-uuid>:<thread-id>",
);
/// `[PX milliseconds | EX seconds]`
const LEASE: Arg = optional(arg(
    "lease",
    Type::OneOf(&[
        token("PX", "milliseconds", Type::Integer, "lease in milliseconds"),
        token("EX", "seconds", Type::Integer, "lease in seconds"),
    ]),
    "lease of the hold; default rlock.default-lease-ms",
));
/// `[BLOCK timeout]`
const BLOCK: Arg = optional(token(
    "BLOCK",
    "timeout",
    Type::Integer,
    "milliseconds to wait on the server for the lock; 0 waits forever",
));
/// `[KEEPALIVE]`
const KEEPALIVE: Arg = optional(token(
    "KEEPALIVE",
    "keepalive",
    Type::PureToken,
    "the server renews the holding while this connection is open and releases it when the connection closes",
));
/// `numkeys key [key ...]` of the multi-key commands.
const NUMKEYS: Arg = arg(
    "numkeys",
    Type::Integer,
    "how many keys follow (at least 1)",
);
const KEYS: Arg = Arg {
    flags: MULTIPLE,
    ..arg("key", Type::Key, "a lock key (all in one cluster slot)")
};
/// `READ | WRITE` (RWLOCK only)
const MODE: Arg = arg(
    "mode",
    Type::OneOf(&[
        token("READ", "read", Type::PureToken, "shared access"),
        token("WRITE", "write", Type::PureToken, "exclusive access"),
    ]),
    "READ (shared) or WRITE (exclusive)",
);

/// `LIMIT n` (SEMAPHORE.ACQUIRE)
const LIMIT: Arg = token(
    "LIMIT",
    "limit",
    Type::Integer,
    "at most this many permits held at once; the latest ACQUIRE's limit is in force",
);
/// `[PERMITS k]` (SEMAPHORE.ACQUIRE and RELEASE)
const PERMITS: Arg = optional(token(
    "PERMITS",
    "permits",
    Type::Integer,
    "how many permits (default 1)",
));

/// A family's own form of one of the shared commands.
struct Override {
    name: &'static str,
    summary: &'static str,
    arity: c_int,
    /// The arguments after the key.
    args: &'static [Arg],
}

/// What differs between the lock families.
struct Family {
    prefix: &'static str,
    /// Fills `{lock}` in summaries.
    lock: &'static str,
    /// RWLOCK: `READ|WRITE` follows the key in ACQUIRE and RELEASE.
    has_mode: bool,
    /// Fills `{H}` in complexities: the cost of touching the lock's holders.
    holders_cost: &'static str,
    info_cost: &'static str,
    overrides: &'static [Override],
}

const FAMILIES: [Family; 4] = [
    Family {
        prefix: "rlock",
        lock: "reentrant lock",
        has_mode: false,
        holders_cost: "O(1)",
        info_cost: "O(1)",
        overrides: &[],
    },
    Family {
        prefix: "fairlock",
        lock: "fair (first-come, first-served) lock",
        has_mode: false,
        holders_cost: "O(1)",
        info_cost: "O(W) where W is the number of queued waiters listed (all, or at most COUNT)",
        overrides: &[],
    },
    Family {
        prefix: "rwlock",
        lock: "read-write lock",
        has_mode: true,
        holders_cost: "O(log H) where H is the number of owners holding the lock",
        info_cost: "O(H) where H is the number of owners holding the lock (counted; at most COUNT of them listed)",
        overrides: &[],
    },
    Family {
        prefix: "semaphore",
        lock: "semaphore",
        has_mode: false,
        holders_cost: "O(log H) where H is the number of owners holding permits",
        info_cost: "O(H) where H is the number of owners holding permits (counted; at most COUNT of them listed)",
        overrides: &[
            Override {
                name: "acquire",
                summary: "Acquires permits of a semaphore for an owner (more, keeping its token, if it already holds some), or waits for them on the server with BLOCK. Returns a fencing token, or nil when not granted.",
                arity: -3,
                args: &[OWNER, LIMIT, PERMITS, LEASE, BLOCK, KEEPALIVE],
            },
            Override {
                name: "release",
                summary: "Returns permits of a semaphore held by an owner; freed permits go to as many waiters from the head of the queue as they fit. Returns the owner's remaining permits.",
                arity: -3,
                args: &[OWNER, PERMITS],
            },
        ],
    },
];

/// One command of every family.
struct Command {
    /// After the family prefix and the dot.
    name: &'static str,
    /// `{lock}` is replaced by the family's `lock`.
    summary: &'static str,
    /// `{H}` is replaced by the family's `holders_cost`; `None`: the family's `info_cost`.
    complexity: Option<&'static str>,
    /// Without the mode word (RWLOCK adds one argument when `mode` is set).
    arity: c_int,
    /// Whether RWLOCK's `READ|WRITE` follows the key.
    mode: bool,
    key_flags: u64,
    tips: Option<&'static str>,
    /// The arguments after the key (and mode).
    args: &'static [Arg],
}

const LEASE_COST: &str = "{H}, plus O(log L) when a deadline is scheduled (keys with waiters or several holders), L being the number of scheduled lock keys";

const COMMANDS: [Command; 5] = [
    Command {
        name: "acquire",
        summary: "Acquires a {lock} for an owner (again, if it already holds it), or waits for it on the server with BLOCK. Returns a fencing token, or nil when not granted.",
        complexity: Some(LEASE_COST),
        arity: -3,
        mode: true,
        // Creates the lock, adds or extends a hold, and returns the tenure's token.
        key_flags: KEY_RW | KEY_ACCESS | KEY_UPDATE,
        tips: Some("nondeterministic_output"),
        args: &[OWNER, LEASE, BLOCK, KEEPALIVE],
    },
    Command {
        name: "release",
        summary: "Releases one hold of a {lock} by an owner; when the owner's last hold ends, the next waiter is granted the lock. Returns the owner's remaining holds.",
        complexity: Some("{H}, plus O(G) for the G waiters granted the lock"),
        arity: 3,
        mode: true,
        key_flags: KEY_RW | KEY_DELETE,
        tips: None,
        args: &[OWNER],
    },
    Command {
        name: "renew",
        summary: "Resets the lease of an owner's holds of a {lock} (the watchdog call).",
        complexity: Some(LEASE_COST),
        arity: -3,
        mode: false,
        key_flags: KEY_RW | KEY_UPDATE,
        tips: None,
        args: &[OWNER, LEASE],
    },
    Command {
        name: "forcerelease",
        summary: "Ends every hold of a {lock} regardless of owner and grants the lock to the next waiters. Returns 1 if a hold ended, else 0.",
        complexity: Some("{H}, plus O(G) for the G waiters granted the lock"),
        arity: 2,
        mode: false,
        key_flags: KEY_RW | KEY_DELETE,
        tips: None,
        args: &[],
    },
    Command {
        name: "info",
        summary: "Describes a {lock}: holders, holds, fencing tokens, time to live and waiters. Returns nil when nobody holds it.",
        complexity: None,
        arity: -2,
        mode: false,
        key_flags: KEY_RO | KEY_ACCESS,
        tips: Some("nondeterministic_output"),
        args: &[optional(token(
            "COUNT",
            "count",
            Type::Integer,
            "list at most this many readers or queued owners (the counts stay exact)",
        ))],
    },
];

/// `RLOCK.SETSTATE key kind count [owner reads writes token deadline ...]`
const SETSTATE: Command = Command {
    name: "setstate",
    summary: "Sets the whole state of a lock key (internal: sent by a master to its replicas and written by AOF rewrite; refused from other clients).",
    complexity: Some("O(N) where N is the number of holders"),
    arity: -4,
    mode: false,
    // Replaces the value, or deletes the key when count is 0.
    key_flags: KEY_OW | KEY_UPDATE,
    tips: None,
    args: &[
        arg("kind", Type::String, "rlock, fairlock or rwlock"),
        arg("count", Type::Integer, "number of holders that follow"),
        Arg {
            flags: OPTIONAL | MULTIPLE,
            ..arg(
                "holder",
                Type::Block(&[
                    arg("owner", Type::String, "the holder"),
                    arg("reads", Type::Integer, "READ holds"),
                    arg("writes", Type::Integer, "WRITE (exclusive) holds"),
                    arg("token", Type::Integer, "fencing token of the tenure"),
                    arg(
                        "deadline",
                        Type::UnixTime,
                        "absolute lease deadline, unix time in milliseconds",
                    ),
                ]),
                "one holder of the lock",
            )
        },
    ],
};

/// `RLOCK.DELTA key delta [filler ...]`
const DELTA: Command = Command {
    name: "delta",
    summary: "Applies the steps of one lock change to single holders (internal: sent by a master to its replicas and written to the AOF; refused from other clients).",
    complexity: Some("O(S log N) where S is the number of steps and N the number of holders"),
    arity: -3,
    mode: false,
    key_flags: KEY_RW | KEY_UPDATE,
    tips: None,
    args: &[
        arg(
            "delta",
            Type::String,
            "the steps, in rlock's binary delta encoding",
        ),
        Arg {
            flags: OPTIONAL | MULTIPLE,
            ..arg(
                "filler",
                Type::String,
                "empty strings, in the slots the command that made the change had beyond three",
            )
        },
    ],
};

/// `RLOCK.DELTAS key delta [key delta ...]`
const DELTAS: Command = Command {
    name: "deltas",
    summary: "Applies the steps of several lock changes in turn, each to its key (internal: sent by a master's KEEPALIVE timer to its replicas and written to the AOF; refused from other clients).",
    complexity: Some("O(S log N) per change, where S is the number of its steps and N the number of holders of its key"),
    arity: -3,
    mode: false,
    key_flags: KEY_RW | KEY_UPDATE,
    tips: None,
    args: &[Arg {
        flags: MULTIPLE,
        ..arg(
            "change",
            Type::Block(&[
                arg("key", Type::Key, "the lock key the change is made to"),
                arg(
                    "delta",
                    Type::String,
                    "the steps, in rlock's binary delta encoding",
                ),
            ]),
            "one change",
        )
    }],
};

/// The multi-key RLOCK commands (`numkeys key [key ...]` before the owner).
const MULTI_KEY: [Command; 3] = [
    Command {
        name: "acquireall",
        summary: "Acquires the reentrant locks of every listed key for an owner in one step, or none; with BLOCK waits holding nothing, reserving each key once first in its queue, and gets every key at once. Returns an array of fencing tokens (one per key, in order), or nil when not granted.",
        complexity: Some("O(N) where N is the number of keys, plus O(log L) per key whose deadline is scheduled"),
        arity: -4,
        mode: false,
        key_flags: KEY_RW | KEY_ACCESS | KEY_UPDATE,
        tips: Some("nondeterministic_output"),
        args: &[OWNER, LEASE, BLOCK, KEEPALIVE],
    },
    Command {
        name: "releaseall",
        summary: "Releases one hold of every listed reentrant lock by an owner, or none (NOTOWNER unless it holds every key). Returns the owner's remaining holds per key.",
        complexity: Some("O(N) where N is the number of keys, plus O(G) for the G waiters granted"),
        arity: -4,
        mode: false,
        key_flags: KEY_RW | KEY_DELETE,
        tips: None,
        args: &[OWNER],
    },
    Command {
        name: "renewall",
        summary: "Resets the lease of an owner's holds of every listed reentrant lock, or none (NOTOWNER unless it holds every key).",
        complexity: Some("O(N) where N is the number of keys"),
        arity: -4,
        mode: false,
        key_flags: KEY_RW | KEY_UPDATE,
        tips: None,
        args: &[OWNER, LEASE],
    },
];

/// Commands only a master or the AOF may send.
const INTERNAL: [&Command; 2] = [&SETSTATE, &DELTA];

/// Where a command's keys are.
#[derive(Clone, Copy)]
enum KeySearch {
    /// One key, at argv[1].
    One,
    /// `key delta` pairs from argv[1] (`RLOCK.DELTAS`).
    Pairs,
    /// `numkeys key [key ...]` from argv[1].
    NumKeys,
}

/// Plain data, filled out of the description, before it is laid out for C.
struct Doc {
    summary: String,
    complexity: String,
    arity: c_int,
    key_flags: u64,
    keys: KeySearch,
    tips: Option<&'static str>,
    /// Includes the key.
    args: Vec<Arg>,
}

fn family_doc(family: &Family, command: &Command) -> Doc {
    let with_mode = family.has_mode && command.mode;
    let mut args = vec![KEY];
    if with_mode {
        args.push(MODE);
    }
    args.extend_from_slice(command.args);
    let arity = match (with_mode, command.arity) {
        (false, a) => a,
        (true, a) if a < 0 => a - 1,
        (true, a) => a + 1,
    };
    let complexity = match command.complexity {
        Some(c) => c.replace("{H}", family.holders_cost),
        None => family.info_cost.to_string(),
    };
    let own = family.overrides.iter().find(|o| o.name == command.name);
    let (summary, arity) = match own {
        Some(o) => {
            args.truncate(1);
            args.extend_from_slice(o.args);
            (o.summary.to_string(), o.arity)
        }
        None => (command.summary.replace("{lock}", family.lock), arity),
    };
    Doc {
        summary,
        complexity,
        arity,
        key_flags: command.key_flags,
        keys: KeySearch::One,
        tips: command.tips,
        args,
    }
}

/// A command outside the families, described as it stands.
fn command_doc(c: &Command, keys: KeySearch, args: Vec<Arg>) -> Doc {
    Doc {
        summary: c.summary.to_string(),
        complexity: c.complexity.unwrap_or_default().to_string(),
        arity: c.arity,
        key_flags: c.key_flags,
        keys,
        tips: c.tips,
        args,
    }
}

/// The description of a command by its full name (lowercase), if it has one.
fn doc_for(name: &str) -> Option<Doc> {
    let (prefix, rest) = name.split_once('.')?;
    let rlock = |c: &&Command| prefix == "rlock" && c.name == rest;
    if let Some(c) = INTERNAL.iter().copied().find(rlock) {
        return Some(command_doc(
            c,
            KeySearch::One,
            [&[KEY][..], c.args].concat(),
        ));
    }
    if rlock(&&DELTAS) {
        return Some(command_doc(&DELTAS, KeySearch::Pairs, DELTAS.args.to_vec()));
    }
    if let Some(c) = MULTI_KEY.iter().find(rlock) {
        let args = [&[NUMKEYS, KEYS][..], c.args].concat();
        return Some(command_doc(c, KeySearch::NumKeys, args));
    }
    let family = FAMILIES.iter().find(|f| f.prefix == prefix)?;
    let command = COMMANDS.iter().find(|c| c.name == rest)?;
    Some(family_doc(family, command))
}

/// Owns every string and array a `RedisModuleCommandInfo` points into, until
/// `RedisModule_SetCommandInfo` has copied them.
#[derive(Default)]
struct Layout {
    strings: Vec<CString>,
    arg_arrays: Vec<Vec<raw::RedisModuleCommandArg>>,
}

impl Layout {
    fn string(&mut self, s: &str) -> *const c_char {
        // The tables hold no NUL; an empty string is the harmless fallback.
        let c = CString::new(s).unwrap_or_default();
        let p = c.as_ptr();
        self.strings.push(c); // moving the CString keeps its heap buffer in place
        p
    }

    fn opt_string(&mut self, s: Option<&str>) -> *const c_char {
        s.map_or(ptr::null(), |s| self.string(s))
    }

    /// A zero-terminated array of arguments (and, recursively, sub-arguments).
    fn args(&mut self, args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
        let mut array: Vec<raw::RedisModuleCommandArg> = args.iter().map(|a| self.arg(a)).collect();
        array.push(zeroed_arg());
        let p = array.as_mut_ptr();
        self.arg_arrays.push(array); // the Vec's buffer does not move with it
        p
    }

    fn arg(&mut self, a: &Arg) -> raw::RedisModuleCommandArg {
        let (type_, subargs) = match a.ty {
            Type::Key => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
                None,
            ),
            Type::String => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                None,
            ),
            Type::Integer => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                None,
            ),
            Type::UnixTime => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
                None,
            ),
            Type::PureToken => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                None,
            ),
            Type::OneOf(sub) => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
                Some(sub),
            ),
            Type::Block(sub) => (
                raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
                Some(sub),
            ),
        };
        raw::RedisModuleCommandArg {
            name: self.string(a.name),
            type_,
            // Every command has one key spec, index 0; -1 for non-key arguments.
            key_spec_index: if matches!(a.ty, Type::Key) { 0 } else { -1 },
            token: self.opt_string(a.token),
            summary: self.opt_string(a.summary),
            since: ptr::null(),
            flags: a.flags as c_int,
            deprecated_since: ptr::null(),
            subargs: subargs.map_or(ptr::null_mut(), |s| self.args(s)),
            display_text: ptr::null(),
        }
    }
}

fn zeroed_arg() -> raw::RedisModuleCommandArg {
    raw::RedisModuleCommandArg {
        name: ptr::null(),
        type_: 0,
        key_spec_index: 0,
        token: ptr::null(),
        summary: ptr::null(),
        since: ptr::null(),
        flags: 0,
        deprecated_since: ptr::null(),
        subargs: ptr::null_mut(),
        display_text: ptr::null(),
    }
}

/// Search starts at argv[1]: one key there, every other argument from there
/// on (`Pairs`), or (`NumKeys`) the count there and that many keys right after it.
fn key_specs(flags: u64, keys: KeySearch) -> [raw::RedisModuleCommandKeySpec; 2] {
    let range = |lastkey, keystep| {
        (
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE,
            raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                    lastkey,
                    keystep,
                    limit: 0,
                },
            },
        )
    };
    let (find_keys_type, fk) = match keys {
        KeySearch::One => range(0, 1),
        KeySearch::Pairs => range(-1, 2),
        KeySearch::NumKeys => (
            raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM,
            raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
                keynum: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_2 {
                    keynumidx: 0,
                    firstkey: 1,
                    keystep: 1,
                },
            },
        ),
    };
    let key = raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 1 },
        },
        find_keys_type,
        fk,
    };
    // Terminated by an entry whose begin_search_type is 0 (INVALID).
    let end = raw::RedisModuleCommandKeySpec {
        notes: ptr::null(),
        flags: 0,
        begin_search_type: raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INVALID,
        bs: raw::RedisModuleCommandKeySpec__bindgen_ty_1 {
            index: raw::RedisModuleCommandKeySpec__bindgen_ty_1__bindgen_ty_1 { pos: 0 },
        },
        find_keys_type: raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_OMITTED,
        fk: raw::RedisModuleCommandKeySpec__bindgen_ty_2 {
            range: raw::RedisModuleCommandKeySpec__bindgen_ty_2__bindgen_ty_1 {
                lastkey: 0,
                keystep: 0,
                limit: 0,
            },
        },
    };
    [key, end]
}

/// Version 1 of the command-info ABI with the sizes of the structs we pass
/// (what `REDISMODULE_COMMAND_INFO_VERSION` points to in C).
const INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
};

/// Sets the docs, arity and key spec of the command just created as `name`.
///
/// Returns false only when Redis refuses the description (a bug in the tables
/// above, logged by Redis with the reason). On a server without the API (before
/// 7.0) it does nothing: the command keeps its legacy (1, 1, 1) key positions.
pub fn describe(ctx: *mut Ctx, name: &CStr) -> bool {
    ffi::contained("command docs", false, || unsafe {
        describe_inner(ctx, name)
    })
}

unsafe fn describe_inner(ctx: *mut Ctx, name: &CStr) -> bool {
    let (Some(get_command), Some(set_info)) =
        (raw::RedisModule_GetCommand, raw::RedisModule_SetCommandInfo)
    else {
        return true;
    };
    let Some(doc) = name.to_str().ok().and_then(doc_for) else {
        ffi::log_warning(&format!("rlock: no command docs for {name:?}"));
        return false;
    };
    let command = get_command(ctx, name.as_ptr());
    if command.is_null() {
        return false;
    }
    let mut layout = Layout::default();
    let mut specs = key_specs(doc.key_flags, doc.keys);
    let version = INFO_VERSION;
    let info = raw::RedisModuleCommandInfo {
        version: &version,
        summary: layout.string(&doc.summary),
        complexity: layout.string(&doc.complexity),
        since: layout.string(SINCE),
        history: ptr::null_mut(),
        tips: layout.opt_string(doc.tips),
        arity: doc.arity,
        key_specs: specs.as_mut_ptr(),
        args: layout.args(&doc.args),
    };
    let ok = set_info(command, &info) == ffi::OK;
    if !ok {
        ffi::log_warning(&format!(
            "rlock: Redis refused the command docs of {name:?}"
        ));
    }
    // Redis has copied everything it keeps; `layout` and `specs` are freed here.
    drop(layout);
    if ok {
        categorize(command, name);
    }
    ok
}

/// ACL categories of a command, for servers that let modules set them.
fn acl_categories(name: &str) -> &'static CStr {
    match name.rsplit('.').next() {
        Some("acquire") | Some("acquireall") => c"write blocking slow",
        // INFO lists every holder (and the FAIRLOCK queue): O(N), not fast.
        Some("info") => c"read slow",
        Some("setstate") | Some("delta") | Some("deltas") => c"write slow dangerous",
        _ => c"write fast",
    }
}

/// Redis 7.2+ (and Valkey) let modules put commands in ACL categories, so that
/// `+@write` or `-@blocking` cover them; 7.0 has no such API and leaves module
/// commands in none. A refusal is logged, not fatal: the command still works.
unsafe fn categorize(command: *mut raw::RedisModuleCommand, name: &CStr) {
    let Some(set_categories) = raw::RedisModule_SetCommandACLCategories else {
        return;
    };
    let categories = acl_categories(name.to_str().unwrap_or(""));
    if set_categories(command, categories.as_ptr()) != ffi::OK {
        ffi::log_warning(&format!(
            "rlock: Redis refused ACL categories {categories:?} for {name:?}"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_categories_follow_what_commands_do() {
        assert_eq!(acl_categories("rlock.acquire"), c"write blocking slow");
        assert_eq!(acl_categories("rwlock.info"), c"read slow");
        assert_eq!(acl_categories("rlock.delta"), c"write slow dangerous");
        assert_eq!(acl_categories("fairlock.release"), c"write fast");
        assert_eq!(acl_categories("rlock.setstate"), c"write slow dangerous");
    }

    const ALL: [&str; 26] = [
        "rlock.acquire",
        "rlock.release",
        "rlock.renew",
        "rlock.forcerelease",
        "rlock.info",
        "fairlock.acquire",
        "fairlock.release",
        "fairlock.renew",
        "fairlock.forcerelease",
        "fairlock.info",
        "rwlock.acquire",
        "rwlock.release",
        "rwlock.renew",
        "rwlock.forcerelease",
        "rwlock.info",
        "rlock.setstate",
        "rlock.delta",
        "rlock.deltas",
        "rlock.acquireall",
        "rlock.releaseall",
        "rlock.renewall",
        "semaphore.acquire",
        "semaphore.release",
        "semaphore.renew",
        "semaphore.forcerelease",
        "semaphore.info",
    ];

    #[test]
    fn every_command_is_described() {
        for name in ALL {
            let doc = doc_for(name).unwrap_or_else(|| panic!("{name}"));
            assert!(!doc.summary.contains('{'), "{name}: {}", doc.summary);
            assert!(!doc.complexity.contains('{'), "{name}: {}", doc.complexity);
            let first = match doc.keys {
                KeySearch::One => "key",
                KeySearch::Pairs => "change",
                KeySearch::NumKeys => "numkeys",
            };
            assert_eq!(doc.args[0].name, first, "{name}");
        }
        assert_eq!(acl_categories("rlock.acquireall"), c"write blocking slow");
        assert_eq!(acl_categories("rlock.deltas"), c"write slow dangerous");
        assert!(doc_for("rlock.nope").is_none());
        assert!(doc_for("other.acquire").is_none());
    }

    #[test]
    fn rwlock_has_the_mode_word() {
        let names =
            |n: &str| -> Vec<&str> { doc_for(n).unwrap().args.iter().map(|a| a.name).collect() };
        assert_eq!(
            names("rwlock.acquire"),
            ["key", "mode", "owner", "lease", "timeout", "keepalive"]
        );
        assert_eq!(names("rwlock.release"), ["key", "mode", "owner"]);
        assert_eq!(names("rwlock.renew"), ["key", "owner", "lease"]);
        assert_eq!(
            names("rlock.acquire"),
            ["key", "owner", "lease", "timeout", "keepalive"]
        );
        assert_eq!(
            names("rlock.acquireall"),
            ["numkeys", "key", "owner", "lease", "timeout", "keepalive"]
        );
        assert_eq!(names("rlock.releaseall"), ["numkeys", "key", "owner"]);
        assert_eq!(doc_for("rwlock.acquire").unwrap().arity, -4);
        assert_eq!(doc_for("rwlock.release").unwrap().arity, 4);
        assert_eq!(doc_for("rwlock.renew").unwrap().arity, -3);
        assert_eq!(doc_for("fairlock.release").unwrap().arity, 3);
        assert_eq!(
            names("semaphore.acquire"),
            [
                "key",
                "owner",
                "limit",
                "permits",
                "lease",
                "timeout",
                "keepalive"
            ]
        );
        assert_eq!(names("semaphore.release"), ["key", "owner", "permits"]);
        assert_eq!(names("semaphore.renew"), ["key", "owner", "lease"]);
    }

    #[test]
    fn layout_is_zero_terminated() {
        let mut layout = Layout::default();
        let doc = doc_for("rwlock.acquire").unwrap();
        let p = layout.args(&doc.args);
        let args = unsafe { std::slice::from_raw_parts(p, doc.args.len() + 1) };
        assert!(args[doc.args.len()].name.is_null());
        let mode = &args[1];
        let sub = unsafe { std::slice::from_raw_parts(mode.subargs, 3) };
        let token = |a: &raw::RedisModuleCommandArg| unsafe { CStr::from_ptr(a.token) };
        assert_eq!(token(&sub[0]), c"READ");
        assert_eq!(token(&sub[1]), c"WRITE");
        assert!(sub[2].name.is_null());
        assert_eq!(args[0].key_spec_index, 0);
        assert_eq!(args[2].key_spec_index, -1);
    }
}
