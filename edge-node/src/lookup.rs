//! Query-level caches, the baselines HaS is compared with: reuse a cached result when the
//! new query's text is identical (exact-repeat cache) or when its embedding is close enough
//! to a cached query's (semantic-threshold cache, as GPTCache, RedisVL and Proximity do).

use std::collections::HashMap;

use hasten_core::index::{IndexError, RemovableFlatIndex};

use crate::has::{CachedQuery, QueryId};

/// Key of the exact-repeat cache: case and spacing do not make a new question.
pub fn normalized_text(text: &str) -> String {
    text.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Which lookup a cache keeps beside its queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupKind {
    None,
    ExactText,
    Semantic,
}

/// How cached queries are looked up, per policy. Query vectors live here, with the lookups
/// that use them; HaS's hot cache votes by documents and keeps none.
#[derive(Debug)]
pub enum QueryLookup {
    /// HaS and cloud-only look nothing up by query.
    None,
    ExactText(ExactTextLookup),
    /// Exact inner-product search over the cached queries' vectors.
    Semantic(RemovableFlatIndex),
}

/// Normalised text to the newest cached query with that text, and that query's vector: an
/// exact repeat is served without encoding the question, its documents scored against the
/// cached query's vector.
#[derive(Debug, Default)]
pub struct ExactTextLookup {
    by_text: HashMap<String, QueryId>,
    vectors: HashMap<QueryId, Vec<f32>>,
}

impl QueryLookup {
    /// An empty lookup of `kind` over `dimension`-d query vectors.
    pub fn of_kind(kind: LookupKind, dimension: usize) -> Result<Self, IndexError> {
        Ok(match kind {
            LookupKind::None => Self::None,
            LookupKind::ExactText => Self::exact(),
            LookupKind::Semantic => Self::semantic(dimension)?,
        })
    }

    pub fn exact() -> Self {
        Self::ExactText(ExactTextLookup::default())
    }

    pub fn semantic(dimension: usize) -> Result<Self, IndexError> {
        Ok(Self::Semantic(RemovableFlatIndex::new(dimension)?))
    }

    /// Registers a newly cached query.
    pub fn insert(
        &mut self,
        id: QueryId,
        text: Option<&str>,
        vector: &[f32],
    ) -> Result<(), IndexError> {
        match self {
            Self::None => Ok(()),
            Self::ExactText(lookup) => {
                if let Some(text) = text {
                    lookup.by_text.insert(normalized_text(text), id);
                    lookup.vectors.insert(id, vector.to_vec());
                }
                Ok(())
            }
            Self::Semantic(index) => index.add(&[id], vector),
        }
    }

    /// Forgets evicted queries.
    pub fn remove(&mut self, evicted: &[CachedQuery]) -> Result<(), IndexError> {
        match self {
            Self::None => Ok(()),
            Self::ExactText(lookup) => {
                for entry in evicted {
                    lookup.vectors.remove(&entry.id);
                    if let Some(text) = &entry.text {
                        let key = normalized_text(text);
                        // A newer entry with the same text keeps the key.
                        if lookup.by_text.get(&key) == Some(&entry.id) {
                            lookup.by_text.remove(&key);
                        }
                    }
                }
                Ok(())
            }
            Self::Semantic(index) => {
                let ids: Vec<u64> = evicted.iter().map(|e| e.id).collect();
                index.remove(&ids).map(|_| ())
            }
        }
    }

    /// The newest cached query asked as `text` (up to case and spacing), with its vector.
    pub fn find_text(&self, text: &str) -> Option<(QueryId, &[f32])> {
        match self {
            Self::ExactText(lookup) => {
                let id = *lookup.by_text.get(&normalized_text(text))?;
                Some((id, lookup.vectors.get(&id)?.as_slice()))
            }
            _ => None,
        }
    }

    /// The nearest cached query and its cosine similarity.
    pub fn nearest(&self, vector: &[f32]) -> Result<Option<(QueryId, f32)>, IndexError> {
        Ok(self.nearest_n(vector, 1)?.first().copied())
    }

    /// The `n` nearest cached queries, nearest first, with their cosine similarities (none
    /// without a semantic lookup).
    pub fn nearest_n(&self, vector: &[f32], n: usize) -> Result<Vec<(QueryId, f32)>, IndexError> {
        match self {
            Self::Semantic(index) => Ok(index
                .search(vector, n)?
                .into_iter()
                .map(|h| (h.id, h.score))
                .collect()),
            _ => Ok(Vec::new()),
        }
    }

    /// Memory held, in bytes (keys and vectors, plus map overhead).
    pub fn bytes(&self, dimension: usize) -> usize {
        match self {
            Self::None => 0,
            Self::ExactText(lookup) => {
                lookup.by_text.keys().map(|k| k.len() + 48).sum::<usize>()
                    + lookup.vectors.len() * (dimension * 4 + 48)
            }
            Self::Semantic(index) => index.len() * (dimension * 4 + 16),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evicted(id: QueryId, text: Option<&str>) -> CachedQuery {
        CachedQuery {
            id,
            text: text.map(str::to_string),
            doc_ids: vec![],
        }
    }

    #[test]
    fn exact_lookup_ignores_case_and_spacing_and_survives_older_evictions() {
        let mut lookup = QueryLookup::exact();
        lookup.insert(1, Some("Where is  Warsaw?"), &[1.0]).unwrap();
        assert_eq!(lookup.find_text("where is warsaw?"), Some((1, &[1.0][..])));
        assert_eq!(lookup.find_text("where is warsaw"), None);
        lookup.insert(2, Some("WHERE IS WARSAW?"), &[2.0]).unwrap();
        lookup
            .remove(&[evicted(1, Some("Where is  Warsaw?"))])
            .unwrap();
        assert_eq!(lookup.find_text("Where is Warsaw?"), Some((2, &[2.0][..])));
        lookup
            .remove(&[evicted(2, Some("WHERE IS WARSAW?"))])
            .unwrap();
        assert_eq!(lookup.find_text("Where is Warsaw?"), None);
    }

    #[test]
    fn semantic_lookup_finds_the_nearest_and_forgets_evicted() {
        let mut lookup = QueryLookup::semantic(2).unwrap();
        lookup.insert(1, None, &[1.0, 0.0]).unwrap();
        lookup.insert(2, None, &[0.0, 1.0]).unwrap();
        let (id, similarity) = lookup.nearest(&[0.6, 0.8]).unwrap().unwrap();
        assert_eq!(id, 2);
        assert!((similarity - 0.8).abs() < 1e-6);
        lookup.remove(&[evicted(2, None)]).unwrap();
        assert_eq!(
            lookup.nearest(&[0.6, 0.8]).unwrap().map(|(id, _)| id),
            Some(1)
        );
    }
}
