//! Which stored entries are kept in which memory tier: heat-based placement.
//!
//! Every entry has a heat, the count of its accesses each decayed by half per `half_life`
//! accesses to the store (a popular chunk stays hot, a burst fades). After every access the
//! entries are ranked by heat (hottest first; ties to the more recent access, then the key)
//! and the tiers, fastest first, are filled in rank order: the tier in hand takes entries
//! while they fit, and the first entry that does not fit closes it for every colder one.
//! What no tier takes stays on disk only. The placement is thus a function of the heats and
//! budgets alone, whatever order things happened in.

use std::collections::HashMap;
use std::hash::Hash;

#[derive(Debug, Clone, Copy)]
struct Heat {
    bytes: u64,
    /// Heat as of access number `at`.
    value: f64,
    at: u64,
}

/// An entry that changed tier: `None` is disk only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move<K> {
    pub key: K,
    pub from: Option<usize>,
    pub to: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct HeatTiers<K> {
    budgets: Vec<u64>,
    half_life: f64,
    clock: u64,
    heats: HashMap<K, Heat>,
    placement: HashMap<K, usize>,
    used: Vec<u64>,
}

impl<K: Clone + Eq + Hash + Ord> HeatTiers<K> {
    /// `budgets` in bytes, fastest tier first; `half_life` in accesses (at least 1).
    pub fn new(budgets: Vec<u64>, half_life: f64) -> Self {
        let used = vec![0; budgets.len()];
        Self {
            budgets,
            half_life: half_life.max(1.0),
            clock: 0,
            heats: HashMap::new(),
            placement: HashMap::new(),
            used,
        }
    }

    /// Records an access to `key` (of `bytes` in memory) and re-places every entry.
    pub fn touch(&mut self, key: &K, bytes: u64) -> Vec<Move<K>> {
        self.clock += 1;
        let decay = self.decay_factor();
        let now = self.clock;
        let heat = self.heats.entry(key.clone()).or_insert(Heat {
            bytes,
            value: 0.0,
            at: now,
        });
        heat.value = heat.value * decay(now - heat.at) + 1.0;
        heat.at = now;
        heat.bytes = bytes;
        self.place()
    }

    /// Drops an entry (deleted or invalidated) from every tier.
    pub fn forget(&mut self, key: &K) -> Vec<Move<K>> {
        self.heats.remove(key);
        self.place()
    }

    pub fn set_budgets(&mut self, budgets: Vec<u64>) -> Vec<Move<K>> {
        self.used = vec![0; budgets.len()];
        self.budgets = budgets;
        self.place()
    }

    /// The tier holding `key`, `None` when it is on disk only.
    pub fn tier_of(&self, key: &K) -> Option<usize> {
        self.placement.get(key).copied()
    }

    /// Bytes placed in `tier`.
    pub fn used(&self, tier: usize) -> u64 {
        self.used.get(tier).copied().unwrap_or(0)
    }

    pub fn budgets(&self) -> &[u64] {
        &self.budgets
    }

    /// `key`'s heat now (0 for an entry never accessed).
    pub fn heat(&self, key: &K) -> f64 {
        let decay = self.decay_factor();
        self.heats
            .get(key)
            .map_or(0.0, |h| h.value * decay(self.clock - h.at))
    }

    fn decay_factor(&self) -> impl Fn(u64) -> f64 + use<K> {
        let half_life = self.half_life;
        move |elapsed| 0.5f64.powf(elapsed as f64 / half_life)
    }

    fn place(&mut self) -> Vec<Move<K>> {
        let decay = self.decay_factor();
        let mut ranked: Vec<(&K, f64, u64, u64)> = self
            .heats
            .iter()
            .map(|(k, h)| (k, h.value * decay(self.clock - h.at), h.at, h.bytes))
            .collect();
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then(b.2.cmp(&a.2))
                .then_with(|| a.0.cmp(b.0))
        });
        let mut placement = HashMap::with_capacity(ranked.len());
        let mut used = vec![0u64; self.budgets.len()];
        let mut tier = 0;
        for (key, _, _, bytes) in ranked {
            while tier < self.budgets.len() && used[tier] + bytes > self.budgets[tier] {
                tier += 1;
            }
            if tier == self.budgets.len() {
                break;
            }
            used[tier] += bytes;
            placement.insert(key.clone(), tier);
        }
        let mut moves: Vec<Move<K>> = placement
            .iter()
            .filter(|(k, t)| self.placement.get(*k) != Some(*t))
            .map(|(k, &t)| Move {
                key: k.clone(),
                from: self.placement.get(k).copied(),
                to: Some(t),
            })
            .chain(
                self.placement
                    .iter()
                    .filter(|(k, _)| !placement.contains_key(*k))
                    .map(|(k, &t)| Move {
                        key: k.clone(),
                        from: Some(t),
                        to: None,
                    }),
            )
            .collect();
        moves.sort_by(|a, b| a.key.cmp(&b.key));
        self.placement = placement;
        self.used = used;
        moves
    }
}
