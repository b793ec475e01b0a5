//! Loopback proxies in front of a Redis server, for the fault tests: one
//! that loses replies after Redis ran what it was sent, one that stops
//! answering new connections.
#![allow(
    dead_code,
    reason = "each includer uses a part (an expect would fail for the one that uses all)"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::sleep;

/// A proxy to Redis on `upstream` that, while `to_lose` is above zero,
/// takes one read chunk holding an `EVALSHA` (a decision's or a peek's),
/// passes it on to Redis, and closes that connection `hold` later without
/// passing back what Redis answered. Everything else goes through. (As
/// `tests/redis.rs`'s proxy, which closes at once, with the hold a
/// parameter.)
pub(crate) fn reply_losing_proxy(
    listener: tokio::net::TcpListener,
    upstream: u16,
    to_lose: Arc<AtomicU32>,
    hold: Duration,
) -> tokio::task::JoinHandle<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                .await
                .unwrap();
            let to_lose = to_lose.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Replies pass while `pass`; after, they are read and
                // dropped, and the client's side stays open (no FIN) until
                // the hold is over.
                let pass = Arc::new(AtomicBool::new(true));
                let back = {
                    let pass = pass.clone();
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n @ 1..) = sr.read(&mut buf).await {
                            if pass.load(Ordering::SeqCst) && cw.write_all(&buf[..n]).await.is_err()
                            {
                                break;
                            }
                        }
                    })
                };
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = cr.read(&mut buf).await {
                    let chunk = &buf[..n];
                    let evalsha = chunk.windows(7).any(|w| w == b"EVALSHA");
                    let lost = evalsha
                        && to_lose
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                            .is_ok();
                    if lost {
                        pass.store(false, Ordering::SeqCst);
                    }
                    if sw.write_all(chunk).await.is_err() {
                        break;
                    }
                    if lost {
                        sleep(hold).await;
                        break;
                    }
                }
                back.abort();
            });
        }
    })
}

/// A proxy to Redis on `upstream`; once `dead` is set, connections it
/// accepts are held open and never answered (a host that stopped
/// answering), while connections made before go through until Redis
/// closes them.
pub(crate) fn dying_proxy(
    listener: tokio::net::TcpListener,
    upstream: u16,
    dead: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((client, _)) = listener.accept().await {
            if dead.load(Ordering::SeqCst) {
                held.push(client);
                continue;
            }
            let mut server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                .await
                .unwrap();
            tokio::spawn(async move {
                let mut client = client;
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}
