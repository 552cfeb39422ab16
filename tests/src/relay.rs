//! A TCP relay that can be cut: the network partition of the integration tests. Peers are
//! told the relay's address instead of each other's; cutting it closes every connection
//! through it and refuses new ones until it is healed.

use std::sync::Arc;

use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    /// Where peers connect (host:port).
    pub address: String,
    cut: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays connections on a fresh loopback port to `target` (host:port).
    pub async fn start(target: String) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (cut, cut_rx) = watch::channel(false);
        let target = Arc::new(target);
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    // Refused: the connection closes at once.
                    continue;
                }
                tokio::spawn(relay(inbound, Arc::clone(&target), cut_rx.clone()));
            }
        });
        Ok(Self {
            address,
            cut,
            accept,
        })
    }

    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    pub fn heal(&self) {
        let _ = self.cut.send(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

async fn relay(mut inbound: TcpStream, target: Arc<String>, mut cut: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(target.as_str()).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}
