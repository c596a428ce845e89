//! A minimal RESP2 client over a plain TCP socket: queue commands, flush them
//! in one write (pipelining), read replies with or without a deadline.
//!
//! The benchmark needs things a general client hides: thousands of connections
//! that send a blocking command and are never read, pub/sub waits with precise
//! timeouts (`ppoll`, not `SO_RCVTIMEO`, which rounds up to a kernel tick), `epoll`
//! over thousands of parked connections, and
//! a count of every command sent.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Simple(String),
    Error(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn text(&self) -> String {
        match self {
            Value::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Value::Simple(s) | Value::Error(s) => s.clone(),
            Value::Int(v) => v.to_string(),
            Value::Nil => "(nil)".into(),
            Value::Array(a) => format!("{a:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Value::Error(_))
    }
}

/// Something that can be a command argument.
pub trait Arg {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]>;
}

impl Arg for str {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.as_bytes().into()
    }
}
impl Arg for String {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.as_bytes().into()
    }
}
impl Arg for [u8] {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.into()
    }
}
impl Arg for Vec<u8> {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.as_slice().into()
    }
}
macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
                self.to_string().into_bytes().into()
            }
        }
    )*};
}
int_arg!(i32, i64, u32, u64, usize);
impl<T: Arg + ?Sized> Arg for &T {
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        (**self).bytes()
    }
}

/// Queues one command on a connection: `q!(conn; "SET", key, owner, "NX")`.
#[macro_export]
macro_rules! q {
    ($c:expr; $($x:expr),+ $(,)?) => {
        $c.queue(&[$(&$x as &dyn $crate::resp::Arg),+])
    };
}

/// Sends one command and waits for its reply: `cmd!(conn; "PING")`.
#[macro_export]
macro_rules! cmd {
    ($c:expr; $($x:expr),+ $(,)?) => {{
        $crate::q!($c; $($x),+);
        $c.flush().and_then(|_| $c.read())
    }};
}

pub struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    rpos: usize,
    wbuf: Vec<u8>,
    /// Commands queued since the connection was made.
    pub sent: u64,
}

impl Conn {
    pub fn connect(port: u16) -> io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        // A safety net: no read waits forever on a server that stopped answering.
        stream.set_read_timeout(Some(Duration::from_secs(120)))?;
        Ok(Conn {
            stream,
            rbuf: Vec::new(),
            rpos: 0,
            wbuf: Vec::new(),
            sent: 0,
        })
    }

    pub fn queue(&mut self, args: &[&dyn Arg]) {
        self.sent += 1;
        let _ = write!(self.wbuf, "*{}\r\n", args.len());
        for a in args {
            let b = a.bytes();
            let _ = write!(self.wbuf, "${}\r\n", b.len());
            self.wbuf.extend_from_slice(&b);
            self.wbuf.extend_from_slice(b"\r\n");
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf)?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Waits for the next reply.
    pub fn read(&mut self) -> io::Result<Value> {
        loop {
            if let Some(v) = self.parse_buffered()? {
                return Ok(v);
            }
            self.fill()?;
        }
    }

    /// The next reply if one arrives within `timeout` (zero: only what is
    /// already there or arrives without waiting).
    pub fn read_timeout(&mut self, timeout: Duration) -> io::Result<Option<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.parse_buffered()? {
                return Ok(Some(v));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !self.wait_readable(left)? {
                return Ok(None);
            }
            self.fill()?;
        }
    }

    /// Whether a reply is buffered or the socket is readable, without waiting.
    pub fn has_data(&mut self) -> io::Result<bool> {
        Ok(self.rpos < self.rbuf.len() || self.wait_readable(Duration::ZERO)?)
    }

    /// Reads `n` replies.
    pub fn read_n(&mut self, n: usize) -> io::Result<Vec<Value>> {
        (0..n).map(|_| self.read()).collect()
    }

    fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.stream.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        loop {
            let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
            if r >= 0 {
                return Ok(r > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.rpos > 0 && self.rpos == self.rbuf.len() {
            self.rbuf.clear();
            self.rpos = 0;
        } else if self.rpos > 1 << 16 {
            self.rbuf.drain(..self.rpos);
            self.rpos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "server closed the connection",
            ));
        }
        self.rbuf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    fn parse_buffered(&mut self) -> io::Result<Option<Value>> {
        match parse(&self.rbuf[self.rpos..]) {
            Ok(Some((v, used))) => {
                self.rpos += used;
                Ok(Some(v))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }
}

/// Readiness of many connections at once (`epoll`): thousands of parked
/// clients watched while each wait costs what is ready, not what is watched
/// (a `poll` over N sockets is O(N) per wait, which made collecting N replies
/// grow faster than N on the client's side).
pub struct Readiness {
    epoll: libc::c_int,
}

impl Readiness {
    /// Watches `conns[i]` for each i in `among`, for reading.
    pub fn new(conns: &[Conn], among: &[usize]) -> io::Result<Readiness> {
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(io::Error::last_os_error());
        }
        let set = Readiness { epoll };
        for &i in among {
            set.control(libc::EPOLL_CTL_ADD, &conns[i], i)?;
        }
        Ok(set)
    }

    /// Stops watching `conn` (its reply is in).
    pub fn forget(&self, conn: &Conn, i: usize) -> io::Result<()> {
        self.control(libc::EPOLL_CTL_DEL, conn, i)
    }

    fn control(&self, op: libc::c_int, conn: &Conn, i: usize) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: i as u64,
        };
        let fd = conn.stream.as_raw_fd();
        if unsafe { libc::epoll_ctl(self.epoll, op, fd, &mut event) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The watched connections that become readable within `timeout`, each
    /// named by its index.
    pub fn wait(&self, timeout: Duration) -> io::Result<Vec<usize>> {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        loop {
            let n =
                unsafe { libc::epoll_wait(self.epoll, events.as_mut_ptr(), events.len() as _, ms) };
            if n >= 0 {
                return Ok(events[..n as usize]
                    .iter()
                    .map(|e| e.u64 as usize)
                    .collect());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Readiness {
    fn drop(&mut self) {
        unsafe { libc::close(self.epoll) };
    }
}

impl Conn {
    /// Whether a whole or partial reply is already read from the socket.
    pub fn has_buffered(&self) -> bool {
        self.rpos < self.rbuf.len()
    }
}

fn line(buf: &[u8]) -> Option<(&[u8], usize)> {
    let end = buf.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[..end], end + 2))
}

fn number(b: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(b)))
}

/// Parses one reply from the front of `buf`: `None` if incomplete.
fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, String> {
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    let Some((head, mut used)) = line(&buf[1..]) else {
        return Ok(None);
    };
    used += 1;
    let text = || String::from_utf8_lossy(head).into_owned();
    let v = match tag {
        b'+' => Value::Simple(text()),
        b'-' => Value::Error(text()),
        b':' => Value::Int(number(head)?),
        b'$' => {
            let n = number(head)?;
            if n < 0 {
                Value::Nil
            } else {
                let n = n as usize;
                if buf.len() < used + n + 2 {
                    return Ok(None);
                }
                let v = Value::Bulk(buf[used..used + n].to_vec());
                used += n + 2;
                v
            }
        }
        b'*' => {
            let n = number(head)?;
            if n < 0 {
                Value::Nil
            } else {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    match parse(&buf[used..])? {
                        Some((v, u)) => {
                            items.push(v);
                            used += u;
                        }
                        None => return Ok(None),
                    }
                }
                Value::Array(items)
            }
        }
        other => return Err(format!("unexpected reply type byte {other:#x}")),
    };
    Ok(Some((v, used)))
}
