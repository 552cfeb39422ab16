//! The replicated state machine: the shared hot cache (FIFO-bounded per tenant, as in the HaS
//! paper), the shard map and the runtime configuration.
//!
//! Every decision that changes what edges hold is taken here, in log order: which entries
//! a new one evicts, which an invalidation or a corpus update removes, whether a retried
//! proposal was already applied. Replicas applying the same log therefore hold the same
//! state, and the events they publish tell edges exactly what to add and remove.

use std::collections::{HashMap, VecDeque};

use hasten_proto::v1::{
    AppliedCommand, CacheEntry, CarriedEntries, CommandBatch, ControlCommand, ControlState,
    CorpusUpdate, OriginSequence, RuntimeConfig, ShardMap, StoredEntry, applied_command,
    control_command,
};

/// Cached queries kept per tenant before FIFO eviction: the HaS paper's cache of 5,000
/// queries.
pub const DEFAULT_CACHE_CAPACITY: u64 = 5_000;

/// Commands one log entry may carry: entry ids are `index << 16 | position`.
pub const MAX_COMMANDS_PER_ENTRY: usize = 1 << 16;

/// Why a proposal is refused before it reaches the log.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CommandError {
    #[error("a proposal needs at least one command")]
    Empty,
    #[error("a proposal carries at most {MAX_COMMANDS_PER_ENTRY} commands, got {0}")]
    TooMany(usize),
    #[error("command {0} is empty")]
    MissingKind(usize),
    #[error("command {position}: {reason}")]
    Invalid { position: usize, reason: String },
}

/// Checks a proposal so that applying it can never fail on any replica.
pub fn validate(commands: &[ControlCommand]) -> Result<(), CommandError> {
    if commands.is_empty() {
        return Err(CommandError::Empty);
    }
    if commands.len() > MAX_COMMANDS_PER_ENTRY {
        return Err(CommandError::TooMany(commands.len()));
    }
    for (position, command) in commands.iter().enumerate() {
        let kind = command
            .kind
            .as_ref()
            .ok_or(CommandError::MissingKind(position))?;
        check_command(kind).map_err(|reason| CommandError::Invalid { position, reason })?;
    }
    Ok(())
}

fn check_command(kind: &control_command::Kind) -> Result<(), String> {
    match kind {
        control_command::Kind::Insert(entry) => {
            if entry.vector.is_empty() {
                return Err("the query vector is empty".into());
            }
            if entry.document_ids.is_empty() {
                return Err("the entry holds no documents".into());
            }
            if entry.vector.iter().any(|x| !x.is_finite()) {
                return Err("the query vector holds a non-finite value".into());
            }
            if entry.origin.is_empty() {
                return Err("the entry names no origin edge".into());
            }
            if entry.tenant.is_empty() {
                return Err("the entry names no tenant".into());
            }
            if entry.corpus_version.is_empty() {
                return Err("the entry names no corpus version".into());
            }
        }
        control_command::Kind::Invalidate(_) => {}
        control_command::Kind::ShardMap(map) => {
            if map.shards.is_empty() {
                return Err("the shard map lists no shard".into());
            }
            let mut seen = std::collections::HashSet::new();
            for (shard, replicas) in map.shards.iter().enumerate() {
                if replicas.endpoints.is_empty() {
                    return Err(format!("shard {shard} has no replica"));
                }
                if let Some(endpoint) = replicas.endpoints.iter().find(|e| !seen.insert(*e)) {
                    return Err(format!("{endpoint} is listed twice in the shard map"));
                }
            }
        }
        control_command::Kind::Config(config) => {
            if let Some(tau) = config.tau
                && !(0.0..=1.0).contains(&tau)
            {
                return Err(format!("tau {tau} is outside [0, 1]"));
            }
            if config.cache_capacity == Some(0) {
                return Err("cache_capacity must be at least 1".into());
            }
        }
        control_command::Kind::CorpusUpdate(update) => {
            if update.from_version.is_empty() || update.to_version.is_empty() {
                return Err("a corpus update names both versions".into());
            }
            if update.from_version == update.to_version {
                return Err(format!(
                    "a corpus update goes from one version to another, got {} twice",
                    update.from_version
                ));
            }
        }
        control_command::Kind::RetireCorpusVersion(retire) => {
            if retire.corpus_version.is_empty() {
                return Err("retiring a corpus version needs its name".into());
            }
        }
    }
    Ok(())
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
    entries: HashMap<u64, CacheEntry>,
    /// Document -> entries whose result holds it (for invalidation).
    holders: HashMap<u64, Vec<u64>>,
    /// Highest sequence number applied per origin edge.
    origins: HashMap<String, u64>,
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

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Marks a log entry without commands (Raft's own) as applied.
    pub fn skip(&mut self, index: u64, term: u64) {
        self.applied_index = index;
        self.applied_term = term;
    }

    /// Applies the commands of the log entry at `index`, returning what each did.
    pub fn apply(&mut self, index: u64, term: u64, batch: CommandBatch) -> Vec<AppliedCommand> {
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

    fn apply_command(&mut self, id: u64, command: ControlCommand) -> Option<AppliedCommand> {
        match command.kind? {
            control_command::Kind::Insert(entry) => self.insert(id, entry),
            control_command::Kind::Invalidate(invalidation) => {
                let removed = self.remove_holders_of(&invalidation.document_ids, None);
                Some(AppliedCommand {
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
                Some(AppliedCommand {
                    kind: Some(applied_command::Kind::Config(self.settings.to_proto())),
                    removed,
                })
            }
            control_command::Kind::ShardMap(map) => {
                self.shard_map = Some(map.clone());
                Some(AppliedCommand {
                    kind: Some(applied_command::Kind::ShardMap(map)),
                    removed: Vec::new(),
                })
            }
            control_command::Kind::CorpusUpdate(update) => Some(self.update_corpus(update)),
            control_command::Kind::RetireCorpusVersion(retire) => {
                let removed = self.entries_of_version(&retire.corpus_version);
                for entry in &removed {
                    self.remove(*entry);
                }
                Some(AppliedCommand {
                    kind: None,
                    removed,
                })
            }
        }
    }

    /// Drops `from_version`'s entries that hold a changed document and relabels the rest
    /// to `to_version`.
    fn update_corpus(&mut self, update: CorpusUpdate) -> AppliedCommand {
        let removed =
            self.remove_holders_of(&update.changed_document_ids, Some(&update.from_version));
        let carried: Vec<u64> = self.entries_of_version(&update.from_version);
        let entries = carried
            .into_iter()
            .filter_map(|id| {
                let entry = self.entries.get_mut(&id)?;
                entry.corpus_version.clone_from(&update.to_version);
                Some(StoredEntry {
                    id,
                    entry: Some(entry.clone()),
                })
            })
            .collect();
        AppliedCommand {
            kind: Some(applied_command::Kind::Carried(CarriedEntries {
                from_version: update.from_version,
                to_version: update.to_version,
                entries,
            })),
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

    fn insert(&mut self, id: u64, entry: CacheEntry) -> Option<AppliedCommand> {
        if entry.origin_seq > 0 {
            let last = self.origins.entry(entry.origin.clone()).or_default();
            if entry.origin_seq <= *last {
                // A retried proposal that already committed.
                return None;
            }
            *last = entry.origin_seq;
        }
        let removed = self.evict_beyond(&entry.tenant, self.capacity() - 1);
        for doc in &entry.document_ids {
            let holders = self.holders.entry(*doc).or_default();
            if !holders.contains(&id) {
                holders.push(id);
            }
        }
        self.orders
            .entry(entry.tenant.clone())
            .or_default()
            .push_back(id);
        self.entries.insert(id, entry.clone());
        Some(AppliedCommand {
            kind: Some(applied_command::Kind::Inserted(StoredEntry {
                id,
                entry: Some(entry),
            })),
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
        let mut origins: Vec<OriginSequence> = self
            .origins
            .iter()
            .map(|(origin, last_seq)| OriginSequence {
                origin: origin.clone(),
                last_seq: *last_seq,
            })
            .collect();
        origins.sort_by(|a, b| a.origin.cmp(&b.origin));
        let mut entries: Vec<StoredEntry> = self
            .entries
            .iter()
            .map(|(id, entry)| StoredEntry {
                id: *id,
                entry: Some(entry.clone()),
            })
            .collect();
        entries.sort_by_key(|stored| stored.id);
        ControlState {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            config: Some(self.settings.to_proto()),
            shard_map: self.shard_map.clone(),
            entries,
            origins,
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
            machine.entries.insert(stored.id, entry);
        }
        machine
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hasten_proto::v1::{InvalidateDocuments, RetireCorpusVersion};

    fn insert(origin: &str, seq: u64, docs: &[u64]) -> ControlCommand {
        ControlCommand {
            kind: Some(control_command::Kind::Insert(CacheEntry {
                origin: origin.into(),
                origin_seq: seq,
                vector: vec![1.0, 0.0],
                document_ids: docs.to_vec(),
                tenant: "default".into(),
                corpus_version: "v1".into(),
                ..CacheEntry::default()
            })),
        }
    }

    fn batch(commands: Vec<ControlCommand>) -> CommandBatch {
        CommandBatch { commands }
    }

    #[test]
    fn each_tenant_evicts_only_its_own_entries() {
        let mut machine = CacheStateMachine::default();
        let capacity = ControlCommand {
            kind: Some(control_command::Kind::Config(RuntimeConfig {
                tau: None,
                cache_capacity: Some(2),
            })),
        };
        machine.apply(1, 1, batch(vec![capacity]));
        let of = |tenant: &str, seq: u64| {
            let mut command = insert("edge", seq, &[seq]);
            if let Some(control_command::Kind::Insert(entry)) = &mut command.kind {
                entry.tenant = tenant.into();
            }
            command
        };
        machine.apply(
            2,
            1,
            batch(vec![of("globex", 1), of("acme", 2), of("acme", 3)]),
        );
        // acme's third entry evicts acme's oldest, never globex's only one.
        let applied = machine.apply(3, 1, batch(vec![of("acme", 4)]));
        assert_eq!(applied[0].removed, vec![(2 << 16) | 1]);
        assert_eq!(machine.len(), 3);
        let tenants: Vec<String> = machine
            .to_state()
            .entries
            .iter()
            .map(|e| e.entry.as_ref().unwrap().tenant.clone())
            .collect();
        assert_eq!(tenants, ["globex", "acme", "acme"]);
        // A snapshot restores the per-tenant order: the next acme entry evicts acme's oldest.
        let mut restored = CacheStateMachine::from_state(machine.to_state());
        let applied = restored.apply(4, 1, batch(vec![of("acme", 5)]));
        assert_eq!(applied[0].removed, vec![(2 << 16) | 2]);
    }

    fn ids(machine: &CacheStateMachine) -> Vec<u64> {
        machine.to_state().entries.iter().map(|e| e.id).collect()
    }

    #[test]
    fn fifo_eviction_retries_and_invalidation_are_decided_here() {
        let mut machine = CacheStateMachine::default();
        let capacity = RuntimeConfig {
            tau: None,
            cache_capacity: Some(2),
        };
        machine.apply(
            1,
            1,
            batch(vec![ControlCommand {
                kind: Some(control_command::Kind::Config(capacity)),
            }]),
        );
        machine.apply(
            2,
            1,
            batch(vec![insert("a", 1, &[10, 11]), insert("a", 2, &[11])]),
        );
        assert_eq!(ids(&machine), vec![2 << 16, (2 << 16) | 1]);
        // A third entry evicts the oldest, and says so.
        let applied = machine.apply(3, 1, batch(vec![insert("b", 1, &[12])]));
        assert_eq!(applied[0].removed, vec![2 << 16]);
        assert_eq!(ids(&machine), vec![(2 << 16) | 1, 3 << 16]);
        // A retried proposal (same origin and sequence) is not applied again.
        assert!(
            machine
                .apply(4, 1, batch(vec![insert("b", 1, &[12])]))
                .is_empty()
        );
        // Invalidating document 11 removes the entry holding it, and only that one.
        let applied = machine.apply(
            5,
            1,
            batch(vec![ControlCommand {
                kind: Some(control_command::Kind::Invalidate(InvalidateDocuments {
                    document_ids: vec![11],
                })),
            }]),
        );
        assert_eq!(applied[0].removed, vec![(2 << 16) | 1]);
        assert_eq!(ids(&machine), vec![3 << 16]);
        assert_eq!(machine.applied_index(), 5);
    }

    #[test]
    fn a_restored_state_decides_like_the_original() {
        let mut original = CacheStateMachine::default();
        for index in 1..=6 {
            original.apply(index, 2, batch(vec![insert("a", index, &[index, 100])]));
        }
        let mut restored = CacheStateMachine::from_state(original.to_state());
        assert_eq!(restored.to_state(), original.to_state());
        let next = batch(vec![
            insert("a", 3, &[1]),
            ControlCommand {
                kind: Some(control_command::Kind::Invalidate(InvalidateDocuments {
                    document_ids: vec![100],
                })),
            },
            insert("a", 7, &[7]),
        ]);
        assert_eq!(
            restored.apply(7, 2, next.clone()),
            original.apply(7, 2, next)
        );
        assert_eq!(restored.to_state(), original.to_state());
        assert_eq!(ids(&original), vec![7 << 16 | 2]);
    }

    #[test]
    fn malformed_proposals_are_refused_before_the_log() {
        assert_eq!(validate(&[]), Err(CommandError::Empty));
        assert_eq!(
            validate(&[ControlCommand { kind: None }]),
            Err(CommandError::MissingKind(0))
        );
        let mut bad = insert("a", 1, &[1]);
        if let Some(control_command::Kind::Insert(entry)) = &mut bad.kind {
            entry.vector[1] = f32::NAN;
        }
        let err = validate(&[insert("a", 1, &[1]), bad])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("command 1") && err.contains("non-finite"),
            "{err}"
        );
    }

    fn command(kind: control_command::Kind) -> ControlCommand {
        ControlCommand { kind: Some(kind) }
    }

    fn of_version(origin: &str, seq: u64, docs: &[u64], version: &str) -> ControlCommand {
        let mut command = insert(origin, seq, docs);
        if let Some(control_command::Kind::Insert(entry)) = &mut command.kind {
            entry.corpus_version = version.into();
        }
        command
    }

    fn versions(machine: &CacheStateMachine) -> Vec<(u64, String)> {
        machine
            .to_state()
            .entries
            .iter()
            .map(|e| (e.id, e.entry.as_ref().unwrap().corpus_version.clone()))
            .collect()
    }

    #[test]
    fn a_partial_corpus_update_drops_entries_of_changed_documents_and_carries_the_rest() {
        let mut machine = CacheStateMachine::default();
        machine.apply(
            1,
            1,
            batch(vec![
                of_version("a", 1, &[1, 2], "v1"),
                of_version("a", 2, &[3, 4], "v1"),
                of_version("a", 3, &[2, 5], "v0"),
                of_version("a", 4, &[6], "v1"),
            ]),
        );
        let applied = machine.apply(
            2,
            1,
            batch(vec![command(control_command::Kind::CorpusUpdate(
                CorpusUpdate {
                    from_version: "v1".into(),
                    to_version: "v2".into(),
                    changed_document_ids: vec![2, 6],
                },
            ))]),
        );
        // Document 2 changed: v1's entry holding it goes, v0's entry holding it is another
        // corpus's concern and stays; the untouched v1 entry carries over to v2.
        assert_eq!(applied[0].removed, vec![1 << 16, (1 << 16) | 3]);
        let Some(applied_command::Kind::Carried(carried)) = &applied[0].kind else {
            panic!("{applied:?}");
        };
        assert_eq!(
            (carried.from_version.as_str(), carried.to_version.as_str()),
            ("v1", "v2")
        );
        let carried_ids: Vec<u64> = carried.entries.iter().map(|e| e.id).collect();
        assert_eq!(carried_ids, vec![(1 << 16) | 1]);
        assert_eq!(
            versions(&machine),
            vec![
                ((1 << 16) | 1, "v2".to_string()),
                ((1 << 16) | 2, "v0".to_string())
            ]
        );
        // The relabelled version survives a snapshot.
        let restored = CacheStateMachine::from_state(machine.to_state());
        assert_eq!(restored.to_state(), machine.to_state());

        let retired = machine.apply(
            3,
            1,
            batch(vec![command(control_command::Kind::RetireCorpusVersion(
                RetireCorpusVersion {
                    corpus_version: "v0".into(),
                },
            ))]),
        );
        assert_eq!(retired[0].removed, vec![(1 << 16) | 2]);
        assert_eq!(versions(&machine), vec![((1 << 16) | 1, "v2".to_string())]);
    }

    #[test]
    fn corpus_commands_and_settings_are_checked_before_the_log() {
        let update = |from: &str, to: &str| {
            command(control_command::Kind::CorpusUpdate(CorpusUpdate {
                from_version: from.into(),
                to_version: to.into(),
                changed_document_ids: vec![],
            }))
        };
        assert!(validate(&[update("v1", "v2")]).is_ok());
        assert!(validate(&[update("v1", "v1")]).is_err());
        assert!(validate(&[update("", "v2")]).is_err());
        let retire = command(control_command::Kind::RetireCorpusVersion(
            RetireCorpusVersion::default(),
        ));
        assert!(validate(&[retire]).is_err());
        let config = |tau: Option<f64>, capacity: Option<u64>| {
            command(control_command::Kind::Config(RuntimeConfig {
                tau,
                cache_capacity: capacity,
            }))
        };
        assert!(validate(&[config(Some(0.3), None)]).is_ok());
        assert!(validate(&[config(Some(1.5), None)]).is_err());
        assert!(validate(&[config(Some(f64::NAN), None)]).is_err());
        assert!(validate(&[config(None, Some(0))]).is_err());
        let mut unversioned = insert("a", 1, &[1]);
        if let Some(control_command::Kind::Insert(entry)) = &mut unversioned.kind {
            entry.corpus_version.clear();
        }
        let err = validate(&[unversioned]).unwrap_err().to_string();
        assert!(err.contains("corpus version"), "{err}");
    }

    #[test]
    fn a_config_changes_only_what_it_names() {
        let mut machine = CacheStateMachine::default();
        assert_eq!(machine.config().tau, None);
        machine.apply(1, 1, batch(vec![config_command(Some(0.4), None)]));
        machine.apply(2, 1, batch(vec![config_command(None, Some(7))]));
        assert_eq!(
            machine.config(),
            RuntimeConfig {
                tau: Some(0.4),
                cache_capacity: Some(7)
            }
        );
    }

    fn config_command(tau: Option<f64>, cache_capacity: Option<u64>) -> ControlCommand {
        command(control_command::Kind::Config(RuntimeConfig {
            tau,
            cache_capacity,
        }))
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// What a test sequence does to the state machine.
        #[derive(Clone, Debug)]
        enum Op {
            Insert {
                origin: u8,
                seq: u64,
                docs: Vec<u64>,
            },
            Invalidate(Vec<u64>),
            Capacity(u32),
            /// Replaces the machine by one restored from its own snapshot.
            Snapshot,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (0u8..3, 0u64..25, proptest::collection::vec(0u64..12, 1..4))
                    .prop_map(|(origin, seq, docs)| Op::Insert { origin, seq, docs }),
                2 => proptest::collection::vec(0u64..12, 1..3).prop_map(Op::Invalidate),
                1 => (1u32..6).prop_map(Op::Capacity),
                1 => Just(Op::Snapshot),
            ]
        }

        /// The cache as a plain list, oldest first: (id, origin, seq, documents).
        #[derive(Default)]
        struct Model {
            entries: Vec<(u64, String, u64, Vec<u64>)>,
            last_seq: std::collections::HashMap<String, u64>,
            capacity: usize,
        }

        impl Model {
            fn evict_beyond(&mut self, keep: usize) -> Vec<u64> {
                let excess = self.entries.len().saturating_sub(keep);
                self.entries.drain(..excess).map(|e| e.0).collect()
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever the sequence of inserts, retries, invalidations, capacity changes and
            /// snapshot restores, the machine holds exactly what a FIFO list holds, in order,
            /// reports exactly the removals the list made, and never exceeds its capacity.
            #[test]
            fn the_cache_state_machine_is_a_fifo_with_retries_applied_once(
                ops in proptest::collection::vec(op(), 1..60)
            ) {
                let mut machine = CacheStateMachine::default();
                let mut model = Model {
                    capacity: machine.capacity(),
                    ..Model::default()
                };
                for (i, op) in ops.into_iter().enumerate() {
                    let index = i as u64 + 1;
                    let id = index << 16;
                    let (command, expected_removed) = match op {
                        Op::Snapshot => {
                            machine = CacheStateMachine::from_state(machine.to_state());
                            continue;
                        }
                        Op::Insert { origin, seq, docs } => {
                            let origin = format!("edge-{origin}");
                            let retried = seq > 0
                                && model.last_seq.get(&origin).is_some_and(|last| seq <= *last);
                            let removed = if retried {
                                None
                            } else {
                                if seq > 0 {
                                    model.last_seq.insert(origin.clone(), seq);
                                }
                                let keep = model.capacity - 1;
                                let removed = model.evict_beyond(keep);
                                model.entries.push((id, origin.clone(), seq, docs.clone()));
                                Some(removed)
                            };
                            let command = ControlCommand {
                                kind: Some(control_command::Kind::Insert(CacheEntry {
                                    origin,
                                    origin_seq: seq,
                                    vector: vec![1.0, 0.0],
                                    document_ids: docs,
                                    ..CacheEntry::default()
                                })),
                            };
                            (command, removed)
                        }
                        Op::Invalidate(docs) => {
                            let (gone, kept): (Vec<_>, Vec<_>) = model
                                .entries
                                .drain(..)
                                .partition(|e| e.3.iter().any(|d| docs.contains(d)));
                            model.entries = kept;
                            let mut removed: Vec<u64> = gone.into_iter().map(|e| e.0).collect();
                            removed.sort_unstable();
                            let command = ControlCommand {
                                kind: Some(control_command::Kind::Invalidate(InvalidateDocuments {
                                    document_ids: docs,
                                })),
                            };
                            (command, Some(removed))
                        }
                        Op::Capacity(capacity) => {
                            model.capacity = capacity as usize;
                            let removed = model.evict_beyond(model.capacity);
                            let command = ControlCommand {
                                kind: Some(control_command::Kind::Config(RuntimeConfig {
                                    tau: None,
                                    cache_capacity: Some(u64::from(capacity)),
                                })),
                            };
                            (command, Some(removed))
                        }
                    };
                    let applied = machine.apply(index, 1, batch(vec![command]));
                    let removed: Option<Vec<u64>> = applied.first().map(|a| a.removed.clone());
                    prop_assert_eq!(removed, expected_removed, "removals at op {}", i);
                    let held: Vec<(u64, String, u64)> = machine
                        .to_state()
                        .entries
                        .iter()
                        .map(|e| {
                            let entry = e.entry.clone().unwrap_or_default();
                            (e.id, entry.origin, entry.origin_seq)
                        })
                        .collect();
                    let expected: Vec<(u64, String, u64)> = model
                        .entries
                        .iter()
                        .map(|e| (e.0, e.1.clone(), e.2))
                        .collect();
                    prop_assert_eq!(held, expected, "entries after op {}", i);
                    prop_assert!(machine.len() <= model.capacity);
                }
            }
        }
    }
}
