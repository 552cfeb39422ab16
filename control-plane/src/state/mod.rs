//! The replicated state machine: the shared hot cache (FIFO-bounded per tenant, as in the HaS
//! paper), the shard map, the KV worker pools' assignments and the runtime configuration.
//!
//! Every decision that changes what edges hold is taken here, in log order: which entries
//! a new one evicts, which an invalidation or a corpus update removes, whether a retried
//! proposal was already applied. Replicas applying the same log therefore hold the same
//! state, and the events they publish tell edges exactly what to add and remove.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use hasten_proto::EncodedEvent;
use hasten_proto::v1::{
    CacheEntry, CarriedEntries, CommandBatch, ControlCommand, ControlState, CorpusFacts,
    CorpusUpdate, KvPoolAssignment, OriginSequence, RuntimeConfig, ShardMap, StoredEntry,
    applied_command, control_command,
};
use prost::Message as _;
use rustc_hash::FxHashMap;

/// Cached queries kept per tenant before FIFO eviction: the HaS paper's cache of 5,000
/// queries.
pub const DEFAULT_CACHE_CAPACITY: u64 = 5_000;

/// `ControlState.entries`' field number (`proto/hasten/v1/control.proto`).
const STATE_ENTRIES: u32 = 5;

mod applied;
mod command;
#[cfg(test)]
mod tests;

pub use applied::{Applied, AppliedKind, EntryEvent};
pub use command::{CommandError, MAX_COMMANDS_PER_ENTRY, validate};

/// Why the current state does not admit a proposal.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AdmissionError {
    /// The entry's corpus version was never registered (its edges register it when they
    /// start; a registration may still be on its way to this node: retry).
    #[error(
        "command {position}: corpus version {version} is not registered with the control plane"
    )]
    UnknownCorpus { position: usize, version: String },
    /// The entry does not fit its corpus: no edge could apply it.
    #[error("command {position}: {reason}")]
    Misfit { position: usize, reason: String },
}

/// The runtime settings in force.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Settings {
    /// The homology threshold, once a `Config` command set it (edges keep their own until
    /// then).
    tau: Option<f64>,
    cache_capacity: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            tau: None,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
        }
    }
}

impl Settings {
    fn to_proto(self) -> RuntimeConfig {
        RuntimeConfig {
            tau: self.tau,
            cache_capacity: Some(self.cache_capacity),
        }
    }

    fn from_proto(config: RuntimeConfig) -> Self {
        Self {
            tau: config.tau,
            cache_capacity: config.cache_capacity.unwrap_or(DEFAULT_CACHE_CAPACITY),
        }
    }
}

/// The replicated state, as of `applied_index`.
#[derive(Debug, Clone, Default)]
pub struct CacheStateMachine {
    applied_index: u64,
    applied_term: u64,
    settings: Settings,
    /// The cloud's shard map, once a command set it.
    shard_map: Option<ShardMap>,
    /// Each tenant's entries, oldest first: the cache capacity holds per tenant, so one
    /// tenant's traffic never evicts another's entries.
    orders: HashMap<String, VecDeque<u64>>,
    /// Shared with the views snapshots are made from and with the events of their inserts,
    /// so that neither copies an entry. (Ids and document ids are integers the state machine
    /// or a registered corpus bounds, so a fast non-keyed hash serves: SipHash was a tenth of
    /// the Raft thread under load.)
    entries: FxHashMap<u64, Arc<CacheEntry>>,
    /// Document -> entries whose result holds it (for invalidation).
    holders: FxHashMap<u64, Vec<u64>>,
    /// Highest sequence number applied per origin edge.
    origins: HashMap<String, u64>,
    /// Registered corpus versions.
    corpora: BTreeMap<String, CorpusFacts>,
    /// Each KV worker pool's latest assignment, by pool.
    kv_pools: BTreeMap<String, KvPoolAssignment>,
}

impl CacheStateMachine {
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn applied_term(&self) -> u64 {
        self.applied_term
    }

    /// The runtime configuration in force.
    pub fn config(&self) -> RuntimeConfig {
        self.settings.to_proto()
    }

    pub fn shard_map(&self) -> Option<&ShardMap> {
        self.shard_map.as_ref()
    }

    /// A KV worker pool's assignment, once its operator published one.
    pub fn kv_pool(&self, pool: &str) -> Option<&KvPoolAssignment> {
        self.kv_pools.get(pool)
    }

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks proposed commands against the state: entries must belong to a registered
    /// corpus version and fit it (dimension, document ids), a corpus update must lead to a
    /// registered version, and a registration must not contradict an earlier one.
    /// Stateless checks are [`validate`]'s.
    pub fn admit(&self, commands: &[ControlCommand]) -> Result<(), AdmissionError> {
        for (position, command) in commands.iter().enumerate() {
            let misfit = |reason: String| AdmissionError::Misfit { position, reason };
            let unknown = |version: &str| AdmissionError::UnknownCorpus {
                position,
                version: version.to_string(),
            };
            match &command.kind {
                Some(control_command::Kind::Insert(entry)) => {
                    let facts = self
                        .corpora
                        .get(&entry.corpus_version)
                        .ok_or_else(|| unknown(&entry.corpus_version))?;
                    fits(entry, facts).map_err(misfit)?;
                }
                Some(control_command::Kind::CorpusUpdate(update))
                    if !self.corpora.contains_key(&update.to_version) =>
                {
                    return Err(unknown(&update.to_version));
                }
                Some(control_command::Kind::RegisterCorpus(facts)) => {
                    if let Some(known) = self.corpora.get(&facts.corpus_version)
                        && known != facts
                    {
                        return Err(misfit(format!(
                            "corpus version {} is registered with dimension {} and largest document id {}, not {} and {}",
                            facts.corpus_version,
                            known.dimension,
                            known.max_document_id,
                            facts.dimension,
                            facts.max_document_id
                        )));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Marks a log entry without commands (Raft's own) as applied.
    pub fn skip(&mut self, index: u64, term: u64) {
        self.applied_index = index;
        self.applied_term = term;
    }

    /// Applies the commands of the log entry at `index`, returning what each did.
    pub fn apply(&mut self, index: u64, term: u64, batch: CommandBatch) -> Vec<Applied> {
        self.skip(index, term);
        let mut applied = Vec::with_capacity(batch.commands.len());
        for (position, command) in batch.commands.into_iter().enumerate() {
            let id = (index << 16) | position as u64;
            if let Some(done) = self.apply_command(id, command) {
                applied.push(done);
            }
        }
        applied
    }

    fn apply_command(&mut self, id: u64, command: ControlCommand) -> Option<Applied> {
        match command.kind? {
            control_command::Kind::Insert(entry) => self.insert(id, entry),
            control_command::Kind::Invalidate(invalidation) => {
                let removed = self.remove_holders_of(&invalidation.document_ids, None);
                Some(Applied {
                    kind: None,
                    removed,
                })
            }
            control_command::Kind::Config(config) => {
                if let Some(tau) = config.tau {
                    self.settings.tau = Some(tau);
                }
                let mut removed = Vec::new();
                if let Some(capacity) = config.cache_capacity {
                    self.settings.cache_capacity = capacity;
                    let mut tenants: Vec<String> = self.orders.keys().cloned().collect();
                    tenants.sort();
                    for tenant in tenants {
                        removed.extend(self.evict_beyond(&tenant, self.capacity()));
                    }
                }
                Some(Applied {
                    kind: Some(AppliedKind::Other(applied_command::Kind::Config(
                        self.settings.to_proto(),
                    ))),
                    removed,
                })
            }
            control_command::Kind::ShardMap(map) => {
                self.shard_map = Some(map.clone());
                Some(Applied {
                    kind: Some(AppliedKind::Other(applied_command::Kind::ShardMap(map))),
                    removed: Vec::new(),
                })
            }
            control_command::Kind::CorpusUpdate(update) => Some(self.update_corpus(update)),
            control_command::Kind::RegisterCorpus(facts) => {
                // The first registration of a version stands; admission refuses others.
                self.corpora
                    .entry(facts.corpus_version.clone())
                    .or_insert(facts);
                Some(Applied {
                    kind: None,
                    removed: Vec::new(),
                })
            }
            control_command::Kind::KvPool(assignment) => {
                self.kv_pools
                    .insert(assignment.pool.clone(), assignment.clone());
                Some(Applied {
                    kind: Some(AppliedKind::Other(applied_command::Kind::KvPool(
                        assignment,
                    ))),
                    removed: Vec::new(),
                })
            }
            control_command::Kind::FlushTenant(flush) => Some(Applied {
                kind: None,
                removed: self.evict_beyond(&flush.tenant, 0),
            }),
            control_command::Kind::RetireCorpusVersion(retire) => {
                let removed = self.entries_of_version(&retire.corpus_version);
                for entry in &removed {
                    self.remove(*entry);
                }
                Some(Applied {
                    kind: None,
                    removed,
                })
            }
        }
    }

    /// Drops `from_version`'s entries that hold a changed document, or that do not fit
    /// `to_version` (when registered), and relabels the rest to `to_version`.
    fn update_corpus(&mut self, update: CorpusUpdate) -> Applied {
        let mut removed =
            self.remove_holders_of(&update.changed_document_ids, Some(&update.from_version));
        if let Some(facts) = self.corpora.get(&update.to_version) {
            let misfits: Vec<u64> = self
                .entries_of_version(&update.from_version)
                .into_iter()
                .filter(|id| {
                    self.entries
                        .get(id)
                        .is_some_and(|entry| fits(entry, facts).is_err())
                })
                .collect();
            for id in &misfits {
                self.remove(*id);
            }
            removed.extend(misfits);
            removed.sort_unstable();
        }
        let carried: Vec<u64> = self.entries_of_version(&update.from_version);
        let entries = carried
            .into_iter()
            .filter_map(|id| {
                let entry = Arc::make_mut(self.entries.get_mut(&id)?);
                entry.corpus_version.clone_from(&update.to_version);
                Some(StoredEntry {
                    id,
                    entry: Some(entry.clone()),
                })
            })
            .collect();
        Applied {
            kind: Some(AppliedKind::Other(applied_command::Kind::Carried(
                CarriedEntries {
                    from_version: update.from_version,
                    to_version: update.to_version,
                    entries,
                },
            ))),
            removed,
        }
    }

    /// Ids of `version`'s entries, oldest first.
    fn entries_of_version(&self, version: &str) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.corpus_version == version)
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Removes the entries (of `version` only, when given) whose result holds one of
    /// `documents`; returns their ids, ascending.
    fn remove_holders_of(&mut self, documents: &[u64], version: Option<&str>) -> Vec<u64> {
        let mut removed: Vec<u64> = documents
            .iter()
            .filter_map(|doc| self.holders.get(doc))
            .flatten()
            .copied()
            .filter(|id| {
                version.is_none_or(|v| {
                    self.entries
                        .get(id)
                        .is_some_and(|entry| entry.corpus_version == v)
                })
            })
            .collect();
        removed.sort_unstable();
        removed.dedup();
        for entry in &removed {
            self.remove(*entry);
        }
        removed
    }

    fn capacity(&self) -> usize {
        usize::try_from(self.settings.cache_capacity)
            .unwrap_or(usize::MAX)
            .max(1)
    }

    fn insert(&mut self, id: u64, entry: CacheEntry) -> Option<Applied> {
        if entry.origin_seq > 0 {
            // Looked up before inserting: the key's copy only for an origin's first entry.
            match self.origins.get_mut(&entry.origin) {
                // A retried proposal that already committed.
                Some(last) if entry.origin_seq <= *last => return None,
                Some(last) => *last = entry.origin_seq,
                None => {
                    self.origins.insert(entry.origin.clone(), entry.origin_seq);
                }
            }
        }
        let removed = self.evict_beyond(&entry.tenant, self.capacity() - 1);
        for doc in &entry.document_ids {
            let holders = self.holders.entry(*doc).or_default();
            if !holders.contains(&id) {
                holders.push(id);
            }
        }
        match self.orders.get_mut(&entry.tenant) {
            Some(order) => order.push_back(id),
            None => {
                self.orders
                    .insert(entry.tenant.clone(), VecDeque::from([id]));
            }
        }
        let entry = Arc::new(entry);
        self.entries.insert(id, Arc::clone(&entry));
        Some(Applied {
            kind: Some(AppliedKind::Inserted { id, entry }),
            removed,
        })
    }

    /// Evicts `tenant`'s oldest entries until at most `keep` of its entries remain.
    fn evict_beyond(&mut self, tenant: &str, keep: usize) -> Vec<u64> {
        let mut removed = Vec::new();
        while let Some(oldest) = self
            .orders
            .get(tenant)
            .filter(|order| order.len() > keep)
            .and_then(|order| order.front().copied())
        {
            self.remove(oldest);
            removed.push(oldest);
        }
        removed
    }

    fn remove(&mut self, id: u64) {
        let Some(entry) = self.entries.remove(&id) else {
            return;
        };
        if let Some(order) = self.orders.get_mut(&entry.tenant) {
            // FIFO eviction takes the oldest: O(1) instead of a scan of the whole order.
            if order.front() == Some(&id) {
                order.pop_front();
            } else {
                order.retain(|e| *e != id);
            }
            if order.is_empty() {
                self.orders.remove(&entry.tenant);
            }
        }
        for doc in &entry.document_ids {
            if let Some(holders) = self.holders.get_mut(doc) {
                holders.retain(|e| *e != id);
                if holders.is_empty() {
                    self.holders.remove(doc);
                }
            }
        }
    }

    /// The whole state, oldest entry first (ids grow with the log, so their order is the
    /// order entries were applied in, across tenants).
    pub fn to_state(&self) -> ControlState {
        self.view().into_state()
    }

    /// The whole state as of now, sharing the entries instead of copying them: a snapshot
    /// takes it on the Raft thread in well under a millisecond, where copying the entries
    /// took tens, and turns it into a [`ControlState`] beside the node.
    pub fn view(&self) -> StateView {
        let mut origins: Vec<OriginSequence> = self
            .origins
            .iter()
            .map(|(origin, last_seq)| OriginSequence {
                origin: origin.clone(),
                last_seq: *last_seq,
            })
            .collect();
        origins.sort_by(|a, b| a.origin.cmp(&b.origin));
        StateView {
            state: ControlState {
                applied_index: self.applied_index,
                applied_term: self.applied_term,
                config: Some(self.settings.to_proto()),
                shard_map: self.shard_map.clone(),
                entries: Vec::new(),
                origins,
                corpora: self.corpora.values().cloned().collect(),
                kv_pools: self.kv_pools.values().cloned().collect(),
            },
            entries: self
                .entries
                .iter()
                .map(|(id, entry)| (*id, Arc::clone(entry)))
                .collect(),
        }
    }

    /// Rebuilds the state a snapshot describes.
    pub fn from_state(state: ControlState) -> Self {
        let mut machine = Self {
            applied_index: state.applied_index,
            applied_term: state.applied_term,
            settings: state.config.map(Settings::from_proto).unwrap_or_default(),
            shard_map: state.shard_map,
            ..Self::default()
        };
        machine.origins = state
            .origins
            .into_iter()
            .map(|o| (o.origin, o.last_seq))
            .collect();
        machine.corpora = state
            .corpora
            .into_iter()
            .map(|facts| (facts.corpus_version.clone(), facts))
            .collect();
        machine.kv_pools = state
            .kv_pools
            .into_iter()
            .map(|assignment| (assignment.pool.clone(), assignment))
            .collect();
        for stored in state.entries {
            let Some(entry) = stored.entry else { continue };
            for doc in &entry.document_ids {
                machine.holders.entry(*doc).or_default().push(stored.id);
            }
            machine
                .orders
                .entry(entry.tenant.clone())
                .or_default()
                .push_back(stored.id);
            machine.entries.insert(stored.id, Arc::new(entry));
        }
        machine
    }
}

/// The replicated state as of one applied index, its entries shared with the state
/// machine ([`CacheStateMachine::view`]).
#[derive(Debug, Clone)]
pub struct StateView {
    /// Everything but the entries.
    state: ControlState,
    entries: Vec<(u64, Arc<CacheEntry>)>,
}

impl StateView {
    pub fn applied_index(&self) -> u64 {
        self.state.applied_index
    }

    /// The encoding of [`Self::into_state`], written straight from the shared entries
    /// instead of copying them first (a snapshot copied the whole ~8 MB state, thousands of
    /// allocations, before encoding it). The entries follow the other fields, which
    /// decodes to the same state.
    pub fn encode(self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.encoded_len());
        self.encode_into(&mut buf);
        buf
    }

    /// The event that replaces a subscriber's whole state with this one, encoded into one
    /// buffer behind the event's own fields.
    pub fn into_event(self) -> EncodedEvent {
        let state_len = self.encoded_len();
        let mut buf = Vec::with_capacity(state_len + 24);
        applied::encode_state_event_head(self.applied_index(), state_len, &mut buf);
        self.encode_into(&mut buf);
        EncodedEvent::from_encoded(buf.into())
    }

    fn encoded_len(&self) -> usize {
        self.state.encoded_len()
            + self
                .entries
                .iter()
                .map(|(id, entry)| applied::stored_field_len(STATE_ENTRIES, *id, entry))
                .sum::<usize>()
    }

    fn encode_into(mut self, buf: &mut Vec<u8>) {
        self.entries.sort_unstable_by_key(|(id, _)| *id);
        self.state.encode_raw(buf);
        for (id, entry) in &self.entries {
            applied::encode_stored_field(STATE_ENTRIES, *id, entry, buf);
        }
    }

    /// The whole state, oldest entry first: copies every entry (milliseconds for
    /// thousands), so callers run it beside the node.
    pub fn into_state(self) -> ControlState {
        let mut entries: Vec<StoredEntry> = self
            .entries
            .into_iter()
            .map(|(id, entry)| StoredEntry {
                id,
                entry: Some(Arc::unwrap_or_clone(entry)),
            })
            .collect();
        entries.sort_by_key(|stored| stored.id);
        ControlState {
            entries,
            ..self.state
        }
    }
}

/// Whether `entry` fits the corpus `facts` describe: its query vector has the corpus's
/// dimension and it names no document beyond the corpus's largest id.
fn fits(entry: &CacheEntry, facts: &CorpusFacts) -> Result<(), String> {
    if entry.vector.len() != facts.dimension as usize {
        return Err(format!(
            "the query vector has {} dimensions, corpus version {} has {}",
            entry.vector.len(),
            facts.corpus_version,
            facts.dimension
        ));
    }
    if let Some(beyond) = entry
        .document_ids
        .iter()
        .find(|id| **id > facts.max_document_id)
    {
        return Err(format!(
            "document id {beyond} is beyond corpus version {}'s largest, {}",
            facts.corpus_version, facts.max_document_id
        ));
    }
    Ok(())
}
