//! The second-wave sections: (m) multi-key locks, (k) KEEPALIVE, (s) semaphores.

use std::fmt::Write as _;

use super::production::holders_targets;
use super::{f2, not_run, num, status, Target};
use crate::keepalive::Renewal;
use crate::uncontended::median;
use crate::Results;

pub fn multilock_targets(r: &Results) -> Vec<Target> {
    let at = |native: bool| r.multilock.iter().find(|m| m.native == native && m.k == 16);
    match (at(true), at(false)) {
        (Some(n), Some(l)) => {
            let x = n.rate() / l.rate();
            vec![
                Target {
                    id: "multilock-rate",
                    what: "K = 16, random pairs of 8 keys: ACQUIREALL acquisitions/s vs Redisson's MultiLock".into(),
                    measured: format!("{} vs {} /s = {x:.2}x", num(n.rate()), num(l.rate())),
                    required: "≥ 5x",
                    status: status(x >= 5.0),
                },
                Target {
                    id: "multilock-commands",
                    what: "K = 16: ACQUIREALL commands per acquisition".into(),
                    measured: format!(
                        "{} commands / {} acquisitions = {:.4}",
                        n.stats.commands,
                        n.stats.acquisitions,
                        n.commands_per_acquisition()
                    ),
                    required: "exactly 2",
                    status: status(n.stats.commands == 2 * n.stats.acquisitions),
                },
            ]
        }
        _ => vec![not_run(
            "multilock-rate",
            "K = 16: ACQUIREALL acquisitions/s vs Redisson's MultiLock",
            "≥ 5x",
        )],
    }
}

pub fn keepalive_targets(r: &Results) -> Vec<Target> {
    let row = |k: Renewal| r.keepalive.iter().find(|x| x.renewal == k);
    let (Some(floor), Some(ka), Some(client)) = (
        row(Renewal::None),
        row(Renewal::Server),
        row(Renewal::Client),
    ) else {
        return vec![not_run(
            "keepalive-cpu",
            "KEEPALIVE holdings: server CPU apart from the renewals",
            "< 2% of a core",
        )];
    };
    // CPU per renewal: what each row costs above the floor, per renewal, in
    // each window (the three setups measured over the same windows).
    let (ka_us, client_us) = (ka.us_per_renewal(floor), client.us_per_renewal(floor));
    let ratios: Vec<f64> = ka_us.iter().zip(&client_us).map(|(k, c)| k / c).collect();
    let ratio = median(&ratios);
    let listed = |v: &[f64]| v.iter().map(|x| f2(*x)).collect::<Vec<_>>().join(", ");
    let rate = ka.renewals_per_s / ka.expected_per_s();
    vec![
        Target {
            id: "keepalive-cpu",
            what: format!(
                "{} holdings (no KEEPALIVE work): server CPU when idle",
                num(floor.holdings as f64)
            ),
            measured: format!(
                "{}% of a core; with KEEPALIVE {}% (renewals included)",
                f2(floor.cpu_pct),
                f2(ka.cpu_pct)
            ),
            required: "< 2% of a core apart from the renewals",
            status: status(floor.cpu_pct < 2.0),
        },
        Target {
            id: "keepalive-rate",
            what: "KEEPALIVE renewals per second vs 3 × holdings / lease".into(),
            measured: format!(
                "{} /s vs {} /s expected = {rate:.2}x",
                num(ka.renewals_per_s),
                num(ka.expected_per_s())
            ),
            required: "0.9x – 1.1x",
            status: status((0.9..=1.1).contains(&rate)),
        },
        Target {
            id: "keepalive-cost",
            what: "Server CPU per KEEPALIVE renewal vs per client RLOCK.RENEW".into(),
            measured: format!(
                "{} µs vs {} µs = {ratio:.2}x (median of the windows' ratios; windows: {} µs vs {} µs)",
                f2(median(&ka_us)),
                f2(median(&client_us)),
                listed(&ka_us),
                listed(&client_us),
            ),
            required: "≤ 1x",
            status: status(ratio <= 1.0),
        },
    ]
}

pub fn semaphore_targets(r: &Results) -> Vec<Target> {
    holders_targets(
        &r.semaphore_holders,
        "SEMAPHORE",
        "holdings",
        ["semaphore-scale", "semaphore-bytes"],
    )
}

fn render_semaphores(w: &mut String, r: &Results) {
    if r.semaphore_holders.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n## (s) Semaphores\n");
    let _ = writeln!(
        w,
        "Uncontended costs of `SEMAPHORE.ACQUIRE key owner LIMIT 8 PX 30000` and \
         `SEMAPHORE.RELEASE` against the floor and Redisson's permit-expirable semaphore are \
         rows of (a); K = 64 clients on one semaphore of LIMIT 8 are rows of (b). Here: one \
         semaphore (LIMIT 10,000,000) with N holdings of one permit each, distinct \
         Redisson-style owners, lease 1 h; then, as in (e), a new owner acquires, renews and \
         releases, one command at a time, without and then with a replica attached.\n"
    );
    let _ = writeln!(
        w,
        "| holdings | setup | calls | acquire µs | renew µs | release µs | acquire B/change | renew B/change | release B/change | replica in sync |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.semaphore_holders {
        let b = |c: &crate::readers::OpCost| c.bytes_per_change.map(num).unwrap_or_default();
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
            }
        );
    }
}

pub fn render_second_wave(w: &mut String, r: &Results) {
    render_semaphores(w, r);
    if !r.multilock.is_empty() {
        let _ = writeln!(w, "\n## (m) Multi-key locks\n");
        let _ = writeln!(
            w,
            "K clients (one thread each) each lock a random pair of 8 keys (a transfer between \
             accounts: from → to, so two clients often want the same keys in opposite orders), \
             release at once, and go again, for the same time as (b). Native: \
             `RLOCK.ACQUIREALL 2 from to owner PX 30000 BLOCK 10000`, then `RLOCK.RELEASEALL`. \
             Redisson: RedissonMultiLock's `lock()`: attempts of `tryLock(waitTime = 1500 ms per \
             lock)`, each taking the locks in order with `RLock.tryLock(remaining time)` (the \
             Lua acquire, SUBSCRIBE, wait for the unlock message or the pttl); a lock not \
             granted in time makes it unlock the ones it holds and start over. Latency: from \
             the first command to holding both keys. After each run every key must be free.\n"
        );
        let _ = writeln!(
            w,
            "| K | protocol | acquisitions/s | p50 µs | p99 µs | commands/acq | server CPU µs/acq |\n|---|---|---|---|---|---|---|"
        );
        for m in &r.multilock {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {} | {} | {:.3} | {:.1} |",
                m.k,
                m.label(),
                num(m.rate()),
                num(m.percentile_us(50.0)),
                num(m.percentile_us(99.0)),
                m.commands_per_acquisition(),
                m.server_cpu_us_per_acquisition()
            );
        }
    }
    if !r.keepalive.is_empty() {
        let _ = writeln!(w, "\n## (k) KEEPALIVE\n");
        let _ = writeln!(
            w,
            "N holdings acquired over 8 connections that stay open, a replica attached. \
             KEEPALIVE: the server renews each holding every third of its lease. Client RENEW: \
             the same holdings acquired without KEEPALIVE, renewed by one client with \
             `RLOCK.RENEW` in batches every 100 ms at the rate KEEPALIVE renews. Floor: the \
             same holdings with a 1 h lease and nobody renewing. The three masters (and their \
             replicas) run side by side and are measured over the same windows, one after \
             another, each one renewal period (a third of the lease) long, after one full \
             renewal cycle, so that background load falls on each alike. CPU: the master process over the windows. Renewals/s: \
             `rlock_keepalive_renewals` (KEEPALIVE) or RENEWs answered (client). Replication: \
             growth of `master_repl_offset`. CPU per renewal (targets): the master's CPU above \
             the floor's in the same window, per renewal; the ratio is the median of the \
             windows' ratios.\n"
        );
        let _ = writeln!(
            w,
            "| holdings | renewal | lease ms | window s | CPU % of a core | renewals/s | expected /s | replication B/s |\n|---|---|---|---|---|---|---|---|"
        );
        for x in &r.keepalive {
            let _ = writeln!(
                w,
                "| {} | {} | {} | {:.1} | {} | {} | {} | {} |",
                num(x.holdings as f64),
                x.label(),
                x.lease_ms,
                x.secs,
                f2(x.cpu_pct),
                num(x.renewals_per_s),
                if x.renewal == Renewal::None {
                    "0".into()
                } else {
                    num(x.expected_per_s())
                },
                num(x.repl_bytes_per_s)
            );
        }
    }
}
