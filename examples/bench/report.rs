//! BENCHMARKS.md: machine, versions, tables, ratios and the targets.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::locks::{Family, Impl, Lock};
use crate::persist::Persist;
use crate::readers::{OpCost, ReadersScale};
use crate::server::Stall;
use crate::{Env, Results, FLOOR, NATIVE, PLAIN_FLOOR};

pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn proc_field(path: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once([':', '='])?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

/// UTC date and time without a date crate (days-to-civil, Howard Hinnant).
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn git(root: &Path) -> String {
    let r = root.to_string_lossy();
    let commit = first_line("git", &["-C", &r, "rev-parse", "--short", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", &r, "status", "--porcelain", "--", "src", "Cargo.toml"])
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{commit} (with uncommitted changes to src/ or Cargo.toml)")
    } else {
        commit
    }
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let s = format!("{:.0}", v);
    let (sign, digits) = s.split_at(if s.starts_with('-') { 1 } else { 0 });
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    format!("{sign}{out}")
}

fn f2(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.2}")
    } else {
        "n/a".into()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Met,
    Missed,
    NotRun,
}

struct Target {
    id: &'static str,
    what: String,
    measured: String,
    required: &'static str,
    status: Status,
}

fn status(ok: bool) -> Status {
    if ok {
        Status::Met
    } else {
        Status::Missed
    }
}

fn not_run(id: &'static str, what: &str, required: &'static str) -> Target {
    Target {
        id,
        what: what.into(),
        measured: "not run".into(),
        required,
        status: Status::NotRun,
    }
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::Reentrant => "RLOCK",
        Family::Fair => "FAIRLOCK",
        Family::Write => "RWLOCK WRITE",
        Family::Read => "RWLOCK READ",
    }
}

fn lua_of(native: Lock) -> Lock {
    Lock {
        imp: Impl::Lua,
        ..native
    }
}

fn targets(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    let cost = |l: Lock| r.costs.iter().find(|c| c.lock == l);
    let plain = cost(PLAIN_FLOOR);
    let vs_plain = |x: Option<f64>| -> String {
        match x {
            Some(x) => format!(" ({x:.2}x on a server without the module)"),
            None => String::new(),
        }
    };
    // Plain servers (no AOF, no replica), then with a replica attached: each
    // native row against the floor and Redisson's Lua on the same setup.
    for (replica, ids, setup) in [
        (
            false,
            [
                "acquire-vs-set",
                "acquire-vs-lua",
                "release-vs-floor",
                "release-vs-lua",
            ],
            "",
        ),
        (
            true,
            [
                "replica-acquire-vs-set",
                "replica-vs-lua",
                "replica-release-vs-floor",
                "replica-vs-lua",
            ],
            ", with a replica",
        ),
    ] {
        let floor = if replica { FLOOR.with_replica() } else { FLOOR };
        for n in NATIVE {
            let n = if replica { n.with_replica() } else { n };
            let fam = match setup {
                "" => family_name(n.fam).to_string(),
                _ => format!("{}{setup}:", family_name(n.fam)),
            };
            // The plain-server comparison only for the plain rows.
            let plain = plain.filter(|_| !replica);
            match (cost(n), cost(floor), cost(lua_of(n))) {
                (Some(nc), Some(fc), Some(lc)) => {
                    let vs_floor = |native: f64, floor: f64, x: f64, plain: Option<f64>| {
                        format!(
                            "{} vs {} µs, {x:.2}x{}",
                            f2(native),
                            f2(floor),
                            vs_plain(plain)
                        )
                    };
                    let (a, r) = (nc.acquire_ratio(fc), nc.release_ratio(fc));
                    let (la, lr) = (lc.acquire_ratio(nc), lc.release_ratio(nc));
                    t.extend([
                        Target {
                            id: ids[0],
                            what: format!("{fam} acquire vs `SET NX PX` (server µs/call)"),
                            measured: vs_floor(
                                nc.acquire(),
                                fc.acquire(),
                                a,
                                plain.map(|p| nc.acquire_ratio(p)),
                            ),
                            required: "≤ 1.2x",
                            status: status(a <= 1.2),
                        },
                        Target {
                            id: ids[1],
                            what: format!("{fam} acquire vs Redisson Lua acquire"),
                            measured: format!("{la:.2}x cheaper"),
                            required: "≥ 3x cheaper",
                            status: status(la >= 3.0),
                        },
                        Target {
                            id: ids[2],
                            what: format!("{fam} release vs Lua compare-and-delete release"),
                            measured: vs_floor(
                                nc.release(),
                                fc.release(),
                                r,
                                plain.map(|p| nc.release_ratio(p)),
                            ),
                            required: "≤ 1.2x",
                            status: status(r <= 1.2),
                        },
                        Target {
                            id: ids[3],
                            what: format!("{fam} release vs Redisson Lua release"),
                            measured: format!("{lr:.2}x cheaper"),
                            required: "≥ 3x cheaper",
                            status: status(lr >= 3.0),
                        },
                    ]);
                }
                _ => {
                    t.push(not_run(
                        ids[0],
                        &format!("{fam} acquire vs SET NX PX"),
                        "≤ 1.2x",
                    ));
                    t.push(not_run(
                        ids[1],
                        &format!("{fam} acquire vs Lua"),
                        "≥ 3x cheaper",
                    ));
                    t.push(not_run(ids[2], &format!("{fam} release vs CAD"), "≤ 1.2x"));
                    t.push(not_run(
                        ids[3],
                        &format!("{fam} release vs Lua"),
                        "≥ 3x cheaper",
                    ));
                }
            }
        }
    }
    let at64 = |l: Lock| r.contention.iter().find(|c| c.lock == l && c.k == 64);
    for fam in [Family::Reentrant, Family::Fair] {
        let n = Lock::new(Impl::Native, fam);
        let name = family_name(fam);
        match (at64(n), at64(lua_of(n))) {
            (Some(nc), Some(lc)) => {
                let x = nc.rate() / lc.rate();
                t.push(Target {
                    id: "k64-rate",
                    what: format!("K = 64: {name} acquisitions/s vs Redisson protocol"),
                    measured: format!("{} vs {} /s = {x:.2}x", num(nc.rate()), num(lc.rate())),
                    required: "≥ 3x",
                    status: status(x >= 3.0),
                });
                let exact = nc.stats.commands == 2 * nc.stats.acquisitions;
                t.push(Target {
                    id: "k64-commands",
                    what: format!("K = 64: {name} commands per acquisition"),
                    measured: format!(
                        "{} commands / {} acquisitions = {:.4}",
                        nc.stats.commands,
                        nc.stats.acquisitions,
                        nc.commands_per_acquisition()
                    ),
                    required: "exactly 2",
                    status: status(exact),
                });
                let w = nc.wakeups_per_release();
                t.push(Target {
                    id: "k64-wakeups",
                    what: format!("K = 64: {name} wake-ups per release"),
                    measured: format!(
                        "{} replies to parked clients / {} releases = {w:.3}",
                        nc.parked_grants, nc.stats.acquisitions
                    ),
                    required: "1 (never more)",
                    status: status(nc.parked_grants <= nc.stats.acquisitions && w >= 0.9),
                });
            }
            _ => {
                t.push(not_run("k64-rate", &format!("K = 64: {name} rate"), "≥ 3x"));
                t.push(not_run(
                    "k64-commands",
                    &format!("K = 64: {name} commands"),
                    "exactly 2",
                ));
                t.push(not_run(
                    "k64-wakeups",
                    &format!("K = 64: {name} wake-ups"),
                    "1",
                ));
            }
        }
    }
    // Counted from deadline + 1 ms, the first moment a grant is allowed.
    let handoff = |imp: Impl| r.expiry.iter().find(|h| h.lock.imp == imp);
    for (id, p, limit, req) in [
        ("expiry-p50", 50.0, 1.5, "≤ 1.5 ms"),
        ("expiry-p99", 99.0, 3.0, "≤ 3 ms"),
    ] {
        let what = format!("Expiry hand-over p{p:.0} (deadline + 1 ms -> waiter's grant)");
        match handoff(Impl::Native) {
            Some(h) => {
                let x = h.percentile_ms(p) - 1.0;
                t.push(Target {
                    id,
                    what,
                    measured: format!(
                        "{x:.2} ms ({} trials){}",
                        h.delays_us.len(),
                        handoff(Impl::Lua)
                            .map(|l| format!("; Redisson {:.2} ms", l.percentile_ms(p) - 1.0))
                            .unwrap_or_default()
                    ),
                    required: req,
                    status: status(x <= limit),
                });
            }
            None => t.push(not_run(id, &what, req)),
        }
    }
    let native_w: Vec<_> = r
        .waiters
        .iter()
        .filter(|w| w.lock.imp == Impl::Native)
        .collect();
    match (
        native_w.iter().find(|w| w.waiters == 1),
        native_w
            .iter()
            .filter(|w| w.waiters > 1)
            .max_by_key(|w| w.waiters),
    ) {
        (Some(one), Some(many)) => {
            let x = many.server_us / one.server_us;
            t.push(Target {
                id: "release-10k",
                what: format!(
                    "Release with {} waiters vs with 1 (server µs/call)",
                    many.waiters
                ),
                measured: format!(
                    "{} / {} µs = {x:.2}x",
                    f2(many.server_us),
                    f2(one.server_us)
                ),
                required: "≤ 2x",
                status: status(x <= 2.0 && many.waiters >= r.waiters_wanted),
            });
        }
        _ => t.push(not_run(
            "release-10k",
            "Release with 10,000 waiters vs 1",
            "≤ 2x",
        )),
    }
    match r
        .memory
        .iter()
        .find(|m| m.lock.imp == Impl::Native)
        .and_then(|m| m.idle.as_ref().map(|i| (m, i)))
    {
        Some((m, i)) => t.push(Target {
            id: "idle-cpu",
            what: format!("Idle server holding {} leased locks", num(m.locks as f64)),
            measured: format!("{:.2}% of one core over {:.0} s", i.cpu_pct, i.secs),
            required: "< 2%",
            status: status(i.cpu_pct < 2.0),
        }),
        None => t.push(not_run(
            "idle-cpu",
            "Idle server with 1,000,000 leased locks",
            "< 2%",
        )),
    }
    let mem = |imp: Impl| r.memory.iter().find(|m| m.lock.imp == imp);
    match (mem(Impl::Native), mem(Impl::Lua)) {
        (Some(n), Some(l)) => t.push(Target {
            id: "memory-per-lock",
            what: format!(
                "Memory per lock, one holder ({} locks), vs Redisson's hash",
                num(n.locks as f64)
            ),
            measured: format!(
                "{} vs {} bytes, {:.2}x",
                num(n.bytes_per_lock),
                num(l.bytes_per_lock),
                n.bytes_per_lock / l.bytes_per_lock
            ),
            required: "≤ 1x (177 B on Redis 7.0)",
            status: status(n.bytes_per_lock <= l.bytes_per_lock),
        }),
        _ => t.push(not_run(
            "memory-per-lock",
            "Memory per lock vs Redisson's hash",
            "≤ 1x (177 B on Redis 7.0)",
        )),
    }
    t.extend(readers_targets(r));
    t.extend(storm_targets(r));
    t.extend(persist_targets(r));
    t.push(Target {
        id: "runtime",
        what: "Benchmark run time (this program, after the build)".into(),
        measured: format!("{:.0} s", r.runtime_s),
        required: "< 600 s",
        status: status(r.runtime_s < 600.0),
    });
    t
}

fn readers_targets(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    let sizes = |replica: bool| r.readers.iter().filter(move |x| x.replica == replica);
    let top = r.readers.iter().map(|x| x.readers).max();
    for k in 0..3 {
        let get = |x: &'_ ReadersScale| x.ops()[k].1.us_per_call;
        let op = ["acquire", "renew", "release"][k];
        let what = |n: usize| {
            format!(
                "RWLOCK READ {op} with {} readers in vs 1 (server µs/call)",
                num(n as f64)
            )
        };
        let mut parts = Vec::new();
        let mut ok = true;
        for replica in [false, true] {
            let one = sizes(replica).find(|x| x.readers == 1);
            let many = sizes(replica).max_by_key(|x| x.readers);
            if let (Some(one), Some(many)) = (one, many) {
                let x = get(many) / get(one);
                ok &= x <= 2.0;
                parts.push(format!(
                    "{}: {} vs {} µs = {x:.2}x",
                    if replica {
                        "with a replica"
                    } else {
                        "no replica"
                    },
                    f2(get(many)),
                    f2(get(one))
                ));
            }
        }
        match top {
            Some(n) if n > 1 && !parts.is_empty() => t.push(Target {
                id: "readers-scale",
                what: what(n),
                measured: parts.join("; "),
                required: "≤ 2x",
                status: status(ok),
            }),
            _ => t.push(not_run("readers-scale", &what(100_000), "≤ 2x")),
        }
    }
    let worst = sizes(true)
        .flat_map(|x| x.ops().map(|(op, c)| (x.readers, op, c)))
        .filter_map(|(n, op, c)| c.bytes_per_change.map(|b| (n, op, b)))
        .max_by(|a, b| a.2.total_cmp(&b.2));
    match worst {
        Some((n, op, b)) => t.push(Target {
            id: "readers-bytes",
            what: "Replicated bytes per RWLOCK READ change (worst op and size)".into(),
            measured: format!("{} B ({op} with {} readers in)", num(b), num(n as f64)),
            required: "≤ 300 B at every size",
            status: status(b <= 300.0),
        }),
        None => t.push(not_run(
            "readers-bytes",
            "Replicated bytes per RWLOCK READ change",
            "≤ 300 B at every size",
        )),
    }
    let small = r.admit.iter().min_by_key(|a| a.queued);
    let large = r.admit.iter().max_by_key(|a| a.queued);
    match (small, large) {
        (Some(s), Some(l)) if l.queued > s.queued => {
            let x = l.us_per_reader() / s.us_per_reader();
            let wanted = r.admit_wanted.iter().copied().max().unwrap_or(0);
            t.push(Target {
                id: "admit-readers",
                what: format!(
                    "One `RWLOCK.RELEASE ... WRITE` admitting {} queued readers: time per reader vs {}",
                    num(l.queued as f64),
                    num(s.queued as f64)
                ),
                measured: format!(
                    "{} vs {} µs/reader = {x:.2}x (worst PING {} ms)",
                    f2(l.us_per_reader()),
                    f2(s.us_per_reader()),
                    f2(l.stall.worst_ms)
                ),
                required: "≤ 2x (O(N) in total)",
                status: status(x <= 2.0 && l.queued >= wanted && l.served == l.queued),
            });
        }
        _ => t.push(not_run(
            "admit-readers",
            "One release admitting 10,000 queued readers",
            "≤ 2x (O(N) in total)",
        )),
    }
    t
}

fn storm_targets(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    let native = r.storms.iter().find(|x| x.lock.imp == Impl::Native);
    let redis = r.storms.iter().find(|x| x.lock.imp != Impl::Native);
    match (native, redis) {
        (Some(n), Some(p)) => {
            let limit = p.stall.worst_ms.max(30.0);
            t.push(Target {
                id: "storm-stall",
                what: format!(
                    "Expiry storm, {} leases with one deadline: worst PING",
                    num(n.leases as f64)
                ),
                measured: format!(
                    "{} ms (p99 {} ms); Redis's own expiry of as many SET PX keys: {} ms",
                    f2(n.stall.worst_ms),
                    f2(n.stall.p99_ms),
                    f2(p.stall.worst_ms)
                ),
                required: "≤ 30 ms or ≤ Redis's own",
                status: status(n.stall.worst_ms <= limit),
            });
            let ended = match (n.all_ended_ms, n.waiters_served_ms) {
                (Some(a), Some(w)) => Some(a.max(w)),
                (Some(a), None) if n.waiters == 0 => Some(a),
                _ => None,
            };
            t.push(Target {
                id: "storm-ended",
                what: format!(
                    "Expiry storm: all {} leases ended and {} waiters served",
                    num(n.leases as f64),
                    num(n.waiters as f64)
                ),
                measured: match ended {
                    Some(ms) => format!(
                        "{} ms after the deadline; Redis's SET PX keys all gone after {}",
                        num(ms),
                        p.all_ended_ms
                            .map(|v| format!("{} ms", num(v)))
                            .unwrap_or("over 30 s".into())
                    ),
                    None => format!(
                        "not within 30 s ({} of {} waiters served)",
                        n.served, n.waiters
                    ),
                },
                required: "≤ 2 s",
                status: status(ended.is_some_and(|ms| ms <= 2000.0)),
            });
        }
        _ => {
            t.push(not_run(
                "storm-stall",
                "Expiry storm: worst PING",
                "≤ 30 ms or ≤ Redis's own",
            ));
            t.push(not_run("storm-ended", "Expiry storm: all ended", "≤ 2 s"));
        }
    }
    t
}

fn persist_targets(r: &Results) -> Vec<Target> {
    let mut t = Vec::new();
    let native = r.persist.iter().find(|x| x.lock.imp == Impl::Native);
    let plain = r.persist.iter().find(|x| x.lock.imp == Impl::PlainFloor);
    type Get = fn(&Persist) -> f64;
    let ratios: [(&'static str, &str, Get, f64, &'static str, &str); 6] = [
        (
            "persist-rdb",
            "RDB size",
            |x| x.rdb_bytes as f64,
            1.5,
            "≤ 1.5x",
            "B",
        ),
        (
            "persist-rdb",
            "`SAVE` time",
            |x| x.save_ms,
            1.5,
            "≤ 1.5x",
            "ms",
        ),
        (
            "persist-aof",
            "AOF rewrite size",
            |x| x.aof_bytes as f64,
            1.5,
            "≤ 1.5x",
            "B",
        ),
        (
            "persist-aof",
            "AOF rewrite time",
            |x| x.rewrite_ms,
            1.5,
            "≤ 1.5x",
            "ms",
        ),
        (
            "persist-flushall",
            "`FLUSHALL` time",
            |x| x.flush_ms,
            1.5,
            "≤ 1.5x",
            "ms",
        ),
        (
            "reload",
            "`DEBUG RELOAD` time",
            |x| x.reload_ms,
            1.3,
            "≤ 1.3x",
            "ms",
        ),
    ];
    for (id, what, get, limit, req, unit) in ratios {
        match (native, plain) {
            (Some(n), Some(p)) => {
                let x = get(n) / get(p);
                let per = |v: f64| {
                    if unit == "B" {
                        format!("{:.1} B/key", v / n.n as f64)
                    } else {
                        format!("{} ms", num(v))
                    }
                };
                t.push(Target {
                    id,
                    what: format!("{} locks vs as many SET PX keys: {what}", num(n.n as f64)),
                    measured: format!("{} vs {}, {x:.2}x", per(get(n)), per(get(p))),
                    required: req,
                    status: status(x <= limit),
                });
            }
            _ => t.push(not_run(
                id,
                &format!("{what}, 1,000,000 locks vs SET PX"),
                req,
            )),
        }
    }
    match (native, plain) {
        (Some(n), Some(p)) => t.push(Target {
            id: "persist-flushall",
            what: format!(
                "{} locks, {} waiters parked on them: `FLUSHALL` worst PING vs Redis's own",
                num(n.n as f64),
                num(n.flush_waiters as f64)
            ),
            measured: format!(
                "{} ms vs {} ms (SET PX keys, no module); {} of {} waiters told TRYAGAIN",
                f2(n.flush_stall.worst_ms),
                f2(p.flush_stall.worst_ms),
                n.flush_told_retry,
                n.flush_waiters
            ),
            required: "≤ Redis's own + 30 ms",
            status: status(
                n.flush_stall.worst_ms <= p.flush_stall.worst_ms + 30.0
                    && n.flush_told_retry == n.flush_waiters,
            ),
        }),
        _ => t.push(not_run(
            "persist-flushall",
            "`FLUSHALL` with waiters: worst PING",
            "≤ Redis's own + 30 ms",
        )),
    }
    for (id, what, get) in [
        (
            "reload",
            "worst PING after `DEBUG RELOAD` until the lease schedule is rebuilt",
            (|x: &Persist| x.rebuild_stall) as fn(&Persist) -> Stall,
        ),
        (
            "promote-stall",
            "`REPLICAOF NO ONE` on a replica holding them: worst PING",
            |x: &Persist| x.promote_stall,
        ),
    ] {
        match (native, plain) {
            (Some(n), Some(p)) => t.push(Target {
                id,
                what: format!("{} locks: {what}", num(n.n as f64)),
                measured: format!(
                    "{} ms; Redis without the module, SET PX keys: {} ms",
                    f2(get(n).worst_ms),
                    f2(get(p).worst_ms)
                ),
                required: "≤ 30 ms",
                status: status(get(n).worst_ms <= 30.0),
            }),
            _ => t.push(not_run(id, what, "≤ 30 ms")),
        }
    }
    t
}

/// The paragraphs of bench/findings.md before its first section that start with "Method.".
fn findings_method(root: &Path) -> String {
    let text = std::fs::read_to_string(root.join("bench/findings.md")).unwrap_or_default();
    let head = text.split("\n## ").next().unwrap_or("");
    head.split("\n\n")
        .filter(|p| p.starts_with("Method."))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `## <id>: title` sections of bench/findings.md, by id.
fn findings(root: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root.join("bench/findings.md")).unwrap_or_default();
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            let id = h.split(':').next().unwrap_or("").trim().to_string();
            out.push((id, format!("### {h}\n")));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

pub fn render(env: &Env, r: &Results, root: &Path) -> String {
    let mut s = String::new();
    let cfg = &env.cfg;
    let w = &mut s;
    let _ = writeln!(w, "# rlock benchmarks\n");
    let _ = writeln!(
        w,
        "Written by `make bench` (`cargo run --release --example bench`, source in \
         `examples/bench/`, Lua baselines in `bench/lua/`) on {}. Mode: **{}**. \
         Every number below comes from this one run; nothing is edited by hand. \
         Numbers depend on the machine and on what else ran on it (see the load average).\n",
        utc_now(),
        if cfg.quick {
            "quick (`BENCH_QUICK=1`: reduced sizes, a smoke run; not the reference numbers)"
        } else {
            "full"
        }
    );

    let _ = writeln!(w, "## Machine and versions\n");
    let _ = writeln!(w, "| | |\n|---|---|");
    let cpu = proc_field("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = proc_field("/proc/meminfo", "MemTotal")
        .and_then(|v| {
            v.split_whitespace()
                .next()
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let os = proc_field("/etc/os-release", "PRETTY_NAME").unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let rows = [
        ("CPU", format!("{cpu} ({cores} cores available)")),
        ("Memory", mem),
        ("OS / kernel", format!("{os} / Linux {kernel}")),
        ("redis-server", first_line("redis-server", &["--version"])),
        ("rustc", first_line("rustc", &["--version"])),
        (
            "rlock",
            format!("{} at commit {}", env!("CARGO_PKG_VERSION"), git(root)),
        ),
        (
            "Load average (1/5/15 min)",
            format!("{} at start, {} at end", r.load_before, r.load_after),
        ),
        ("Open-files limit", r.fd_limit.to_string()),
        (
            "Run time",
            format!("{:.0} s (excluding the build)", r.runtime_s),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(w, "| {k} | {v} |");
    }

    let ts = targets(r);
    let _ = writeln!(w, "\n## Targets\n");
    let missed = ts.iter().filter(|t| t.status == Status::Missed).count();
    let met = ts.iter().filter(|t| t.status == Status::Met).count();
    let _ = writeln!(
        w,
        "{met} met, {missed} missed{}. Ratios are from this run.\n",
        match ts.iter().filter(|t| t.status == Status::NotRun).count() {
            0 => String::new(),
            n => format!(", {n} not run (BENCH_ONLY)"),
        }
    );
    let _ = writeln!(
        w,
        "| target | measured | required | status |\n|---|---|---|---|"
    );
    for t in &ts {
        let st = match t.status {
            Status::Met => "met".to_string(),
            Status::Missed => format!("**MISSED** ([why](#{}))", t.id),
            Status::NotRun => "not run".to_string(),
        };
        let _ = writeln!(w, "| {} | {} | {} | {st} |", t.what, t.measured, t.required);
    }

    if !r.costs.is_empty() {
        let _ = writeln!(w, "\n## (a) Uncontended cost\n");
        let _ =
            writeln!(
            w,
            "Server time per call: `CONFIG RESETSTAT`, then {} acquisitions of distinct free keys \
             (one connection, pipelined 500 deep), `INFO commandstats`; then `CONFIG RESETSTAT`, \
             the {} releases, `INFO commandstats`. Lease 30 s, Redisson-style owner names \
             (`<uuid>:<thread>`, 38 bytes). A fresh server per lock and round; {} {}, \
             interleaved across locks; the table shows the median (and the range) of the \
             rounds, and every ratio (here and in the targets) is the median of the per-round \
             ratios, which compare measurements taken seconds apart under the same background \
             load. Lua scripts are called with EVALSHA; their time includes the commands they \
             call. Servers run with `--appendonly no` and no replica, as specified: the \
             module then builds no replicated effects (Redis would drop them); the rows marked \
             \"AOF on\" \
             (`appendonly yes`, `appendfsync no`) show the cost when effects are built and \
             written out, each against the floor with AOF on. The rows marked \"with a \
             replica\" run on a master with a replica attached: a second redis-server loading \
             the module, `REPLICAOF` the master, measured only once the link is up, the initial \
             sync done and the master sees the replica online; effects are then built and sent \
             down the link, as in production. Each is compared with the floor and Redisson's \
             Lua on the same setup (their rows in the same round). Every master in this \
             benchmark runs with `repl-diskless-sync-delay 0` and an unlimited replica output \
             buffer, so no sync waits and no large effect disconnects a replica.\n",
            num(cfg.cost_calls as f64),
            num(cfg.cost_calls as f64),
            cfg.cost_rounds,
            if cfg.cost_rounds == 1 { "round" } else { "rounds" }
        );
        let floor_of = |l: Lock| {
            let f = Lock {
                aof: l.aof,
                replica: l.replica,
                ..FLOOR
            };
            r.costs.iter().find(|c| c.lock == f)
        };
        let _ = writeln!(
            w,
            "| lock | acquire µs/call | release µs/call | acquire vs SET NX PX | release vs CAD release | Lua acquire / native | Lua release / native |\n|---|---|---|---|---|---|---|"
        );
        let range = |v: &[f64]| -> String {
            let med = crate::uncontended::median(v);
            if v.len() > 1 {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                format!("{} ({}–{})", f2(med), f2(lo), f2(hi))
            } else {
                f2(med)
            }
        };
        for c in &r.costs {
            let (vs_floor_a, vs_floor_r) = match floor_of(c.lock) {
                Some(f) if c.lock != f.lock => (
                    format!("{:.2}x", c.acquire_ratio(f)),
                    format!("{:.2}x", c.release_ratio(f)),
                ),
                _ => ("1x".into(), "1x".into()),
            };
            let (lua_a, lua_r) = match (
                c.lock.imp,
                r.costs.iter().find(|x| x.lock == lua_of(c.lock)),
            ) {
                (Impl::Native, Some(l)) => (
                    format!("{:.2}x", l.acquire_ratio(c)),
                    format!("{:.2}x", l.release_ratio(c)),
                ),
                _ => ("".into(), "".into()),
            };
            let _ = writeln!(
                w,
                "| {} | {} | {} | {vs_floor_a} | {vs_floor_r} | {lua_a} | {lua_r} |",
                c.lock.label(),
                range(&c.acquire_us),
                range(&c.release_us)
            );
        }
    }
    if !r.throughput.is_empty() {
        let t0 = &r.throughput[0];
        let _ = writeln!(
            w,
            "\nPipelined throughput: {} client connections (threads), each acquiring distinct free \
             keys {} commands per batch for {} s, then releasing all of them; operations per \
             second of wall time. Client and server share the machine's {} cores, so this is \
             the machine's throughput, not the server's alone.\n",
            t0.clients,
            t0.pipeline,
            cfg.tput_secs,
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0)
        );
        let _ = writeln!(w, "| lock | acquire ops/s | release ops/s |\n|---|---|---|");
        for t in &r.throughput {
            let _ = writeln!(
                w,
                "| {} | {} | {} |",
                t.lock.label(),
                num(t.acquire_per_s),
                num(t.release_per_s)
            );
        }
    }

    if !r.contention.is_empty() {
        let _ = writeln!(w, "\n## (b) Contention\n");
        let _ = writeln!(
            w,
            "K clients (one thread each) on one key, acquire → release in a loop for {} s \
             (clients that are waiting when the time is up finish their turn). Lease 30 s. \
             Native clients send `ACQUIRE ... BLOCK {}` (parked on the server until granted) \
             then `RELEASE`. Redisson clients run Redisson's `lock()` protocol: try the Lua \
             acquire; if it returns the pttl, SUBSCRIBE to the lock's channel (on a second \
             connection), then loop {{ try again; wait for an unlock message or the pttl }}, \
             UNSUBSCRIBE once granted; release with the Lua release, which PUBLISHes the \
             unlock message. Each client is a separate process in Redisson's terms (its own \
             subscription). The fair lock publishes only to the head waiter's own channel.\n\n\
             Latency: from the first acquire attempt to the grant. Commands: every command the \
             clients sent (acquire attempts, SUBSCRIBE/UNSUBSCRIBE, releases) per acquisition. \
             Wake-ups per release: native, replies delivered to parked clients \
             (`INFO rlock` `rlock_contended_grants`; every such reply is a grant); Redisson, \
             unlock messages delivered to subscribers. Failed attempts: acquire attempts that \
             did not grant, per acquisition (equal to retries per release, since every acquisition is released once: Redisson's retries after a wake-up or the pttl; native BLOCK timeouts). \
             Server CPU: the server process's CPU time per acquisition.\n",
            cfg.contention_secs,
            crate::contention::BLOCK_MS
        );
        let _ = writeln!(
            w,
            "| K | lock | acquisitions/s | p50 µs | p99 µs | commands/acq | wake-ups/release | failed attempts/acq | server CPU µs/acq |\n|---|---|---|---|---|---|---|---|---|"
        );
        for c in &r.contention {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.1} |",
                c.k,
                c.lock.label(),
                num(c.rate()),
                num(c.percentile_us(50.0)),
                num(c.percentile_us(99.0)),
                c.commands_per_acquisition(),
                c.wakeups_per_release(),
                c.failed_attempts_per_acquisition(),
                c.server_cpu_us_per_acquisition()
            );
        }
        let _ = writeln!(w, "\nRatios, native / Redisson protocol:\n");
        let _ = writeln!(
            w,
            "| K | lock | acquisitions/s | p99 latency | commands/acq |\n|---|---|---|---|---|"
        );
        for c in r.contention.iter().filter(|c| c.lock.imp == Impl::Native) {
            if let Some(l) = r
                .contention
                .iter()
                .find(|x| x.k == c.k && x.lock == lua_of(c.lock))
            {
                let _ = writeln!(
                    w,
                    "| {} | {} | {:.2}x | {:.2}x | {:.2}x |",
                    c.k,
                    family_name(c.lock.fam),
                    c.rate() / l.rate(),
                    c.percentile_us(99.0) / l.percentile_us(99.0),
                    c.commands_per_acquisition() / l.commands_per_acquisition()
                );
            }
        }
    }

    if !r.expiry.is_empty() {
        let _ = writeln!(w, "\n## (c) Expiry handoff\n");
        let _ = writeln!(
            w,
            "A holder takes the lock with a lease of 30–79 ms (random per trial) and vanishes \
             (closes its connection, never releases); a waiter is already waiting (native: \
             `BLOCK`; Redisson: its protocol, which waits for the pttl since no unlock message \
             comes). Delay = the waiter's grant (reply received, client clock) − the lease \
             deadline (`PEXPIRETIME` of the lock key, unix ms, same clock). A hold is valid \
             through its deadline millisecond, so no grant can come before deadline + 1 ms; \
             the delay is counted from the deadline itself, and in the last two columns (and \
             the targets) from deadline + 1 ms, the first moment a grant is allowed.\n"
        );
        let _ = writeln!(
            w,
            "| lock | trials | min ms | p50 ms | p99 ms | max ms | p50 from deadline + 1 ms | p99 from deadline + 1 ms |\n|---|---|---|---|---|---|---|---|"
        );
        for h in &r.expiry {
            let _ = writeln!(
                w,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                h.lock.label(),
                h.delays_us.len(),
                h.min_ms(),
                h.percentile_ms(50.0),
                h.percentile_ms(99.0),
                h.max_ms(),
                h.percentile_ms(50.0) - 1.0,
                h.percentile_ms(99.0) - 1.0
            );
        }
    }

    if !r.memory.is_empty() {
        let _ = writeln!(w, "\n## (d) Scale\n");
        let n = r.memory[0].locks;
        let _ = writeln!(
            w,
            "Memory: a fresh server, `used_memory` before and after taking {} locks on distinct \
             keys (4 connections, pipelined; lease 1 h; Redisson-style owner names), divided \
             by the number of locks. This counts everything the locks cost the server: keys, \
             values, TTL entries and the module's own bookkeeping (its lease schedule \
             included). `MEMORY USAGE` is what Redis attributes to one key.\n",
            num(n as f64)
        );
        let redisson = r.memory.iter().find(|m| m.lock.imp == Impl::Lua);
        let _ = writeln!(w, "| lock | bytes per lock | vs Redisson hash | MEMORY USAGE of a key | load rate (locks/s) |\n|---|---|---|---|---|");
        for m in &r.memory {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} |",
                m.lock.label(),
                num(m.bytes_per_lock),
                redisson
                    .map(|x| format!("{:.2}x", m.bytes_per_lock / x.bytes_per_lock))
                    .unwrap_or_default(),
                m.memory_usage_key,
                num(m.load_per_s)
            );
        }
        let _ = writeln!(
            w,
            "\nIdle CPU: the same servers, still holding all {} locks (leases not yet due), \
             after 2 s of settling; the server process's CPU time (all threads, from \
             `/proc/<pid>/task/*/schedstat`) over the window, in % of one core. An empty \
             server is shown for reference (Redis's own `serverCron`, hz 10).\n",
            num(n as f64)
        );
        let _ = writeln!(
            w,
            "| server | window s | CPU % of one core |\n|---|---|---|"
        );
        for m in &r.memory {
            if let Some(i) = &m.idle {
                let _ = writeln!(
                    w,
                    "| {} holding {} locks | {:.1} | {:.3} |",
                    m.lock.label(),
                    num(m.locks as f64),
                    i.secs,
                    i.cpu_pct
                );
            }
        }
        if let Some(e) = &r.idle_empty {
            let _ = writeln!(
                w,
                "| empty server (module loaded) | {:.1} | {:.3} |",
                e.secs, e.cpu_pct
            );
        }
    }
    if !r.waiters.is_empty() {
        let _ = writeln!(
            w,
            "\nRelease with many waiters. Native: a steady queue of N clients parked on one key \
             (`ACQUIRE ... BLOCK 0`); each release (from a control connection, in the name of \
             the current holder) hands the lock to the head of the queue, then the previous \
             holder's connection parks again at the tail and the next release waits until the \
             queue is back to N. So every release, for N = 1 as for N = 10,000, finds N waiters \
             and runs the same steps. Every connection has had a reply (PING) before it parks, \
             as a client that has been talking to the server has. The N = 1 and the large-N \
             servers run side by side and take turns (a tenth of the releases at a time), so \
             background load touches both alike. Afterwards every parked connection is checked \
             for a reply: \"woken\" counts the clients that received one in all the releases \
             (each reply is a grant; the grants expected are exactly one per release). \
             Redisson: N connections SUBSCRIBEd to the lock's channel (its waiters), then \
             acquire (EVAL, not measured) + release (EVALSHA, measured) pairs; \"woken\" is the \
             number of receivers of each unlock message (`PUBSUB NUMSUB`), every one of which \
             would retry. Server µs from `INFO commandstats` of the release command only; RTT \
             is the releasing client's round trip.{}\n",
            if r.waiters
                .iter()
                .any(|w| w.waiters > 1 && w.waiters < r.waiters_wanted)
            {
                format!(
                    " **The open-files limit ({}) allowed fewer waiters than the {} asked for.**",
                    r.fd_limit, r.waiters_wanted
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(w, "| lock | waiters | releases | server µs/release | vs 1 waiter | RTT p50 µs | RTT p99 µs | woken |\n|---|---|---|---|---|---|---|---|");
        for x in &r.waiters {
            let one = r
                .waiters
                .iter()
                .find(|o| o.lock == x.lock && o.waiters == 1);
            let woken = match x.lock.imp {
                Impl::Native => format!("{} clients in {} releases", x.woken, x.releases),
                _ => format!("{} per release", x.woken),
            };
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {woken} |",
                x.lock.label(),
                num(x.waiters as f64),
                x.releases,
                f2(x.server_us),
                one.map(|o| format!("{:.2}x", x.server_us / o.server_us))
                    .unwrap_or_default(),
                num(x.rtt_p50_us),
                num(x.rtt_p99_us)
            );
        }
    }

    render_readers(w, r);
    render_storm(w, r);
    render_persist(w, r);

    let missed: Vec<&Target> = ts.iter().filter(|t| t.status == Status::Missed).collect();
    if !missed.is_empty() {
        let _ = writeln!(w, "\n## Missed targets: causes and what would meet them\n");
        let _ = writeln!(
            w,
            "The notes below come from `bench/findings.md`, written when the target was last \
             profiled (callgrind and perf against the module's release build with debug info; \
             `bench/profile.sh` reproduces the instruction counts). They name the commit they \
             were taken at; re-profile if the code has changed since.\n\n{}\n",
            findings_method(root)
        );
        let notes = findings(root);
        let mut seen: Vec<&str> = Vec::new();
        for t in missed {
            if seen.contains(&t.id) {
                continue;
            }
            seen.push(t.id);
            let _ = writeln!(w, "<a id=\"{}\"></a>\n", t.id);
            match notes.iter().find(|(id, _)| id == t.id) {
                Some((_, body)) => {
                    let _ = writeln!(w, "{body}");
                }
                None => {
                    let _ = writeln!(
                        w,
                        "### {}\n\nMissed in this run, and `bench/findings.md` has no profile \
                         for it yet.\n",
                        t.id
                    );
                }
            }
        }
    }
    let notes: Vec<(String, String)> = findings(root)
        .into_iter()
        .filter(|(id, _)| id.starts_with("note-"))
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(w, "\n## Notes from profiling\n");
        for (_, body) in notes {
            let _ = writeln!(w, "{body}");
        }
    }
    let _ = writeln!(w, "\n## Baselines\n");
    let _ = writeln!(
        w,
        "- Floor: `SET key owner NX PX 30000` to acquire, `bench/lua/floor_release.lua` \
         (GET, compare, DEL) to release. Not reentrant, no queue, no fencing.\n\
         - Redisson: `bench/lua/*.lua` re-implement Redisson's scripts as the seed articles \
         describe them: RLock (hash {{owner: holds}} + PEXPIRE, pttl on failure, PUBLISH on \
         release), FairLock (the same hash plus a list queue and a zset of give-up times; \
         release publishes to the head waiter's channel), ReadWriteLock (hash with a `mode` \
         field, one timeout key per read hold, write re-entry extends the TTL).\n\
         - All run on a redis-server with the module loaded, as in a deployment; the floor \
         is also measured on a server without the module, as a reference."
    );
    s
}

fn opt_ms(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "—".into())
}

fn render_readers(w: &mut String, r: &Results) {
    if !r.readers.is_empty() {
        let m = r.readers.iter().map(|x| x.acquire.calls).max().unwrap_or(0);
        let _ = writeln!(w, "\n## (e) Many holders and many waiters\n");
        let _ = writeln!(
            w,
            "RWLOCK READ with N readers already holding one key (distinct Redisson-style owners, \
             lease 1 h, loaded pipelined on a fresh server with no replica). Then, up to {} \
             times, a new reader joins (`ACQUIRE ... READ`), renews (`RENEW ... PX`) and leaves \
             (`RELEASE ... READ`), one command at a time, so the key holds N or N + 1 readers \
             throughout. Server µs per call from `INFO commandstats` (after `CONFIG RESETSTAT`). \
             Then a replica is attached to the same server (full sync, link up) and the same \
             ops run again; bytes per change = the growth of `master_repl_offset` over each \
             command (read after its reply), divided by the calls. The ops stop early after \
             {} s or {} MB sent to the replica per size and setup (the calls column says how \
             many ran). \"Replica in sync\": after `WAIT 1`, `DEBUG DIGEST-VALUE` of the key is \
             the same on both servers.\n",
            num(m as f64),
            crate::readers::OP_BUDGET.as_secs(),
            crate::readers::OP_BYTES_BUDGET >> 20
        );
        let _ = writeln!(
            w,
            "| readers | setup | calls | acquire µs | renew µs | release µs | acquire B/change | renew B/change | release B/change | replica in sync | load s |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        let b = |c: &OpCost| c.bytes_per_change.map(num).unwrap_or_default();
        for x in &r.readers {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
                num(x.readers as f64),
                if x.replica {
                    "with a replica"
                } else {
                    "no replica"
                },
                x.acquire.calls,
                f2(x.acquire.us_per_call),
                f2(x.renew.us_per_call),
                f2(x.release.us_per_call),
                b(&x.acquire),
                b(&x.renew),
                b(&x.release),
                match x.replica_digest_equal {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "",
                },
                x.load_s
            );
        }
    }
    if !r.admit.is_empty() {
        let limited = r
            .admit
            .iter()
            .zip(&r.admit_wanted)
            .any(|(a, &want)| a.queued < want);
        let _ = writeln!(
            w,
            "\nOne release admitting N readers: a writer holds the key, N clients are parked \
             behind it (`RWLOCK.ACQUIRE ... READ ... BLOCK 0`, each after a PING), then the \
             writer releases, which admits all N at once. Release µs: the release command's \
             server time (`INFO commandstats`); the replies to the parked clients may be sent \
             outside it. All served: from sending the release to reading the last reader's \
             grant (one `ppoll` over all the connections); per reader: that divided by N, the \
             measure of O(N). Worst PING: a separate connection PINGing in a tight loop, over \
             the same interval.{}\n",
            if limited {
                format!(
                    " **The open-files limit ({}) allowed fewer readers than asked for.**",
                    r.fd_limit
                )
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            w,
            "| queued readers | release µs (server) | all served ms | µs per reader | worst PING ms | PINGs | granted |\n|---|---|---|---|---|---|---|"
        );
        for a in &r.admit {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {} | {} |",
                num(a.queued as f64),
                num(a.release_us),
                f2(a.all_served_ms),
                f2(a.us_per_reader()),
                f2(a.stall.worst_ms),
                a.stall.pings,
                a.served
            );
        }
    }
}

fn render_storm(w: &mut String, r: &Results) {
    if r.storms.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n## (f) Expiry storm\n");
    let _ = writeln!(
        w,
        "N leases taken on distinct keys (`RLOCK.ACQUIRE key owner PX ms`, 2 connections \
         pipelined 128 deep) with one common target deadline: each call's `PX` is the target \
         minus the client's clock when the call is queued, so the deadlines set differ from \
         the target by the time a call waits in the pipeline (the spread column: \
         `PEXPIRETIME` of every 1/1000th key minus the target, ms). Some keys have one waiter \
         parked behind the lease (`BLOCK 0`). Beside them, Redis's own expiry: as many \
         `SET key owner NX PX ms` keys, same method, on a server without the module. A \
         separate connection PINGs in a tight loop from 1 s before the deadline; worst and \
         p99 are over the PINGs in flight from the deadline until the last lease ended and \
         the last waiter was served (\"quiet\": the worst PING in the second before, the \
         machine's own noise). All ended: from the deadline until `DBSIZE` (polled every \
         millisecond) is down to the waiters' keys, which their waiters now hold. Waiters \
         served: until the last waiter's grant was read.\n"
    );
    let _ = writeln!(
        w,
        "| leases | keys with a waiter | deadline spread ms | worst PING ms | p99 PING ms | PINGs | quiet worst ms | all ended ms | waiters served ms | lease expirations |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.storms {
        let _ = writeln!(
            w,
            "| {} {} | {} | {} .. {} | {} | {} | {} | {} | {} | {} | {} |",
            num(x.leases as f64),
            if x.lock.imp == Impl::Native {
                "RLOCK leases"
            } else {
                "SET PX keys (Redis's own expiry)"
            },
            if x.waiters > 0 {
                format!("{} ({} served)", num(x.waiters as f64), x.served)
            } else {
                "—".into()
            },
            x.spread_ms.0,
            x.spread_ms.1,
            f2(x.stall.worst_ms),
            f2(x.stall.p99_ms),
            x.stall.pings,
            f2(x.quiet.worst_ms),
            opt_ms(x.all_ended_ms),
            opt_ms(x.waiters_served_ms),
            x.expirations.map(|e| num(e as f64)).unwrap_or("—".into())
        );
    }
}

fn render_persist(w: &mut String, r: &Results) {
    let Some(first) = r.persist.first() else {
        return;
    };
    let _ = writeln!(w, "\n## (g) Persistence at scale\n");
    let _ = writeln!(
        w,
        "{} keys on a fresh server, loaded as in (d) (lease 1 h): RLOCK locks, `SET PX` keys \
         on a server with the module, and `SET PX` keys on a server without it (Redis's own \
         cost, the baseline of the targets). Then, on the same server: `SAVE` (round trip; \
         size of `dump.rdb`); the AOF rewrite that `CONFIG SET appendonly yes` starts, with \
         `aof-use-rdb-preamble no` (plain commands; from the command until `INFO persistence` \
         shows it finished, polled every ms, `hz 100` meanwhile so Redis notices the child \
         within 10 ms; size of the base file), then AOF off again; `DEBUG RELOAD` (round trip: \
         save, flush, load), then until `rlock_lease_schedule` is back to N, with a PING loop \
         meanwhile; a replica (with the module, if the server has it) attached and synced, \
         then `REPLICAOF NO ONE` on it with a PING loop on the replica, until it watches all \
         N leases (+100 ms), quiet = the 300 ms before; `FLUSHALL SYNC` (round trip), with \
         clients parked (`BLOCK 0`) on some of the lock keys, who are told `TRYAGAIN`, and the \
         worst PING from the command until the last of them was told.\n",
        num(first.n as f64)
    );
    let _ = writeln!(
        w,
        "| keys | RDB B/key | SAVE ms | AOF rewrite B/key | rewrite ms | DEBUG RELOAD ms | schedule rebuilt after ms | worst PING ms | REPLICAOF NO ONE ms | promoted: schedule after ms | worst PING ms (quiet) | FLUSHALL ms | waiters told TRYAGAIN | worst PING ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.persist {
        let n = x.n as f64;
        let _ = writeln!(
            w,
            "| {} | {:.1} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} ({}) | {} | {} | {} |",
            match x.lock.imp {
                Impl::Native => "RLOCK locks".to_string(),
                Impl::PlainFloor => "SET PX keys, server without the module".into(),
                _ => "SET PX keys, server with the module".into(),
            },
            x.rdb_bytes as f64 / n,
            num(x.save_ms),
            x.aof_bytes as f64 / n,
            num(x.rewrite_ms),
            num(x.reload_ms),
            num(x.rebuild_ms),
            f2(x.rebuild_stall.worst_ms),
            f2(x.promote_ms),
            num(x.promote_rebuild_ms),
            f2(x.promote_stall.worst_ms),
            f2(x.promote_quiet.worst_ms),
            num(x.flush_ms),
            if x.flush_waiters > 0 {
                format!("{} of {}", x.flush_told_retry, x.flush_waiters)
            } else {
                "—".into()
            },
            f2(x.flush_stall.worst_ms)
        );
    }
}

/// A few lines for the terminal.
pub fn summary(r: &Results) -> String {
    let mut s = String::new();
    for t in targets(r) {
        let st = match t.status {
            Status::Met => "met   ",
            Status::Missed => "MISSED",
            Status::NotRun => "skip  ",
        };
        let _ = writeln!(
            s,
            "{st} {} — {} (required {})",
            t.what, t.measured, t.required
        );
    }
    s
}
