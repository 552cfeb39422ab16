//! Backups of the replicated state. `export` writes the leader's snapshot to a file: a JSON
//! header line (format, version, applied index, entry count, payload length and SHA-256)
//! then the `ControlState` protobuf. `import` replays a backup into a group that caches
//! nothing yet as ordinary proposals (corpus registrations, then settings, then the entries
//! oldest first), so every node and every subscribed edge applies the restored entries as
//! it applies new ones.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use hasten_proto::v1::{ControlCommand, ControlState, RuntimeConfig, StoredEntry, control_command};
use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const FORMAT: &str = "hasten-control-state";
const VERSION: u32 = 1;

/// Proposals of at most this many encoded bytes (a node accepts far larger ones; smaller
/// ones keep each commit short and the progress bar moving).
pub const MAX_PROPOSAL_BYTES: usize = 1 << 20;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct BackupHeader {
    pub format: String,
    pub version: u32,
    pub applied_index: u64,
    pub entries: usize,
    pub payload_bytes: usize,
    pub sha256: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn encode(state: &ControlState) -> Result<Vec<u8>> {
    let payload = state.encode_to_vec();
    let header = BackupHeader {
        format: FORMAT.into(),
        version: VERSION,
        applied_index: state.applied_index,
        entries: state.entries.len(),
        payload_bytes: payload.len(),
        sha256: hex(&Sha256::digest(&payload)),
    };
    let mut out = serde_json::to_vec(&header)?;
    out.push(b'\n');
    out.extend(payload);
    Ok(out)
}

/// The state in a backup, after checking its header and checksum.
pub fn decode(bytes: &[u8]) -> Result<(BackupHeader, ControlState)> {
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .context("not a Hasten backup: no header line")?;
    let header: BackupHeader = serde_json::from_slice(&bytes[..newline])
        .context("not a Hasten backup: the header line is not its JSON")?;
    ensure!(
        header.format == FORMAT,
        "not a Hasten backup: format {:?}",
        header.format
    );
    ensure!(
        header.version == VERSION,
        "backup format version {} (this tool reads {VERSION})",
        header.version
    );
    let payload = &bytes[newline + 1..];
    ensure!(
        payload.len() == header.payload_bytes,
        "the backup is truncated: {} of {} bytes",
        payload.len(),
        header.payload_bytes
    );
    ensure!(
        hex(&Sha256::digest(payload)) == header.sha256,
        "the backup is corrupt: its SHA-256 does not match the header's"
    );
    let state = ControlState::decode(payload).context("decoding the backup's state")?;
    ensure!(
        state.entries.len() == header.entries,
        "the backup holds {} entries, its header says {}",
        state.entries.len(),
        header.entries
    );
    Ok((header, state))
}

/// Writes `bytes` to `path` through a temporary file and a rename: an interrupted export
/// leaves no half-written backup under the name.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("partial");
    let mut file =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn command(kind: control_command::Kind) -> ControlCommand {
    ControlCommand { kind: Some(kind) }
}

/// What an import proposes, in order: the corpus registrations (entries are admitted only
/// for registered versions), the settings, the shard map and KV pool assignments when the
/// target has none of its own (`target`), then the entries oldest first in proposals of
/// at most `max_bytes`.
pub fn restore_plan(
    backup: &ControlState,
    target: &ControlState,
    max_bytes: usize,
) -> Result<Vec<Vec<ControlCommand>>> {
    if !target.entries.is_empty() {
        bail!(
            "the group already caches {} entries: import restores into a group that caches \
             nothing (a new group, or flush its tenants first)",
            target.entries.len()
        );
    }
    let mut plan = Vec::new();
    let registrations: Vec<ControlCommand> = backup
        .corpora
        .iter()
        .filter(|facts| !target.corpora.contains(facts))
        .cloned()
        .map(|facts| command(control_command::Kind::RegisterCorpus(facts)))
        .collect();
    if !registrations.is_empty() {
        plan.push(registrations);
    }
    let mut settings = Vec::new();
    if let Some(config) = &backup.config {
        settings.push(command(control_command::Kind::Config(RuntimeConfig {
            tau: config.tau,
            cache_capacity: config.cache_capacity,
        })));
    }
    if let (Some(map), None) = (&backup.shard_map, &target.shard_map) {
        settings.push(command(control_command::Kind::ShardMap(map.clone())));
    }
    for pool in &backup.kv_pools {
        if !target.kv_pools.iter().any(|p| p.pool == pool.pool) {
            settings.push(command(control_command::Kind::KvPool(pool.clone())));
        }
    }
    if !settings.is_empty() {
        plan.push(settings);
    }
    let mut batch = Vec::new();
    let mut batch_bytes = 0;
    for StoredEntry { entry, .. } in &backup.entries {
        let Some(entry) = entry else { continue };
        let insert = command(control_command::Kind::Insert(entry.clone()));
        let size = insert.encoded_len();
        if !batch.is_empty() && batch_bytes + size > max_bytes {
            plan.push(std::mem::take(&mut batch));
            batch_bytes = 0;
        }
        batch_bytes += size;
        batch.push(insert);
    }
    if !batch.is_empty() {
        plan.push(batch);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;
    use hasten_proto::v1::{CacheEntry, CorpusFacts};

    fn state(entries: u64) -> ControlState {
        ControlState {
            applied_index: 42,
            applied_term: 3,
            config: Some(RuntimeConfig {
                tau: Some(0.4),
                cache_capacity: Some(5000),
            }),
            corpora: vec![CorpusFacts {
                corpus_version: "v1".into(),
                dimension: 4,
                max_document_id: 99,
            }],
            entries: (1..=entries)
                .map(|i| StoredEntry {
                    id: i << 16,
                    entry: Some(CacheEntry {
                        origin: "edge-0".into(),
                        origin_seq: i,
                        vector: vec![i as f32; 4],
                        document_ids: vec![i, i + 1],
                        tenant: "default".into(),
                        corpus_version: "v1".into(),
                        ..CacheEntry::default()
                    }),
                })
                .collect(),
            ..ControlState::default()
        }
    }

    #[test]
    fn a_backup_round_trips_and_refuses_damage() {
        let original = state(3);
        let bytes = encode(&original).unwrap();
        let (header, decoded) = decode(&bytes).unwrap();
        assert_eq!(decoded, original);
        assert_eq!((header.applied_index, header.entries), (42, 3));

        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(
            decode(&flipped)
                .unwrap_err()
                .to_string_full()
                .contains("corrupt")
        );
        let truncated = &bytes[..bytes.len() - 5];
        assert!(
            decode(truncated)
                .unwrap_err()
                .to_string_full()
                .contains("truncated")
        );
        assert!(decode(b"{}\n").is_err());
    }

    #[test]
    fn the_plan_registers_first_then_settings_then_entries_in_order_within_the_bound() {
        let backup = state(50);
        let one = command(control_command::Kind::Insert(
            backup.entries[0].entry.clone().unwrap(),
        ))
        .encoded_len();
        let plan = restore_plan(&backup, &ControlState::default(), one * 8).unwrap();
        assert!(matches!(
            plan[0][0].kind,
            Some(control_command::Kind::RegisterCorpus(_))
        ));
        assert!(matches!(
            plan[1][0].kind,
            Some(control_command::Kind::Config(RuntimeConfig { tau: Some(t), .. })) if t == 0.4
        ));
        let seqs: Vec<u64> = plan[2..]
            .iter()
            .flatten()
            .map(|c| match &c.kind {
                Some(control_command::Kind::Insert(e)) => e.origin_seq,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seqs, (1..=50).collect::<Vec<_>>());
        assert!(plan[2..].iter().all(|batch| batch.len() <= 8));

        // A registered version is not registered again; a group with entries is refused.
        let plan = restore_plan(&backup, &state(0), one * 8).unwrap();
        assert!(matches!(
            plan[0][0].kind,
            Some(control_command::Kind::Config(_))
        ));
        assert!(restore_plan(&backup, &state(1), one * 8).is_err());
    }
}
