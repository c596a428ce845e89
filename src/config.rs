//! Module configuration: `rlock.*` configs, settable as `loadmodule` arguments,
//! in redis.conf and with CONFIG SET (registered in lib.rs).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

pub static DEFAULT_LEASE_MS: AtomicI64 = AtomicI64::new(30_000);
pub static NOTIFY_CHANNEL: AtomicBool = AtomicBool::new(true);
pub static NOTIFY_KEYSPACE: AtomicBool = AtomicBool::new(true);
pub static DEADLOCK_CHECK_MS: AtomicI64 = AtomicI64::new(1000);

/// How long a waiter waits before deadlock detection checks it (0: off).
pub fn deadlock_check_ms() -> i64 {
    DEADLOCK_CHECK_MS.load(Ordering::Relaxed)
}

pub fn default_lease_ms() -> i64 {
    DEFAULT_LEASE_MS.load(Ordering::Relaxed)
}

pub fn notify_channel() -> bool {
    NOTIFY_CHANNEL.load(Ordering::Relaxed)
}

pub fn notify_keyspace() -> bool {
    NOTIFY_KEYSPACE.load(Ordering::Relaxed)
}

/// Upper bound of `rlock.default-lease-ms` (about 100 years), so that
/// `now + lease` always fits the 64-bit millisecond clock.
pub const MAX_LEASE_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Applies `loadmodule ... <name> <value> ...` pairs. Names may carry the
/// `rlock.` prefix or not. Anything unknown or invalid refuses the load.
pub fn apply_module_args(args: &[&[u8]]) -> Result<(), String> {
    if !args.len().is_multiple_of(2) {
        return Err("module arguments must be <config> <value> pairs".into());
    }
    for pair in args.chunks(2) {
        let name = String::from_utf8_lossy(pair[0]).to_ascii_lowercase();
        let value = String::from_utf8_lossy(pair[1]).to_ascii_lowercase();
        match name.strip_prefix("rlock.").unwrap_or(&name) {
            "default-lease-ms" => {
                let ms: i64 = value
                    .parse()
                    .ok()
                    .filter(|ms| (1..=MAX_LEASE_MS).contains(ms))
                    .ok_or_else(|| format!("default-lease-ms must be an integer in 1..={MAX_LEASE_MS}, got '{value}'"))?;
                DEFAULT_LEASE_MS.store(ms, Ordering::Relaxed);
            }
            "deadlock-check-ms" => {
                let ms: i64 = value
                    .parse()
                    .ok()
                    .filter(|ms| (0..=MAX_LEASE_MS).contains(ms))
                    .ok_or_else(|| format!("deadlock-check-ms must be an integer in 0..={MAX_LEASE_MS}, got '{value}'"))?;
                DEADLOCK_CHECK_MS.store(ms, Ordering::Relaxed);
            }
            "notify-channel" => NOTIFY_CHANNEL.store(yes_no(&name, &value)?, Ordering::Relaxed),
            "notify-keyspace" => NOTIFY_KEYSPACE.store(yes_no(&name, &value)?, Ordering::Relaxed),
            _ => return Err(format!("unknown module argument '{name}'")),
        }
    }
    Ok(())
}

fn yes_no(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "yes" => Ok(true),
        "no" => Ok(false),
        _ => Err(format!("{name} must be yes or no, got '{value}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_args_are_validated() {
        assert!(apply_module_args(&[b"default-lease-ms"]).is_err());
        assert!(apply_module_args(&[b"default-lease-ms", b"0"]).is_err());
        assert!(apply_module_args(&[b"notify-channel", b"maybe"]).is_err());
        assert!(apply_module_args(&[b"bogus", b"1"]).is_err());
        assert!(apply_module_args(&[b"rlock.notify-keyspace", b"YES"]).is_ok());
    }
}
