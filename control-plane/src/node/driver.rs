//! The loop that drives a node: it owns the `RawNode`, the storage and the state machine,
//! takes the queued requests in turns, and handles each `Ready`.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashMap;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hasten_proto::v1::{CommandBatch, ControlCommand, ControlState, Member, NodeStatus};
use prost::Message as _;
use protobuf::Message as _;
use raft::prelude::{ConfChange, ConfChangeType, Entry, EntryType, Snapshot, SnapshotMetadata};
use raft::{RawNode, StateRole};
use tokio::sync::{broadcast, mpsc, watch};

use super::beside::BesideNode;
use super::{CommitReply, NodeError, NodeRequest, NodeSettings};
use crate::message::StoredSnapshot;
use crate::metrics::{NodeMetrics, ReadyPhase};
use crate::state::{CacheStateMachine, EntryEvent};
use crate::storage::{Compaction, RaftStorage, StoreError, snapshot_file};
use crate::transport::Transport;

/// The first snapshot of nodes 2, 3, ... (mod 3) waits for this much more (per mille of the
/// thresholds) than node 1's: after it, members stay a third of a period apart.
const COMPACTION_STAGGER: u64 = 333;

/// The committed events kept in memory (behind a compaction, and between two) hold at most
/// this share (1/n) of `max_log_bytes`.
const RETAINED_SHARE_OF_LOG_BYTES: u64 = 4;

/// Requests handled in one turn before Raft's `Ready` is processed: batches appends and
/// fsyncs under load without starving the ticker.
const REQUESTS_PER_TURN: usize = 256;

/// A proposal of this node waiting for its commit.
struct Pending {
    reply: CommitReply,
    arrived: Instant,
    /// The term and leader it was proposed under: when either changes before the commit,
    /// the proposal may be lost and its caller is told at once.
    term: u64,
    leader: u64,
}

/// What the node publishes to the services in front of it.
pub(super) struct NodeFeeds {
    /// Committed events, for subscribers.
    pub events: broadcast::Sender<Arc<EntryEvent>>,
    /// The leader's address while another node leads, else empty.
    pub leader: watch::Sender<String>,
}

pub(super) struct RaftNode<T> {
    settings: NodeSettings,
    raw: RawNode<RaftStorage>,
    storage: RaftStorage,
    state: CacheStateMachine,
    peers: T,
    /// Proposals of this node awaiting their commit, by the id carried in the entry's
    /// context.
    pending: HashMap<u64, Pending>,
    next_proposal: u64,
    events: broadcast::Sender<Arc<EntryEvent>>,
    leader_elsewhere: watch::Sender<String>,
    /// Payload bytes applied since the last snapshot.
    applied_bytes: u64,
    /// Extra share (per mille) of the log thresholds before this node's first snapshot, so
    /// that members snapshot at different moments rather than all at once on shared cores.
    compaction_stagger: u64,
    metrics: NodeMetrics,
    /// The leader as of the last turn, to count changes.
    last_leader: u64,
    /// (term, leader) as of the last turn, to find stale proposals.
    last_leadership: (u64, u64),
    /// Where snapshots are written and what a compaction released is freed.
    beside: BesideNode,
    /// The node's own queue, where work beside it reports back; weak, so that the loop
    /// still ends when every handle is gone.
    requests: mpsc::WeakSender<NodeRequest>,
    /// A snapshot is being written beside the node (no second one starts meanwhile), and
    /// the time this thread spent taking its state.
    snapshotting: Option<Duration>,
}

impl<T: Transport> RaftNode<T> {
    pub(super) fn new(
        settings: NodeSettings,
        raw: RawNode<RaftStorage>,
        state: CacheStateMachine,
        peers: T,
        feeds: NodeFeeds,
        metrics: NodeMetrics,
        requests: mpsc::WeakSender<NodeRequest>,
    ) -> Result<Self, NodeError> {
        let compaction_stagger = COMPACTION_STAGGER * (settings.id.saturating_sub(1) % 3);
        let storage = raw.store().clone();
        let beside =
            BesideNode::start(format!("raft-beside-{}", settings.id)).map_err(NodeError::Thread)?;
        Ok(Self {
            settings,
            raw,
            storage,
            state,
            peers,
            pending: HashMap::new(),
            next_proposal: 1,
            events: feeds.events,
            leader_elsewhere: feeds.leader,
            applied_bytes: 0,
            compaction_stagger,
            metrics,
            last_leader: raft::INVALID_ID,
            last_leadership: (0, raft::INVALID_ID),
            beside,
            requests,
            snapshotting: None,
        })
    }

    pub(super) async fn run(mut self, mut queue: mpsc::Receiver<NodeRequest>) {
        let mut ticker = tokio::time::interval(self.settings.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    self.raw.tick();
                }
                request = queue.recv() => {
                    let Some(request) = request else { return };
                    let mut handled = self.handle(request);
                    for _ in 1..REQUESTS_PER_TURN {
                        if handled.is_err() {
                            break;
                        }
                        match queue.try_recv() {
                            Ok(request) => handled = self.handle(request),
                            Err(_) => break,
                        }
                    }
                    if let Err(err) = handled {
                        self.stop(&err);
                        return;
                    }
                }
            }
            if let Err(err) = self.on_ready() {
                self.stop(&err);
                return;
            }
            self.fail_stale_proposals();
            self.report();
        }
    }

    /// Raft cannot continue safely without its storage: the node stops (peers elect another
    /// leader) rather than acknowledge what was not persisted.
    fn stop(&mut self, err: &NodeError) {
        tracing::error!(error = %err.display_full(), "control-plane storage failed; the node stops");
        for (_, pending) in self.pending.drain() {
            self.metrics.proposal_dropped();
            let _ = pending.reply.send(Err(NodeError::ShuttingDown));
        }
    }

    /// Answers every waiting proposal made under another term or leader than now's: its
    /// entry may have been lost with the old leader's uncommitted log, and waiting would
    /// only end in the caller's timeout. Proposals that did commit were answered already
    /// (applying happens before this), and a retry of one that committed unseen is
    /// applied once (origin sequences).
    fn fail_stale_proposals(&mut self) {
        let now = (self.raw.raft.term, self.raw.raft.leader_id);
        if now == self.last_leadership {
            return;
        }
        self.last_leadership = now;
        let stale: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| (p.term, p.leader) != now)
            .map(|(id, _)| *id)
            .collect();
        if !stale.is_empty() {
            tracing::info!(
                proposals = stale.len(),
                term = now.0,
                leader = now.1,
                "leadership changed; failing the proposals waiting under the old one"
            );
        }
        for id in stale {
            if let Some(pending) = self.pending.remove(&id) {
                self.metrics.proposal_dropped();
                let _ = pending.reply.send(Err(NodeError::Stale {
                    term: now.0,
                    leader: now.1,
                }));
            }
        }
    }

    fn pending(&self, reply: CommitReply) -> Pending {
        Pending {
            reply,
            arrived: Instant::now(),
            term: self.raw.raft.term,
            leader: self.raw.raft.leader_id,
        }
    }

    /// Publishes Raft's progress to the metrics; counts leader changes.
    fn report(&mut self) {
        let raft = &self.raw.raft;
        let m = &self.metrics;
        m.term.set(raft.term as i64);
        m.commit_index.set(raft.raft_log.committed as i64);
        m.applied_index.set(self.state.applied_index() as i64);
        m.is_leader.set(i64::from(raft.state == StateRole::Leader));
        m.has_leader
            .set(i64::from(raft.leader_id != raft::INVALID_ID));
        m.is_voter.set(i64::from(
            raft.prs().conf().voters().contains(self.settings.id),
        ));
        let log = raft.raft_log.last_index() + 1 - raft.raft_log.first_index();
        m.log_entries.set(log as i64);
        if raft.leader_id != self.last_leader {
            if raft.leader_id != raft::INVALID_ID {
                m.leader_changes.inc();
            }
            self.last_leader = raft.leader_id;
            let elsewhere = if raft.leader_id == self.settings.id {
                None
            } else {
                self.peers.address(raft.leader_id)
            };
            self.leader_elsewhere
                .send_replace(elsewhere.unwrap_or_default());
        }
    }

    fn handle(&mut self, request: NodeRequest) -> Result<(), NodeError> {
        match request {
            NodeRequest::Propose { commands, reply } => self.propose(commands, reply),
            NodeRequest::Step(messages) => {
                for message in messages {
                    if let Err(err) = self.raw.step(message) {
                        tracing::debug!(error = %err.display_full(), "raft message ignored");
                    }
                }
            }
            NodeRequest::Unreachable(id) => self.raw.report_unreachable(id),
            NodeRequest::SnapshotSent { to, delivered } => {
                let status = if delivered {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
            NodeRequest::Status(reply) => {
                let _ = reply.send(self.status());
            }
            NodeRequest::State(reply) => {
                let _ = reply.send(self.state.view());
            }
            NodeRequest::ChangeMember {
                add,
                id,
                address,
                reply,
            } => self.change_member(add, id, address, reply),
            NodeRequest::SnapshotStored(stored) => return self.snapshot_stored(stored),
        }
        Ok(())
    }

    fn propose(&mut self, commands: Vec<ControlCommand>, reply: CommitReply) {
        if let Err(refused) = self.state.admit(&commands) {
            let _ = reply.send(Err(refused.into()));
            return;
        }
        if self.raw.raft.leader_id == raft::INVALID_ID {
            self.metrics.proposal_dropped();
            let _ = reply.send(Err(NodeError::NoLeader));
            return;
        }
        let proposal = self.next_proposal_id();
        let data = CommandBatch { commands }.encode_to_vec();
        match self.raw.propose(proposal.to_be_bytes().to_vec(), data) {
            Ok(()) => {
                let pending = self.pending(reply);
                self.pending.insert(proposal, pending);
            }
            Err(err) => {
                self.metrics.proposal_dropped();
                let _ = reply.send(Err(NodeError::Dropped(err)));
            }
        }
    }

    fn change_member(&mut self, add: bool, id: u64, address: String, reply: CommitReply) {
        if self.raw.raft.state != StateRole::Leader {
            let _ = reply.send(Err(NodeError::Membership(format!(
                "node {} is not the leader (leader: {}); send membership changes to the leader",
                self.settings.id, self.raw.raft.leader_id
            ))));
            return;
        }
        let mut change = ConfChange {
            node_id: id,
            context: address.into_bytes().into(),
            ..Default::default()
        };
        change.set_change_type(if add {
            ConfChangeType::AddNode
        } else {
            ConfChangeType::RemoveNode
        });
        let proposal = self.next_proposal_id();
        match self
            .raw
            .propose_conf_change(proposal.to_be_bytes().to_vec(), change)
        {
            Ok(()) => {
                let pending = self.pending(reply);
                self.pending.insert(proposal, pending);
            }
            Err(err) => {
                let _ = reply.send(Err(NodeError::ConfChange(err)));
            }
        }
    }

    /// An id for a proposal of this node, unique across the group (node id in the high
    /// bits), carried in the entry's context to find the caller when it is applied.
    fn next_proposal_id(&mut self) -> u64 {
        let id = (self.settings.id << 40) | self.next_proposal;
        self.next_proposal += 1;
        id
    }

    fn status(&self) -> NodeStatus {
        let raft = &self.raw.raft;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        let voters = raft.prs().conf().voters().ids();
        let members = voters
            .iter()
            .map(|id| Member {
                id,
                address: self.peers.address(id).unwrap_or_default(),
            })
            .collect();
        NodeStatus {
            id: self.settings.id,
            role: role.into(),
            term: raft.term,
            commit_index: raft.raft_log.committed,
            applied_index: self.state.applied_index(),
            leader_id: raft.leader_id,
            leader_address: self.peers.address(raft.leader_id).unwrap_or_default(),
            members,
            first_log_index: raft.raft_log.first_index(),
            cached_entries: self.state.len() as u64,
            subscribers: u64::try_from(self.metrics.subscribers.get()).unwrap_or(0),
        }
    }

    fn on_ready(&mut self) -> Result<(), NodeError> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut ready = self.raw.ready();
        // A leader may send before persisting (Raft thesis 10.2.1); followers' messages
        // come back as persisted messages below.
        self.peers.send(ready.take_messages());
        if !ready.snapshot().is_empty() {
            self.install_snapshot(ready.snapshot())?;
        }
        let started = Instant::now();
        self.apply_committed(ready.take_committed_entries())?;
        let applied = started.elapsed();
        let started = Instant::now();
        self.storage.append(ready.entries())?;
        if let Some(hard_state) = ready.hs() {
            self.storage.set_hard_state(hard_state);
        }
        self.storage.persist(ready.must_sync())?;
        self.metrics
            .ready_phase(ReadyPhase::Persist, started.elapsed());
        self.peers.send(ready.take_persisted_messages());
        let mut light = self.raw.advance(ready);
        if let Some(commit) = light.commit_index() {
            self.storage.set_commit(commit);
        }
        self.peers.send(light.take_messages());
        let started = Instant::now();
        self.apply_committed(light.take_committed_entries())?;
        self.metrics
            .ready_phase(ReadyPhase::Apply, applied + started.elapsed());
        self.raw.advance_apply();
        self.maybe_compact()?;
        Ok(())
    }

    fn install_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), NodeError> {
        let compaction = self.storage.apply_snapshot(snapshot)?;
        self.discard_beside(compaction);
        let state =
            ControlState::decode(snapshot.get_data()).map_err(|err| StoreError::Corrupt {
                tree: "snapshot",
                key: snapshot.get_metadata().index.to_string(),
                reason: err.to_string_full(),
            })?;
        self.state = CacheStateMachine::from_state(state);
        tracing::info!(
            index = snapshot.get_metadata().index,
            entries = self.state.len(),
            "installed a snapshot from the leader"
        );
        // Wake the subscribers: the entries the snapshot covers were never applied here, and
        // when no entry follows it nothing else would tell them to fetch the new state. The
        // event is not stored; a subscriber behind the new floor resends the whole state.
        let _ = self
            .events
            .send(Arc::new(EntryEvent::empty(snapshot.get_metadata().index)));
        Ok(())
    }

    fn apply_committed(&mut self, entries: Vec<Entry>) -> Result<(), NodeError> {
        for entry in entries {
            if entry.index <= self.state.applied_index() {
                continue;
            }
            let proposal = proposal_id(&entry.context);
            self.applied_bytes += entry.data.len() as u64;
            match entry.get_entry_type() {
                EntryType::EntryNormal if !entry.data.is_empty() => {
                    let batch = CommandBatch::decode(entry.data.as_ref()).unwrap_or_else(|err| {
                        // Validated before proposing; a record that does not decode was
                        // written by something else. Skip it on every replica alike.
                        tracing::error!(index = entry.index, error = %err.display_full(), "undecodable log entry skipped");
                        CommandBatch::default()
                    });
                    let applied = self.state.apply(entry.index, entry.term, batch);
                    let event = Arc::new(EntryEvent::new(entry.index, applied));
                    self.storage.record_event(
                        Arc::clone(&event),
                        entry.data.len() as u64,
                        self.events_budget(),
                    );
                    let _ = self.events.send(event);
                }
                EntryType::EntryConfChange => {
                    self.apply_conf_change(&entry)?;
                    self.state.skip(entry.index, entry.term);
                }
                _ => self.state.skip(entry.index, entry.term),
            }
            if let Some(pending) = proposal.and_then(|p| self.pending.remove(&p)) {
                self.metrics.proposal_committed(pending.arrived.elapsed());
                let _ = pending.reply.send(Ok(entry.index));
            }
        }
        Ok(())
    }

    fn apply_conf_change(&mut self, entry: &Entry) -> Result<(), NodeError> {
        let change = match ConfChange::parse_from_bytes(&entry.data) {
            Ok(change) => change,
            Err(err) => {
                tracing::error!(index = entry.index, error = %err.display_full(), "undecodable membership change skipped");
                return Ok(());
            }
        };
        let address = String::from_utf8_lossy(&change.context).into_owned();
        match change.get_change_type() {
            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                if !address.is_empty() {
                    self.storage.set_member(change.node_id, &address)?;
                    self.peers.add(change.node_id, address);
                }
            }
            ConfChangeType::RemoveNode => {
                self.storage.remove_member(change.node_id)?;
                self.peers.remove(change.node_id);
            }
        }
        match self.raw.apply_conf_change(&change) {
            Ok(conf) => self.storage.set_conf_state(&conf),
            Err(err) => {
                tracing::warn!(error = %err.display_full(), "membership change not applied")
            }
        }
        tracing::info!(node = change.node_id, change = ?change.get_change_type(), "membership changed");
        Ok(())
    }

    /// Snapshots the state machine once the log holds more than `max_log_entries` applied
    /// entries or `max_log_bytes` of their payloads. Only taking the state happens here (a
    /// copy shared with subscribers); encoding it and writing it durably run beside the node,
    /// which compacts the log when told the file is on disk: a snapshot of megabytes written
    /// and synced on this thread stalled replication for 100-270 ms.
    fn maybe_compact(&mut self) -> Result<(), NodeError> {
        if self.snapshotting.is_some() {
            return Ok(());
        }
        let applied = self.state.applied_index();
        let first = self.storage.snapshot_point().0 + 1;
        let staggered =
            |limit: u64| limit.saturating_add(limit.saturating_mul(self.compaction_stagger) / 1000);
        let too_long =
            applied >= first && applied - first >= staggered(self.settings.max_log_entries);
        // A member added after the last snapshot needs one that names it. And until its
        // first snapshot a node's log starts at index 1 without the founders' configuration
        // (set in storage, never logged): a member fed that log from 1 would never learn
        // them, so the first snapshot is taken as soon as anything is applied.
        let wanted = applied >= first && (first == 1 || self.storage.take_snapshot_request());
        let by_size = too_long || self.applied_bytes >= staggered(self.settings.max_log_bytes);
        if !by_size && !wanted {
            return Ok(());
        }
        // Only a compaction the log's size asked for spends the stagger and restarts the
        // count: the ones taken for another reason come on every member at the same index
        // (the first, a member added), and restarting there put all members back in step,
        // each later snapshot then taken by all three at once (an 8 MB snapshot each, on
        // shared cores: the p99 at 8,000 entries/s went from ~90 to ~500 ms).
        if by_size {
            self.applied_bytes = 0;
            self.compaction_stagger = 0;
        }
        let started = Instant::now();
        let view = self.state.view();
        let mut meta = SnapshotMetadata {
            index: applied,
            term: self.state.applied_term(),
            ..Default::default()
        };
        meta.set_conf_state(self.storage.conf_state());
        self.snapshotting = Some(started.elapsed());
        let storage = self.storage.clone();
        let requests = self.requests.clone();
        self.beside.run(move || {
            let data = view.encode();
            let bytes = data.len();
            let stored = storage.store_snapshot(&meta, &data).map(|replaced| {
                let wrote = replaced.is_some();
                if let Some(Err(err)) = replaced.map(snapshot_file::Replaced::remove) {
                    tracing::warn!(error = %err.display_full(), "removing the replaced snapshot failed; it stays on disk");
                }
                StoredSnapshot {
                    meta: wrote.then_some(meta),
                    bytes,
                    took: started.elapsed(),
                }
            });
            if let Some(requests) = requests.upgrade() {
                let _ = requests.blocking_send(NodeRequest::SnapshotStored(stored));
            }
        });
        Ok(())
    }

    /// Retires or removes what a compaction made obsolete, beside the node.
    fn discard_beside(&self, compaction: Compaction) {
        self.beside.run(move || {
            if let Err(err) = compaction.discard() {
                tracing::warn!(error = %err.display_full(), "retiring compacted log segments or removing a replaced snapshot failed; they stay on disk");
            }
        });
    }

    /// Payload bytes the committed events kept for resuming subscribers may hold.
    fn events_budget(&self) -> u64 {
        self.settings.max_log_bytes / RETAINED_SHARE_OF_LOG_BYTES
    }

    /// Compacts the log to the snapshot just written beside the node.
    fn snapshot_stored(
        &mut self,
        stored: Result<StoredSnapshot, StoreError>,
    ) -> Result<(), NodeError> {
        let taking = self.snapshotting.take().unwrap_or_default();
        let stored = stored?;
        let Some(meta) = stored
            .meta
            .filter(|meta| meta.index > self.storage.snapshot_point().0)
        else {
            return Ok(());
        };
        let started = Instant::now();
        let compaction =
            self.storage
                .compact_to(&meta, self.settings.retained_events, self.events_budget());
        self.discard_beside(compaction);
        self.metrics
            .ready_phase(ReadyPhase::Compact, taking + started.elapsed());
        self.metrics.snapshots.inc();
        self.metrics.snapshot_bytes.set(stored.bytes as i64);
        tracing::info!(
            index = meta.index,
            snapshot_bytes = stored.bytes,
            ms = stored.took.as_millis() as u64,
            taking_state_ms = taking.as_millis() as u64,
            compacting_ms = started.elapsed().as_millis() as u64,
            "state machine snapshotted, log compacted"
        );
        Ok(())
    }
}

fn proposal_id(context: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = context.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}
