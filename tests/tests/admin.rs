//! `hasten-admin` against real `control-plane` processes on loopback: status of every node
//! (and of one that is down), runtime settings, invalidation by document, a tenant flush,
//! membership changes, and a backup exported from one group and imported into a fresh one
//! whose replicated state then holds the same entries; a damaged backup and an import into
//! a group that already caches are refused.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use hasten_eval::process::binary;
use hasten_proto::v1::{CacheEntry, ControlCommand, ControlState, ProposeRequest, control_command};
use hasten_tests::admin::{admin, admin_json};
use hasten_tests::cluster::Cluster;
use serde_json::Value;

fn entry(seq: u64, tenant: &str) -> ControlCommand {
    ControlCommand {
        kind: Some(control_command::Kind::Insert(CacheEntry {
            origin: "edge-a".into(),
            origin_seq: seq,
            text: Some(format!("question {seq}")),
            vector: vec![seq as f32, 1.0, 0.5, 0.25],
            document_ids: vec![seq, seq + 100],
            tenant: tenant.into(),
            corpus_version: "v1".into(),
        })),
    }
}

/// The entries' contents (not their ids, which are the log positions that inserted them).
fn contents(state: &ControlState) -> Vec<CacheEntry> {
    state
        .entries
        .iter()
        .filter_map(|e| e.entry.clone())
        .collect()
}

async fn state_when(
    cluster: &Cluster,
    what: &str,
    done: impl Fn(&ControlState) -> bool,
) -> ControlState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leader = cluster.leader().await;
        let state = cluster.state(leader).await;
        if done(&state) {
            return state;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {} entries",
            state.entries.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_tool_sees_changes_backs_up_and_restores_the_control_plane() {
    let mut cluster = Cluster::start("admin", 3, 10_000);
    let leader = cluster.leader().await;
    let addresses: Vec<String> = cluster.addresses.values().cloned().collect();
    let nodes: Vec<&String> = addresses.iter().collect();

    let status = admin_json(&nodes, &["status"]);
    assert_eq!(status["leader_id"], leader, "{status}");
    assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
    let rows = status["nodes"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{status}");
    assert!(rows.iter().all(|r| r["error"].is_null()), "{status}");
    let leaders: Vec<&Value> = rows.iter().filter(|r| r["role"] == "leader").collect();
    assert_eq!(leaders.len(), 1, "{status}");

    // Two tenants' entries, then settings, an invalidation and a flush through the tool.
    cluster.register_corpus("v1", 4, 1_000).await;
    let commands: Vec<ControlCommand> = (1..=30)
        .map(|seq| entry(seq, if seq % 3 == 0 { "globex" } else { "acme" }))
        .collect();
    let index = cluster
        .client(leader)
        .await
        .propose(ProposeRequest { commands })
        .await
        .unwrap()
        .into_inner()
        .index;
    cluster.applied_everywhere(index).await;

    admin_json(&nodes, &["config", "--tau", "0.45", "--capacity", "100"]);
    let state = state_when(&cluster, "the configuration", |s| {
        s.config.as_ref().is_some_and(|c| c.tau == Some(0.45))
    })
    .await;
    assert_eq!(state.config.unwrap().cache_capacity, Some(100));

    // Document 105 is held by acme's entry 5 only (each entry holds seq and seq + 100).
    let reply = admin_json(&nodes, &["invalidate", "--documents", "105,999"]);
    assert!(reply["index"].as_u64().unwrap() > index, "{reply}");
    let state = state_when(&cluster, "the invalidation", |s| s.entries.len() == 29).await;
    assert!(
        contents(&state)
            .iter()
            .all(|e| !e.document_ids.contains(&105))
    );

    admin_json(&nodes, &["flush-tenant", "globex"]);
    let state = state_when(&cluster, "the flush", |s| s.entries.len() == 19).await;
    assert!(contents(&state).iter().all(|e| e.tenant == "acme"));

    // Backup, then restore into a fresh group: the same entries, settings and corpus.
    let backup = cluster.work.join("backup.hcs");
    let _ = std::fs::remove_file(&backup);
    let exported = admin_json(&nodes, &["export", backup.to_str().unwrap()]);
    assert_eq!(exported["entries"], 19, "{exported}");
    let before = cluster.state(leader).await;

    let restored = Cluster::start("admin-restore", 1, 10_000);
    restored.leader().await;
    let fresh: Vec<String> = restored.addresses.values().cloned().collect();
    let fresh: Vec<&String> = fresh.iter().collect();
    damaged_backups_are_refused(&fresh, &backup, &cluster.work);
    let imported = admin_json(&fresh, &["import", backup.to_str().unwrap()]);
    assert_eq!(imported["entries_now"], 19, "{imported}");
    let after = restored.state(restored.leader().await).await;
    assert_eq!(contents(&after), contents(&before));
    assert_eq!(after.config, before.config);
    assert_eq!(after.corpora, before.corpora);
    // A second import would merge into what the first restored: refused.
    let again = admin(&fresh, &["import", backup.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already caches 19 entries"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // A new corpus version (registered, as its edges do at start): the entries carry over to
    // it, except those holding a changed document (101 is held by acme's entry 1 only).
    cluster.register_corpus("v2", 4, 1_000).await;
    admin_json(
        &nodes,
        &[
            "corpus-update",
            "--from",
            "v1",
            "--to",
            "v2",
            "--changed-documents",
            "101",
        ],
    );
    let state = state_when(&cluster, "the corpus update", |s| {
        contents(s).iter().all(|e| e.corpus_version == "v2")
    })
    .await;
    assert_eq!(state.entries.len(), 18);
    assert!(
        contents(&state)
            .iter()
            .all(|e| !e.document_ids.contains(&101))
    );
    let same = admin(&nodes, &["corpus-update", "--from", "v2", "--to", "v2"]);
    assert!(!same.status.success());
    assert!(
        String::from_utf8_lossy(&same.stderr).contains("two different corpus versions"),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );

    // Membership: a fourth node joins through the tool, then leaves.
    cluster.join_node(4);
    let fourth = cluster.addresses[&4].clone();
    let added = admin_json(
        &nodes,
        &["members", "add", "--id", "4", "--address", &fourth],
    );
    assert_eq!(added["members"].as_array().unwrap().len(), 4, "{added}");
    let removed = admin_json(&nodes, &["members", "remove", "--id", "4"]);
    assert_eq!(removed["members"].as_array().unwrap().len(), 3, "{removed}");
    cluster.kill(4);

    // Lose one node, as the chart README's runbook does it: its volume is gone; remove it,
    // start it on an empty directory with the flags it always had (a founder's, as its pod
    // is started), add it back. It catches up from the leader.
    let lost = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let lost_id = lost.to_string();
    cluster.kill(lost);
    let removed = admin_json(&nodes, &["members", "remove", "--id", &lost_id]);
    assert_eq!(removed["members"].as_array().unwrap().len(), 2, "{removed}");
    cluster.start_wiped(lost, &[]);
    let lost_address = cluster.addresses[&lost].clone();
    let added = admin_json(
        &nodes,
        &[
            "members",
            "add",
            "--id",
            &lost_id,
            "--address",
            &lost_address,
        ],
    );
    assert_eq!(added["members"].as_array().unwrap().len(), 3, "{added}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = admin_json(&nodes, &["status"]);
        let rows = status["nodes"].as_array().unwrap();
        let row = |id: u64| rows.iter().find(|r| r["id"] == id).cloned();
        if let (Some(back), Some(head)) = (row(lost), row(leader))
            && back["lag"] == 0
            && back["cached_entries"] == head["cached_entries"]
            && back["role"] == "follower"
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node {lost} did not catch up: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        contents(&cluster.state(lost).await),
        contents(&cluster.state(leader).await)
    );

    // A node that is down is reported, not fatal; the table says so.
    let follower = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    cluster.kill(follower);
    let status = admin_json(&nodes, &["status"]);
    let down: Vec<&Value> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["error"].is_null())
        .collect();
    assert_eq!(down.len(), 1, "{status}");
    assert_eq!(down[0]["address"], cluster.addresses[&follower], "{status}");
    let mut table = std::process::Command::new(binary("hasten-admin").unwrap());
    for node in &nodes {
        table.args(["--control-plane", node]);
    }
    let table = table.arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(
        text.contains("unreachable") && text.contains(&format!("leader: {leader} (")),
        "{text}"
    );
}

/// A truncated or altered backup is refused before anything is proposed.
fn damaged_backups_are_refused(nodes: &[&String], backup: &Path, work: &Path) {
    let bytes = std::fs::read(backup).unwrap();
    let mut altered = bytes.clone();
    let last = altered.len() - 1;
    altered[last] ^= 0x40;
    for (name, damaged, why) in [
        ("altered.hcs", altered, "corrupt"),
        (
            "truncated.hcs",
            bytes[..bytes.len() / 2].to_vec(),
            "truncated",
        ),
    ] {
        let path = work.join(name);
        std::fs::write(&path, damaged).unwrap();
        let out = admin(nodes, &["import", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(why),
            "{name}: {stderr}"
        );
    }
}
