//! Userspace network delay: relays that sit between client and edge (TCP, for HTTP and gRPC)
//! and between edge and cloud (UDP, for QUIC) and hold every datagram or chunk for a seeded
//! random one-way delay before passing it on, in order. The kernel here has no netem, and a
//! delay paid on the wire, not by sleeping inside a service, keeps transport behaviour (QUIC's
//! RTT estimates, TCP windows) honest.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Largest UDP datagram relayed (QUIC keeps datagrams under ~1,500 bytes; this is the IPv4
/// maximum, so nothing is ever truncated).
const MAX_DATAGRAM: usize = 65_535;

/// Bytes read from a TCP stream before they are scheduled as one chunk.
const TCP_CHUNK: usize = 64 * 1024;

/// Datagrams or chunks in flight per direction before the reader waits (backpressure).
const QUEUE: usize = 4096;

/// One-way delay added to every datagram or chunk.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DelayModel {
    None,
    Uniform { min_s: f64, max_s: f64 },
}

impl DelayModel {
    /// Parses `none`, `S` (a fixed delay in seconds) or `uniform:MIN,MAX` (seconds).
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("expected none, SECONDS or uniform:MIN,MAX in seconds, got {s:?}");
        let model = if s == "none" || s == "0" {
            DelayModel::None
        } else if let Some(range) = s.strip_prefix("uniform:") {
            let (a, b) = range.split_once(',').ok_or_else(bad)?;
            let min_s: f64 = a.trim().parse().map_err(|_| bad())?;
            let max_s: f64 = b.trim().parse().map_err(|_| bad())?;
            DelayModel::Uniform { min_s, max_s }
        } else {
            let fixed: f64 = s.parse().map_err(|_| bad())?;
            DelayModel::Uniform {
                min_s: fixed,
                max_s: fixed,
            }
        };
        if let DelayModel::Uniform { min_s, max_s } = model
            && !(min_s.is_finite()
                && max_s.is_finite()
                && 0.0 <= min_s
                && min_s <= max_s
                && max_s <= 60.0)
        {
            return Err(format!(
                "delay bounds must satisfy 0 <= min <= max <= 60 s, got {s:?}"
            ));
        }
        Ok(model)
    }

    /// Mean one-way delay in seconds.
    pub fn mean_s(&self) -> f64 {
        match *self {
            DelayModel::None => 0.0,
            DelayModel::Uniform { min_s, max_s } => (min_s + max_s) / 2.0,
        }
    }

    fn sample(&self, rng: &mut StdRng) -> Duration {
        match *self {
            DelayModel::None => Duration::ZERO,
            DelayModel::Uniform { min_s, max_s } if max_s > min_s => {
                Duration::from_secs_f64(rng.random_range(min_s..max_s))
            }
            DelayModel::Uniform { min_s, .. } => Duration::from_secs_f64(min_s),
        }
    }
}

/// Items closer together than this form one burst and share one sampled delay.
///
/// A request or reply is a burst of packets; sampling every packet independently would make
/// a 20-packet reply wait for the largest of 20 samples (~the maximum of the range) instead
/// of one draw, and the round trip would no longer follow the configured distribution.
const BURST_GAP: Duration = Duration::from_millis(2);

/// Holds items for their delay and releases them in arrival order: an item never overtakes
/// an earlier one, as on a real path without reordering.
struct DelayLine {
    model: DelayModel,
    rng: StdRng,
    current: Duration,
    last_arrival: Option<Instant>,
    last_release: Instant,
}

impl DelayLine {
    fn new(model: DelayModel, seed: u64) -> Self {
        Self {
            model,
            rng: StdRng::seed_from_u64(seed),
            current: Duration::ZERO,
            last_arrival: None,
            last_release: Instant::now(),
        }
    }

    fn release_time(&mut self) -> Instant {
        let now = Instant::now();
        if self
            .last_arrival
            .is_none_or(|last| now.duration_since(last) > BURST_GAP)
        {
            self.current = self.model.sample(&mut self.rng);
        }
        self.last_arrival = Some(now);
        let at = (now + self.current).max(self.last_release);
        self.last_release = at;
        at
    }
}

/// A running relay; stops when dropped.
pub struct Relay {
    pub local_addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn mix(seed: u64, n: u64) -> u64 {
    seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl Relay {
    /// UDP relay on `listen` to `upstream`: each client address gets its own upstream
    /// socket, so replies find their way back.
    pub async fn udp(
        listen: SocketAddr,
        upstream: SocketAddr,
        model: DelayModel,
        seed: u64,
    ) -> std::io::Result<Self> {
        let front = Arc::new(UdpSocket::bind(listen).await?);
        let local_addr = front.local_addr()?;
        let task = tokio::spawn(async move {
            let mut clients: HashMap<SocketAddr, mpsc::Sender<(Instant, Vec<u8>)>> = HashMap::new();
            let mut buf = vec![0u8; MAX_DATAGRAM];
            let mut upstream_line = DelayLine::new(model, seed);
            loop {
                let Ok((n, client)) = front.recv_from(&mut buf).await else {
                    return;
                };
                if !clients.contains_key(&client) {
                    let Ok(tx) = udp_client(
                        Arc::clone(&front),
                        client,
                        upstream,
                        model,
                        mix(seed, clients.len() as u64 + 1),
                    )
                    .await
                    else {
                        continue;
                    };
                    clients.insert(client, tx);
                }
                let at = upstream_line.release_time();
                if let Some(tx) = clients.get(&client) {
                    let _ = tx.send((at, buf[..n].to_vec())).await;
                }
            }
        });
        Ok(Self { local_addr, task })
    }

    /// TCP relay on `listen` to `upstream`: every accepted connection gets its own upstream
    /// connection, each direction delayed.
    pub async fn tcp(
        listen: SocketAddr,
        upstream: SocketAddr,
        model: DelayModel,
        seed: u64,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut connections = 0u64;
            while let Ok((inbound, _)) = listener.accept().await {
                connections += 1;
                let seed = mix(seed, connections);
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let up = tcp_direction(in_read, out_write, DelayLine::new(model, seed));
                    let down =
                        tcp_direction(out_read, in_write, DelayLine::new(model, mix(seed, 0x5eed)));
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(Self { local_addr, task })
    }
}

/// The upstream half of one UDP client: a socket connected to `upstream`, a writer that
/// releases the client's datagrams on time, and a reader that delays replies back to it.
async fn udp_client(
    front: Arc<UdpSocket>,
    client: SocketAddr,
    upstream: SocketAddr,
    model: DelayModel,
    seed: u64,
) -> std::io::Result<mpsc::Sender<(Instant, Vec<u8>)>> {
    let any: SocketAddr = if upstream.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    }
    .parse()
    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let back = Arc::new(UdpSocket::bind(any).await?);
    back.connect(upstream).await?;
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let writer = Arc::clone(&back);
    tokio::spawn(async move {
        while let Some((at, datagram)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if writer.send(&datagram).await.is_err() {
                return;
            }
        }
    });
    let (reply_tx, mut reply_rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    tokio::spawn(async move {
        while let Some((at, datagram)) = reply_rx.recv().await {
            tokio::time::sleep_until(at).await;
            if front.send_to(&datagram, client).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut line = DelayLine::new(model, seed);
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while let Ok(n) = back.recv(&mut buf).await {
            if reply_tx
                .send((line.release_time(), buf[..n].to_vec()))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    Ok(tx)
}

/// Pumps one TCP direction: chunks are read as they come and written after their delay;
/// end of stream is passed on after the data before it.
async fn tcp_direction(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut line: DelayLine,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            match chunk {
                Some(bytes) => {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    });
    let mut buf = vec![0u8; TCP_CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.send((line.release_time(), None)).await;
                break;
            }
            Ok(n) => {
                if tx
                    .send((line.release_time(), Some(buf[..n].to_vec())))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: f64 = 0.02;
    const MAX: f64 = 0.04;

    fn model() -> DelayModel {
        DelayModel::Uniform {
            min_s: MIN,
            max_s: MAX,
        }
    }

    #[test]
    fn parses_delay_models() {
        assert_eq!(DelayModel::parse("none"), Ok(DelayModel::None));
        assert_eq!(
            DelayModel::parse("uniform:0.1,0.2"),
            Ok(DelayModel::Uniform {
                min_s: 0.1,
                max_s: 0.2
            })
        );
        assert_eq!(
            DelayModel::parse("0.05"),
            Ok(DelayModel::Uniform {
                min_s: 0.05,
                max_s: 0.05
            })
        );
        assert!(DelayModel::parse("uniform:0.2,0.1").is_err());
        assert!(DelayModel::parse("uniform:-1,0.1").is_err());
        assert!(DelayModel::parse("fast").is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn udp_round_trips_are_delayed_within_bounds_intact_and_in_order() {
        let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while let Ok((n, from)) = echo.recv_from(&mut buf).await {
                let _ = echo.send_to(&buf[..n], from).await;
            }
        });
        let relay = Relay::udp("127.0.0.1:0".parse().unwrap(), echo_addr, model(), 1)
            .await
            .unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(relay.local_addr).await.unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let payloads: Vec<Vec<u8>> = (0..200u32)
            .map(|i| {
                let mut p = i.to_be_bytes().to_vec();
                p.extend((0..rng.random_range(1..600)).map(|_| rng.random::<u8>()));
                p
            })
            .collect();
        // Twenty bursts of ten datagrams, 5 ms apart: each burst shares one delay, and the
        // bursts must still arrive in order. A receiver stamps arrivals while we send.
        let receiver = Arc::new(client);
        let reader = Arc::clone(&receiver);
        let count = payloads.len();
        let arrivals = tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            let mut got = Vec::with_capacity(count);
            for _ in 0..count {
                let n = tokio::time::timeout(Duration::from_secs(5), reader.recv(&mut buf))
                    .await
                    .expect("a datagram was lost")
                    .expect("recv");
                got.push((Instant::now(), buf[..n].to_vec()));
            }
            got
        });
        let mut sent = Vec::with_capacity(count);
        for burst in payloads.chunks(10) {
            for p in burst {
                sent.push(Instant::now());
                receiver.send(p).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let arrivals = arrivals.await.unwrap();
        for (i, ((at, data), (p, sent_at))) in
            arrivals.iter().zip(payloads.iter().zip(&sent)).enumerate()
        {
            assert_eq!(data, p, "datagram {i} changed or out of order");
            let rtt = at.duration_since(*sent_at).as_secs_f64();
            // Order is kept, so a datagram may wait behind an earlier burst's longer delay.
            assert!(
                (2.0 * MIN..2.0 * MAX + 0.05).contains(&rtt),
                "datagram {i}: round trip {rtt}s"
            );
        }
    }

    #[tokio::test]
    async fn tcp_round_trips_are_delayed_within_bounds_and_intact() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let relay = Relay::tcp("127.0.0.1:0".parse().unwrap(), echo_addr, model(), 2)
            .await
            .unwrap();
        let mut stream = TcpStream::connect(relay.local_addr).await.unwrap();
        for round in 0..5u8 {
            let payload: Vec<u8> = (0..100_000u32)
                .map(|i| (i as u8).wrapping_add(round))
                .collect();
            let started = Instant::now();
            stream.write_all(&payload).await.unwrap();
            let mut back = vec![0u8; payload.len()];
            stream.read_exact(&mut back).await.unwrap();
            let rtt = started.elapsed().as_secs_f64();
            assert_eq!(back, payload);
            assert!(
                (2.0 * MIN..2.0 * MAX + 0.1).contains(&rtt),
                "round trip {rtt}s"
            );
        }
    }
}
