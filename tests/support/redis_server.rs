//! A throwaway `redis-server` for tests and benches: a free loopback port,
//! a temporary directory, no persistence, killed on drop.
//!
//! When `redis-server` is not installed, [`RedisServer::start`] says so
//! loudly on stderr and returns `None` (the test then passes without
//! running), unless `REQUIRE_REDIS=1` is set, in which case it panics. Set
//! `REDIS_SERVER` to use another binary.

#![allow(
    dead_code,
    reason = "each includer uses a part (an expect would fail for the one that uses all)"
)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or deliberately killed) `redis-server`.
pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    binary: String,
    debug_flag: bool,
    /// Extra `--option value` arguments, kept across restarts.
    config: Vec<String>,
}

fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

fn required() -> bool {
    std::env::var("REQUIRE_REDIS").is_ok_and(|v| v == "1")
}

/// The server's major version, or `None` when it cannot be run.
fn major_version(binary: &str) -> Option<u32> {
    let out = Command::new(binary).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "Redis server v=7.0.15 sha=..."
    let v = text.split("v=").nth(1)?;
    v.split('.').next()?.parse().ok()
}

fn free_port() -> u16 {
    // redis-server has no `--port 0`: let the kernel pick a free port, then
    // release it for the server (a race with other processes is retried).
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

impl RedisServer {
    /// Starts a server for the test `name`, or returns `None` after saying
    /// on stderr that the test was skipped and why.
    ///
    /// # Panics
    ///
    /// When `redis-server` is missing and `REQUIRE_REDIS=1`, or when it
    /// does not start.
    pub(crate) fn start(name: &str) -> Option<RedisServer> {
        Self::start_with(name, &[])
    }

    /// As [`start`](Self::start), with extra configuration arguments (such
    /// as `["--timeout", "1"]`), kept across [`restart`](Self::restart).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub(crate) fn start_with(name: &str, config: &[&str]) -> Option<RedisServer> {
        let binary = binary();
        let Some(major) = major_version(&binary) else {
            let msg = format!(
                "`{binary}` not found: install it (Debian/Ubuntu: `apt-get install redis-server`)"
            );
            assert!(!required(), "REQUIRE_REDIS=1 but {msg}");
            // Straight to the process's stderr: libtest captures `eprintln!`
            // of passing tests, and this must not go unseen.
            // One write, so parallel tests do not interleave their lines.
            let line = format!(
                "\n*** SKIPPED Redis test `{name}`: {msg}, or set REDIS_SERVER=/path/to/redis-server; \
                 set REQUIRE_REDIS=1 to make this a failure ***\n"
            );
            let _ = std::io::stderr().write_all(line.as_bytes());
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "tokio-ratelimit-redis-{}-{name}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).expect("create the server's temp dir");
        let mut server = RedisServer {
            child: None,
            port: 0,
            dir,
            binary,
            // DEBUG is off by default from Redis 7 on.
            debug_flag: major >= 7,
            config: config.iter().map(|&a| a.to_owned()).collect(),
        };
        for _ in 0..10 {
            server.port = free_port();
            if server.spawn() {
                return Some(server);
            }
        }
        panic!("redis-server did not start (see {})", server.dir.display());
    }

    /// Starts the process on `self.port`; false if it exited (port taken).
    fn spawn(&mut self) -> bool {
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"));
        if self.debug_flag {
            cmd.args(["--enable-debug-command", "local"]);
        }
        cmd.args(&self.config);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            if self.ping() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// `redis://127.0.0.1:<port>/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's port (kept across [`restart`](Self::restart)).
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server runs (it was not [`kill`](Self::kill)ed).
    pub(crate) fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (SIGKILL): connections drop, state is lost.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends the running server `signal` (a name `kill` knows, such as
    /// `"STOP"`).
    ///
    /// # Panics
    ///
    /// When the server is not running or `kill` fails.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("the server is not running").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}: {status}");
    }

    /// Stalls the server (SIGSTOP): its connections stay open, the kernel
    /// still accepts new ones, and nothing is answered until
    /// [`cont`](Self::cont).
    pub(crate) fn stop(&self) {
        self.signal("STOP");
    }

    /// Resumes a server stalled by [`stop`](Self::stop) (SIGCONT).
    pub(crate) fn cont(&self) {
        self.signal("CONT");
    }

    /// Starts a fresh server on the same port (after [`kill`](Self::kill)).
    ///
    /// # Panics
    ///
    /// When it does not come up.
    pub(crate) fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Permits left in `key`'s first band, read through `l` without taking any
/// (a peek changes nothing in Redis). With a rate too slow to drain a
/// permit during a test, `capacity - available` is what the key was
/// poured.
pub(crate) async fn available(l: &tokio_ratelimit::redis::RedisFunnel, key: &str) -> u32 {
    l.peek(key, 1)
        .await
        .unwrap()
        .bands()
        .next()
        .unwrap()
        .available
}
