//! A node started with `join = true` and `auto_join = true` asks the group to add it: it
//! finds the leader among its configured peers and sends `AddNode` with its own address
//! until it is a member. Scaling a StatefulSet up then needs no operator: the new ordinal
//! joins the group the founders formed. A node restarted after joining finds itself among
//! the members and asks nothing.

use display_full_error::DisplayFullErrorExt;
use std::time::Duration;

use hasten_core::retry::RetryDelays;
use hasten_proto::control::{ControlAccess, connect};
use hasten_proto::v1::{MemberRequest, StatusRequest};

const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Why one round did not make this node a member.
enum Round {
    Member,
    NotYet(String),
}

/// Asks `peers` (gRPC addresses of members) until node `id` at `address` is a member.
pub async fn join_group(id: u64, address: String, peers: Vec<String>, access: ControlAccess) {
    let mut waits = RetryDelays::new(FIRST_RETRY, MAX_RETRY);
    let mut rounds = 0u32;
    loop {
        match round(id, &address, &peers, &access).await {
            Round::Member => {
                tracing::info!(id, %address, "this node is a member of the control-plane group");
                return;
            }
            Round::NotYet(why) => {
                rounds += 1;
                // Every few rounds, not every one: a group that elects takes a few seconds.
                if rounds % 5 == 1 {
                    tracing::warn!(id, %why, "not yet added to the control-plane group; retrying");
                }
            }
        }
        tokio::time::sleep(waits.next_delay()).await;
    }
}

async fn round(id: u64, address: &str, peers: &[String], access: &ControlAccess) -> Round {
    let mut why = Vec::new();
    let mut leader = None;
    for peer in peers {
        let status = match connect(peer, access).await {
            Ok(mut client) => client.status(StatusRequest {}).await,
            Err(error) => {
                why.push(format!("{peer}: {}", error.display_full()));
                continue;
            }
        };
        match status {
            Ok(status) => {
                let status = status.into_inner();
                if status.members.iter().any(|m| m.id == id) {
                    return Round::Member;
                }
                if status.role == "leader" {
                    leader = Some(peer.clone());
                } else if leader.is_none() && !status.leader_address.is_empty() {
                    leader = Some(status.leader_address);
                }
            }
            Err(error) => why.push(format!("{peer}: {}", error.message())),
        }
    }
    let Some(leader) = leader else {
        return Round::NotYet(format!("no peer knows a leader ({})", why.join("; ")));
    };
    let added = match connect(&leader, access).await {
        Ok(mut client) => client
            .add_node(MemberRequest {
                id,
                address: address.to_string(),
            })
            .await
            .map(|_| ())
            .map_err(|e| e.message().to_string()),
        Err(error) => Err(error.to_string_full()),
    };
    match added {
        Ok(()) => Round::Member,
        Err(error) => Round::NotYet(format!("AddNode on {leader}: {error}")),
    }
}
