//! The control-plane group as the tool reaches it: every node's status, the leader, and
//! the calls that change the group (proposals go to any node, which forwards them to the
//! leader; membership changes must reach the leader itself).

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use hasten_proto::control::{ControlAccess, ControlClient, connect};
use hasten_proto::v1::{
    ControlCommand, ControlState, MemberRequest, NodeStatus, ProposeRequest, SnapshotRequest,
    StatusRequest,
};

/// One node's answer to `Status`, or why there was none.
pub struct NodeReport {
    pub address: String,
    pub status: Result<NodeStatus, String>,
}

pub struct ControlGroup {
    addresses: Vec<String>,
    access: ControlAccess,
    timeout: Duration,
}

impl ControlGroup {
    pub fn new(addresses: Vec<String>, access: ControlAccess, timeout: Duration) -> Self {
        Self {
            addresses,
            access,
            timeout,
        }
    }

    async fn client(&self, address: &str) -> Result<ControlClient> {
        tokio::time::timeout(self.timeout, connect(address, &self.access))
            .await
            .map_err(|_| anyhow!("{address}: no connection within {:?}", self.timeout))?
            .with_context(|| format!("connecting to {address}"))
    }

    /// Runs `call` against `address` within the timeout.
    async fn call<T, F>(&self, address: &str, call: impl FnOnce(ControlClient) -> F) -> Result<T>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = self.client(address).await?;
        let reply = tokio::time::timeout(self.timeout, call(client))
            .await
            .map_err(|_| anyhow!("{address}: no answer within {:?}", self.timeout))?
            .map_err(|status| anyhow!("{address}: {}", status.message()))?;
        Ok(reply.into_inner())
    }

    pub async fn status_of(&self, address: &str) -> Result<NodeStatus> {
        self.call(
            address,
            |mut c| async move { c.status(StatusRequest {}).await },
        )
        .await
    }

    /// Every configured node's status, asked concurrently.
    pub async fn reports(&self) -> Vec<NodeReport> {
        let asks = self.addresses.iter().map(|address| async move {
            NodeReport {
                address: address.clone(),
                status: self.status_of(address).await.map_err(|e| format!("{e:#}")),
            }
        });
        futures::future::join_all(asks).await
    }

    /// The leader's address: a configured node that says it leads, else the address any
    /// node reports for its leader (members added since the tool was configured).
    pub async fn leader(&self) -> Result<String> {
        let reports = self.reports().await;
        if let Some(leader) = reports.iter().find(|r| {
            r.status
                .as_ref()
                .is_ok_and(|s| s.role == "leader" && s.leader_id == s.id)
        }) {
            return Ok(leader.address.clone());
        }
        if let Some(address) = reports
            .iter()
            .filter_map(|r| r.status.as_ref().ok())
            .map(|s| s.leader_address.clone())
            .find(|a| !a.is_empty())
        {
            return Ok(address);
        }
        let why: Vec<String> = reports
            .iter()
            .map(|r| match &r.status {
                Ok(s) => format!("{}: {} without a known leader", r.address, s.role),
                Err(e) => e.clone(),
            })
            .collect();
        bail!("no leader known: {}", why.join("; "))
    }

    /// Proposes `commands` as one log entry through the first node that answers; returns
    /// the index it committed at.
    pub async fn propose(&self, commands: Vec<ControlCommand>) -> Result<u64> {
        let mut failures = Vec::new();
        for address in &self.addresses {
            let commands = commands.clone();
            match self
                .call(address, |mut c| async move {
                    c.propose(ProposeRequest { commands }).await
                })
                .await
            {
                Ok(reply) => return Ok(reply.index),
                Err(error) => failures.push(format!("{error:#}")),
            }
        }
        bail!("no node committed the proposal: {}", failures.join("; "))
    }

    /// The replicated state as the leader has applied it.
    pub async fn snapshot(&self) -> Result<ControlState> {
        let leader = self.leader().await?;
        self.call(&leader, |mut c| async move {
            c.snapshot(SnapshotRequest {}).await
        })
        .await
    }

    /// Adds or removes a member through the leader; returns the leader's status after.
    pub async fn change_member(&self, add: bool, member: MemberRequest) -> Result<NodeStatus> {
        let leader = self.leader().await?;
        self.call(&leader, |mut c| async move {
            if add {
                c.add_node(member).await
            } else {
                c.remove_node(member).await
            }
        })
        .await
    }
}
