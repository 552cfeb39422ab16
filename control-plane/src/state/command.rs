//! What a proposal may hold: every command is checked before it reaches the log, so that
//! applying it can never fail on any replica.

use std::collections::HashSet;

use hasten_proto::v1::{ControlCommand, control_command};

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
            let mut seen = HashSet::new();
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
        control_command::Kind::RegisterCorpus(facts) => {
            if facts.corpus_version.is_empty() || facts.dimension == 0 {
                return Err("a corpus registration names its version and dimension".into());
            }
        }
        control_command::Kind::FlushTenant(flush) => {
            if flush.tenant.is_empty() {
                return Err("flushing a tenant needs its name".into());
            }
        }
        control_command::Kind::RetireCorpusVersion(retire) => {
            if retire.corpus_version.is_empty() {
                return Err("retiring a corpus version needs its name".into());
            }
        }
        control_command::Kind::KvPool(assignment) => {
            if assignment.pool.is_empty() || assignment.assignment_version.is_empty() {
                return Err("a KV pool assignment names its pool and version".into());
            }
            let mut seen = HashSet::new();
            for worker in &assignment.workers {
                if worker.is_empty() || worker.contains(char::is_whitespace) {
                    return Err(format!("KV worker address {worker:?} is not host:port"));
                }
                if !seen.insert(worker) {
                    return Err(format!("KV worker {worker} is listed twice"));
                }
            }
        }
    }
    Ok(())
}
