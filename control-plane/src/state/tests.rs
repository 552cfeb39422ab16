use super::*;
use display_full_error::DisplayFullErrorExt;
use hasten_proto::v1::{CommittedEvent, FlushTenant, InvalidateDocuments, RetireCorpusVersion};

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

    // Flushing a tenant removes all of its entries and nobody else's.
    let flush = |tenant: &str| ControlCommand {
        kind: Some(control_command::Kind::FlushTenant(FlushTenant {
            tenant: tenant.into(),
        })),
    };
    let applied = restored.apply(5, 1, batch(vec![flush("acme")]));
    assert_eq!(applied[0].removed, vec![(3 << 16), (4 << 16)]);
    let left: Vec<u64> = restored.to_state().entries.iter().map(|e| e.id).collect();
    assert_eq!(left, vec![(2 << 16)]);
    assert!(
        restored.apply(6, 1, batch(vec![flush("acme")]))[0]
            .removed
            .is_empty()
    );
    assert!(validate(&[flush("")]).is_err());
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
        .to_string_full();
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
    let Some(AppliedKind::Other(applied_command::Kind::Carried(carried))) = &applied[0].kind else {
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
    let err = validate(&[unversioned]).unwrap_err().to_string_full();
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

fn facts(version: &str, dimension: u32, max_document_id: u64) -> ControlCommand {
    command(control_command::Kind::RegisterCorpus(CorpusFacts {
        corpus_version: version.into(),
        dimension,
        max_document_id,
    }))
}

#[test]
fn only_entries_that_fit_a_registered_corpus_are_admitted() {
    let mut machine = CacheStateMachine::default();
    let entry = insert("a", 1, &[1, 2]);
    assert!(matches!(
        machine.admit(std::slice::from_ref(&entry)),
        Err(AdmissionError::UnknownCorpus { position: 0, .. })
    ));
    machine.apply(1, 1, batch(vec![facts("v1", 2, 100)]));
    machine.admit(std::slice::from_ref(&entry)).unwrap();
    // A vector of another dimension, or a document beyond the corpus, fits no edge.
    let mut flat = insert("a", 2, &[1]);
    if let Some(control_command::Kind::Insert(e)) = &mut flat.kind {
        e.vector = vec![1.0, 0.0, 0.0];
    }
    let err = machine.admit(&[entry.clone(), flat]).unwrap_err();
    assert!(
        matches!(err, AdmissionError::Misfit { position: 1, .. }),
        "{err}"
    );
    assert!(err.to_string_full().contains("3 dimensions"), "{err}");
    let beyond = insert("a", 3, &[1, 99_999_999]);
    let err = machine.admit(&[beyond]).unwrap_err();
    assert!(err.to_string_full().contains("99999999"), "{err}");
    // A registration may repeat, not contradict; a corpus update leads to a known version.
    machine.admit(&[facts("v1", 2, 100)]).unwrap();
    assert!(machine.admit(&[facts("v1", 2, 50)]).is_err());
    let update = |to: &str| {
        command(control_command::Kind::CorpusUpdate(CorpusUpdate {
            from_version: "v1".into(),
            to_version: to.into(),
            changed_document_ids: vec![],
        }))
    };
    assert!(matches!(
        machine.admit(&[update("v2")]),
        Err(AdmissionError::UnknownCorpus { .. })
    ));
    // Registrations survive a snapshot.
    let restored = CacheStateMachine::from_state(machine.to_state());
    restored.admit(&[insert("a", 4, &[7])]).unwrap();
}

#[test]
fn a_corpus_update_drops_entries_that_do_not_fit_the_new_version() {
    let mut machine = CacheStateMachine::default();
    machine.apply(
        1,
        1,
        batch(vec![
            facts("v1", 2, 100),
            facts("v2", 2, 10),
            insert("a", 1, &[1, 2]),
            insert("a", 2, &[50]),
        ]),
    );
    let applied = machine.apply(
        2,
        1,
        batch(vec![command(control_command::Kind::CorpusUpdate(
            CorpusUpdate {
                from_version: "v1".into(),
                to_version: "v2".into(),
                changed_document_ids: vec![],
            },
        ))]),
    );
    // Document 50 does not exist in v2: that entry is dropped, the other carried.
    assert_eq!(applied[0].removed, vec![(1 << 16) | 3]);
    assert_eq!(versions(&machine), vec![((1 << 16) | 2, "v2".to_string())]);
}

fn kv_pool(pool: &str, workers: &[&str], version: &str) -> ControlCommand {
    command(control_command::Kind::KvPool(KvPoolAssignment {
        pool: pool.into(),
        workers: workers.iter().map(|w| w.to_string()).collect(),
        assignment_version: version.into(),
    }))
}

#[test]
fn kv_pool_assignments_replace_per_pool_survive_snapshots_and_are_checked() {
    let mut machine = CacheStateMachine::default();
    let applied = machine.apply(1, 1, batch(vec![kv_pool("rag/wiki", &["w-0:7510"], "a1")]));
    assert!(matches!(
        &applied[0].kind,
        Some(AppliedKind::Other(applied_command::Kind::KvPool(assignment))) if assignment.workers == ["w-0:7510"]
    ));
    machine.apply(
        2,
        1,
        batch(vec![
            kv_pool("rag/wiki", &["w-0:7510", "w-1:7510"], "a2"),
            kv_pool("rag/news", &[], "n1"),
        ]),
    );
    let wiki = machine.kv_pool("rag/wiki").expect("published");
    assert_eq!(
        (wiki.workers.len(), wiki.assignment_version.as_str()),
        (2, "a2")
    );
    assert_eq!(
        machine.kv_pool("rag/news").map(|p| p.workers.len()),
        Some(0)
    );
    let restored = CacheStateMachine::from_state(machine.to_state());
    assert_eq!(restored.kv_pool("rag/wiki"), machine.kv_pool("rag/wiki"));
    assert_eq!(restored.to_state(), machine.to_state());

    for bad in [
        kv_pool("", &["w:1"], "a"),
        kv_pool("rag/wiki", &["w:1"], ""),
        kv_pool("rag/wiki", &["w:1", "w:1"], "a"),
        kv_pool("rag/wiki", &["w 1"], "a"),
    ] {
        assert!(
            validate(std::slice::from_ref(&bad)).is_err(),
            "{bad:?} admitted"
        );
    }
}

#[test]
fn an_inserts_event_shares_the_entry_the_state_holds() {
    let mut machine = CacheStateMachine::default();
    machine.apply(1, 1, batch(vec![insert("edge", 1, &[4])]));
    let applied = machine.apply(2, 1, batch(vec![insert("edge", 2, &[5, 6])]));
    let Some(AppliedKind::Inserted { id, entry }) = &applied[0].kind else {
        panic!("{applied:?}");
    };
    let view = machine.view();
    let held = view
        .entries
        .iter()
        .find(|(held_id, _)| held_id == id)
        .map(|(_, held)| held)
        .expect("the state holds the inserted entry");
    assert!(Arc::ptr_eq(entry, held), "one copy of the entry, not two");
    let event = CommittedEvent::decode(
        EntryEvent::new(2, applied.clone())
            .encoded()
            .as_bytes()
            .clone(),
    )
    .expect("the event decodes");
    let Some(control_command::Kind::Insert(proposed)) = insert("edge", 2, &[5, 6]).kind else {
        unreachable!()
    };
    assert_eq!(
        event.applied[0].kind,
        Some(applied_command::Kind::Inserted(StoredEntry {
            id: 2 << 16,
            entry: Some(proposed),
        }))
    );
}

#[test]
fn an_event_is_encoded_as_prost_encodes_its_copy() {
    let mut machine = CacheStateMachine::default();
    let mut commands = vec![command(control_command::Kind::Config(RuntimeConfig {
        tau: Some(0.4),
        cache_capacity: Some(2),
    }))];
    commands.extend((1..=4).map(|seq| insert("edge", seq, &[seq, seq + 1])));
    commands.push(command(control_command::Kind::RegisterCorpus(
        CorpusFacts {
            corpus_version: "v1".into(),
            dimension: 2,
            max_document_id: 100,
        },
    )));
    commands.push(command(control_command::Kind::Invalidate(
        InvalidateDocuments {
            document_ids: vec![5],
        },
    )));
    let applied = machine.apply(7, 1, batch(commands));
    assert!(
        applied.iter().any(|a| !a.removed.is_empty())
            && applied
                .iter()
                .any(|a| matches!(a.kind, Some(AppliedKind::Other(_))))
            && applied.iter().any(|a| a.kind.is_none()),
        "every shape of command is covered: {applied:?}"
    );
    let event = EntryEvent::new(7, applied.clone());
    let encoded = event.encoded();
    assert_eq!(
        encoded.as_bytes().as_ref(),
        applied::copied::event(7, &applied)
            .encode_to_vec()
            .as_slice()
    );
    assert_eq!(event.encoded(), encoded, "the same bytes once encoded");
    assert_eq!(
        EntryEvent::empty(9).encoded().as_bytes().as_ref(),
        CommittedEvent {
            index: 9,
            ..CommittedEvent::default()
        }
        .encode_to_vec()
        .as_slice()
    );
}

#[test]
fn the_state_is_encoded_from_the_shared_entries_as_its_copy_decodes() {
    let mut machine = CacheStateMachine::default();
    machine.apply(
        1,
        1,
        batch(vec![command(control_command::Kind::RegisterCorpus(
            CorpusFacts {
                corpus_version: "v1".into(),
                dimension: 2,
                max_document_id: 100,
            },
        ))]),
    );
    for index in 2..40 {
        machine.apply(index, 2, batch(vec![insert("edge", index, &[index % 7])]));
    }
    let copied = machine.to_state();
    assert!(copied.entries.len() > 30 && copied.entries.windows(2).all(|w| w[0].id < w[1].id));
    let decoded = ControlState::decode(machine.view().encode().as_slice()).expect("decodes");
    assert_eq!(decoded, copied);
    let event =
        CommittedEvent::decode(machine.view().into_event().as_bytes().clone()).expect("decodes");
    assert_eq!(
        event,
        CommittedEvent {
            index: 39,
            applied: Vec::new(),
            state: Some(copied),
        }
    );
}
