//! A wake-up of the event loop at a given microsecond.
//!
//! Redis fires module timers on its event loop's millisecond clock: a timer
//! armed for a millisecond fires up to 2 ms after it begins (the delay is in
//! whole milliseconds, and `epoll_wait` rounds its timeout up once more).
//! Where that matters (a waiter is handed the lock at the first millisecond
//! its holder's lease allows), a thread of the module sleeps until the
//! microsecond and wakes the event loop with `RM_EventLoopAddOneShot` (a pipe
//! the event loop watches), whose callback then runs on the main thread. That
//! thread-safe call is the only one the waker thread makes into Redis.

use std::os::raw::c_void;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use redis_module::raw;

/// Runs on the main thread, in the event loop (also while Redis processes
/// events in the middle of a load or a long script: it must not change the
/// keyspace itself).
pub type Callback = unsafe extern "C" fn(*mut c_void);

type AddOneShot = unsafe extern "C" fn(raw::RedisModuleEventLoopOneShotFunc, *mut c_void) -> i32;

struct Alarm {
    at: Instant,
    call: Callback,
}

#[derive(Default)]
struct Waker {
    alarm: Mutex<Option<Alarm>>,
    changed: Condvar,
}

static WAKER: OnceLock<Option<&'static Waker>> = OnceLock::new();

/// Has `call` run on the main thread soon after the unix microsecond `at_us`,
/// in place of the alarm set before (one alarm at a time: the caller's next
/// one supersedes it). False where the server lacks the API, or the thread
/// could not start: the caller's own timer is then all there is.
pub fn wake_at(at_us: i64, call: Callback) -> bool {
    let Some(w) = waker() else {
        return false;
    };
    let ahead = at_us.saturating_sub(crate::ffi::micros()).max(0);
    let at = Instant::now() + Duration::from_micros(ahead as u64);
    let mut alarm = lock(w);
    let sooner = alarm.as_ref().is_none_or(|a| at < a.at);
    *alarm = Some(Alarm { at, call });
    drop(alarm);
    // A later alarm needs no wake-up: the thread looks again when it wakes
    // for the earlier one.
    if sooner {
        w.changed.notify_one();
    }
    true
}

fn waker() -> Option<&'static Waker> {
    *WAKER.get_or_init(|| {
        // Set when the module loaded, read here on the main thread.
        let add = unsafe { raw::RedisModule_EventLoopAddOneShot }?;
        let w: &'static Waker = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("rlock-waker".into())
            .spawn(move || ring(w, add))
            .ok()?;
        Some(w)
    })
}

fn lock(w: &Waker) -> MutexGuard<'_, Option<Alarm>> {
    // Nothing panics while holding it; a poisoned lock still holds a valid alarm.
    w.alarm.lock().unwrap_or_else(|e| e.into_inner())
}

/// The waker thread: sleeps until the alarm is due, then rings it.
fn ring(w: &'static Waker, add: AddOneShot) {
    let mut alarm = lock(w);
    loop {
        let due = alarm.as_ref().map(|a| (a.at, a.call));
        let now = Instant::now();
        alarm = match due {
            None => w.changed.wait(alarm).unwrap_or_else(|e| e.into_inner()),
            Some((at, _)) if at > now => {
                let (guard, _) = w
                    .changed
                    .wait_timeout(alarm, at - now)
                    .unwrap_or_else(|e| e.into_inner());
                guard
            }
            Some((_, call)) => {
                *alarm = None;
                drop(alarm);
                // Fails only for a null callback; the pipe write it makes
                // may find the pipe full, which wakes the loop all the same.
                unsafe { add(Some(call), std::ptr::null_mut()) };
                lock(w)
            }
        };
    }
}
