//! The shard map: which replicas serve which shard. The router reads it from a `watch`
//! channel, set from its configuration at start and, with a control plane, from then on by
//! the map the control plane replicates ([`follow_control_plane`]).

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;
use std::sync::Arc;

use hasten_proto::control::{self, ControlAccess, FollowStatus, grpc_endpoint};
use hasten_proto::v1::{self, CommittedEvent, applied_command};
use tokio::sync::watch;

/// Which replicas serve which shard: `shards[i]` lists the endpoints of shard i's replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    pub shards: Vec<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ShardMapError {
    #[error("the shard map lists no shard")]
    NoShard,
    #[error("shard {0} has no replica")]
    NoReplica(usize),
    #[error("{endpoint} is listed for shard {first} and again for shard {again}")]
    ListedTwice {
        endpoint: String,
        first: usize,
        again: usize,
    },
    #[error("`{endpoint}` (shard {shard}) is not a valid endpoint")]
    Endpoint {
        endpoint: String,
        shard: usize,
        #[source]
        source: hasten_proto::control::EndpointError,
    },
    #[error(
        "the map has {proposed} shards, the router serves a corpus cut into {current}: another cut is another corpus, which needs routers started for it"
    )]
    ShardCount { current: usize, proposed: usize },
}

impl ShardMap {
    /// A map with at least one shard, a replica for every shard, and every endpoint a valid
    /// address listed once.
    pub fn new(shards: Vec<Vec<String>>) -> Result<Self, ShardMapError> {
        if shards.is_empty() {
            return Err(ShardMapError::NoShard);
        }
        let mut seen = HashMap::new();
        for (shard, replicas) in shards.iter().enumerate() {
            if replicas.is_empty() {
                return Err(ShardMapError::NoReplica(shard));
            }
            for endpoint in replicas {
                if let Err(source) = grpc_endpoint(endpoint, None) {
                    return Err(ShardMapError::Endpoint {
                        endpoint: endpoint.clone(),
                        shard,
                        source,
                    });
                }
                if let Some(first) = seen.insert(endpoint.clone(), shard) {
                    return Err(ShardMapError::ListedTwice {
                        endpoint: endpoint.clone(),
                        first,
                        again: shard,
                    });
                }
            }
        }
        Ok(Self { shards })
    }

    /// The map the control plane replicates, as a successor of this one: valid, and with as
    /// many shards. The corpus and its cut into shards are fixed when the router starts (it
    /// checks every replica against them); only the replicas serving each shard may change.
    pub fn successor(&self, replicated: &v1::ShardMap) -> Result<Self, ShardMapError> {
        let shards: Vec<Vec<String>> = replicated
            .shards
            .iter()
            .map(|replicas| replicas.endpoints.clone())
            .collect();
        if shards.len() != self.shards.len() {
            return Err(ShardMapError::ShardCount {
                current: self.shards.len(),
                proposed: shards.len(),
            });
        }
        Self::new(shards)
    }
}

/// Follows the control plane's committed stream from `endpoints` (reached with `access`)
/// and sets `map` to every shard map it carries that is a [`ShardMap::successor`] of
/// the current one; a map that is not is logged and ignored. Runs until the process ends.
pub async fn follow_control_plane(
    endpoints: Vec<String>,
    access: ControlAccess,
    map: watch::Sender<Arc<ShardMap>>,
) {
    control::follow(
        endpoints,
        access,
        "router".into(),
        Arc::new(FollowStatus::default()),
        move |event| {
            let index = event.index;
            for replicated in shard_maps(event) {
                publish(&map, &replicated, index);
            }
        },
    )
    .await;
}

/// The shard maps an event carries, in the order they took effect: the whole state's (when
/// the control plane ever had one), then those its commands set.
fn shard_maps(event: CommittedEvent) -> impl Iterator<Item = v1::ShardMap> {
    let from_state = event.state.and_then(|state| state.shard_map);
    let from_commands = event
        .applied
        .into_iter()
        .filter_map(|applied| match applied.kind {
            Some(applied_command::Kind::ShardMap(map)) => Some(map),
            _ => None,
        });
    from_state.into_iter().chain(from_commands)
}

/// Makes `replicated` (committed at `index`) the router's map when it is a successor of the
/// current one and differs from it.
fn publish(map: &watch::Sender<Arc<ShardMap>>, replicated: &v1::ShardMap, index: u64) {
    map.send_if_modified(|current| match current.successor(replicated) {
        Ok(next) if next == **current => false,
        Ok(next) => {
            tracing::info!(index, shards = ?next.shards, "shard map changed by the control plane");
            *current = Arc::new(next);
            true
        }
        Err(err) => {
            tracing::error!(index, error = %err.display_full(), "shard map from the control plane refused; keeping the current one");
            false
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_proto::v1::{AppliedCommand, ControlState, ShardReplicas};

    fn replicated(shards: &[&[&str]]) -> v1::ShardMap {
        v1::ShardMap {
            shards: shards
                .iter()
                .map(|replicas| ShardReplicas {
                    endpoints: replicas.iter().map(|e| e.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn two_shards() -> ShardMap {
        ShardMap::new(vec![vec!["a:1".into()], vec!["b:1".into()]]).unwrap()
    }

    #[test]
    fn shard_maps_need_replicas_and_distinct_valid_endpoints() {
        assert!(matches!(ShardMap::new(vec![]), Err(ShardMapError::NoShard)));
        assert!(matches!(
            ShardMap::new(vec![vec!["a:1".into()], vec![]]),
            Err(ShardMapError::NoReplica(1))
        ));
        let twice = ShardMap::new(vec![vec!["a:1".into()], vec!["a:1".into()]]);
        assert!(
            twice
                .unwrap_err()
                .to_string_full()
                .contains("again for shard 1")
        );
        let bad = ShardMap::new(vec![vec!["a b:1".into()]]).unwrap_err();
        assert!(matches!(bad, ShardMapError::Endpoint { shard: 0, .. }));
        assert!(std::error::Error::source(&bad).is_some());
        ShardMap::new(vec![vec!["a:1".into(), "b:1".into()], vec!["c:1".into()]]).unwrap();
    }

    #[test]
    fn a_successor_keeps_the_shard_count_and_is_itself_valid() {
        let current = two_shards();
        let moved = current
            .successor(&replicated(&[&["c:1", "d:1"], &["b:1"]]))
            .unwrap();
        assert_eq!(moved.shards[0], vec!["c:1", "d:1"]);
        assert!(matches!(
            current.successor(&replicated(&[&["a:1"], &["b:1"], &["c:1"]])),
            Err(ShardMapError::ShardCount {
                current: 2,
                proposed: 3
            })
        ));
        assert!(matches!(
            current.successor(&replicated(&[&["a:1"]])),
            Err(ShardMapError::ShardCount { proposed: 1, .. })
        ));
        assert!(matches!(
            current.successor(&replicated(&[&["a:1"], &[]])),
            Err(ShardMapError::NoReplica(1))
        ));
    }

    #[test]
    fn only_an_acceptable_new_map_reaches_the_router() {
        let (sender, mut receiver) = watch::channel(Arc::new(two_shards()));
        publish(&sender, &replicated(&[&["a:1"], &["b:1"], &["c:1"]]), 5);
        assert!(
            !receiver.has_changed().unwrap(),
            "a map of 3 shards was taken"
        );
        publish(&sender, &replicated(&[&["a:1"], &["b:1"]]), 6);
        assert!(
            !receiver.has_changed().unwrap(),
            "the same map woke the router"
        );
        publish(&sender, &replicated(&[&["a:1"], &["c:1"]]), 7);
        assert!(receiver.has_changed().unwrap());
        assert_eq!(receiver.borrow_and_update().shards[1], vec!["c:1"]);
    }

    #[test]
    fn an_event_yields_the_states_map_then_its_commands_maps() {
        let command = |map| AppliedCommand {
            kind: Some(applied_command::Kind::ShardMap(map)),
            removed: Vec::new(),
        };
        let event = CommittedEvent {
            index: 9,
            applied: vec![
                AppliedCommand::default(),
                command(replicated(&[&["b:1"]])),
                command(replicated(&[&["c:1"]])),
            ],
            state: Some(ControlState {
                shard_map: Some(replicated(&[&["a:1"]])),
                ..Default::default()
            }),
        };
        let firsts: Vec<String> = shard_maps(event)
            .map(|map| map.shards[0].endpoints[0].clone())
            .collect();
        assert_eq!(firsts, vec!["a:1", "b:1", "c:1"]);
        let never_set = CommittedEvent {
            state: Some(ControlState::default()),
            ..Default::default()
        };
        assert_eq!(shard_maps(never_set).count(), 0);
    }
}
