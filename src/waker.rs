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
/// one supersedes it). Nothing where the server lacks the API or the thread
/// could not start: the caller's own timer is then all there is.
pub fn wake_at(at_us: i64, call: Callback) {
    if let Some(w) = waker() {
        let ahead = at_us.saturating_sub(crate::ffi::micros()).max(0);
        w.set(Instant::now() + Duration::from_micros(ahead as u64), call);
    }
}

fn waker() -> Option<&'static Waker> {
    *WAKER.get_or_init(|| {
        // Set when the module loaded, read here on the main thread.
        let add = unsafe { raw::RedisModule_EventLoopAddOneShot }?;
        Waker::start(add)
    })
}

impl Waker {
    /// A waker whose thread rings its alarms through `add`.
    fn start(add: AddOneShot) -> Option<&'static Waker> {
        let w: &'static Waker = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("rlock-waker".into())
            .spawn(move || ring(w, add))
            .ok()?;
        Some(w)
    }

    fn set(&self, at: Instant, call: Callback) {
        let mut alarm = lock(self);
        let sooner = alarm.as_ref().is_none_or(|a| at < a.at);
        *alarm = Some(Alarm { at, call });
        drop(alarm);
        // A later alarm needs no wake-up: the thread looks again when it
        // wakes for the earlier one.
        if sooner {
            self.changed.notify_one();
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// What the waker thread rang, and when: a stand-in for the server's
    /// `RM_EventLoopAddOneShot`, which would run the callback on the main
    /// thread.
    static RUNG: Mutex<Option<Sender<(Instant, usize)>>> = Mutex::new(None);

    unsafe extern "C" fn record(
        call: raw::RedisModuleEventLoopOneShotFunc,
        data: *mut c_void,
    ) -> i32 {
        if let Some(call) = call {
            call(data);
        }
        0
    }

    fn sender() -> Sender<(Instant, usize)> {
        RUNG.lock().unwrap().clone().expect("a receiver")
    }

    unsafe extern "C" fn first(_: *mut c_void) {
        let _ = sender().send((Instant::now(), 1));
    }

    unsafe extern "C" fn second(_: *mut c_void) {
        let _ = sender().send((Instant::now(), 2));
    }

    // One test, one channel: the alarms of each case are told apart by the
    // callback that rang.
    fn rung() -> Receiver<(Instant, usize)> {
        let (tx, rx) = channel();
        *RUNG.lock().unwrap() = Some(tx);
        rx
    }

    #[test]
    fn alarms_ring_once_never_early_and_the_last_one_set_wins() {
        let rx = rung();
        let w = Waker::start(record).expect("a thread");
        let generous = Duration::from_secs(5);

        // One alarm: rung once, not before its time.
        let at = Instant::now() + Duration::from_millis(30);
        w.set(at, first);
        let (t, which) = rx.recv_timeout(generous).expect("rung");
        assert_eq!(which, 1);
        assert!(t >= at, "rung {:?} early", at - t);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());

        // A later alarm replaces an earlier one: only the later rings, at
        // its own time (the thread wakes for the earlier and sleeps again).
        let early = Instant::now() + Duration::from_millis(20);
        let late = Instant::now() + Duration::from_millis(80);
        w.set(early, first);
        w.set(late, second);
        let (t, which) = rx.recv_timeout(generous).expect("rung");
        assert_eq!(which, 2);
        assert!(t >= late, "rung {:?} early", late - t);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());

        // An earlier alarm set while the thread sleeps for a later one
        // wakes it: rung at the earlier time, well before the later.
        let late = Instant::now() + Duration::from_secs(60);
        w.set(late, first);
        std::thread::sleep(Duration::from_millis(20));
        let soon = Instant::now() + Duration::from_millis(10);
        w.set(soon, second);
        let (t, which) = rx.recv_timeout(generous).expect("rung");
        assert_eq!(which, 2);
        assert!(t >= soon);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    }
}
