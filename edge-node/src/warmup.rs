//! Warming a fresh edge's hot cache before it serves: questions read from a file are sent to
//! the cloud and their exact results cached, as fallbacks would be, whatever a draft would
//! have said. A new edge starts with yesterday's questions instead of an empty cache, and
//! the paper's ablation without the fuzzy channel in validation starts from a cache
//! pre-filled with random questions.

use display_full_error::DisplayFullErrorExt;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use futures::stream::{self, StreamExt};

use crate::fallback::CloudSearch;
use crate::retrieval::{EngineError, RetrievalEngine};
use crate::tenants::Tenant;

/// Fallbacks in flight at once while warming: enough to hide the cloud's round trip.
const WARM_CONCURRENCY: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum WarmupError {
    #[error("reading the warm queries from {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("none of the {attempted} warm queries could be cached; the last failure")]
    AllFailed {
        attempted: usize,
        #[source]
        source: EngineError,
    },
}

/// The questions of a warm-queries file: one per line, trimmed, blank lines and repeats
/// skipped, in file order.
pub fn read_warm_queries(path: &Path) -> Result<Vec<String>, WarmupError> {
    let text = std::fs::read_to_string(path).map_err(|source| WarmupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut seen = HashSet::new();
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && seen.insert(*line))
        .map(str::to_string)
        .collect())
}

/// What warming did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarmupReport {
    pub cached: usize,
    pub failed: usize,
}

/// Fetches each question's exact result from the cloud and caches it for `tenant`.
/// `vectors[i]` is `questions[i]` encoded. A failed question is logged and skipped; it is
/// an error only when every one fails (the cloud is unreachable, say).
pub async fn warm_cache<C: CloudSearch>(
    engine: &RetrievalEngine<C>,
    tenant: &Tenant,
    questions: Vec<String>,
    vectors: Vec<Vec<f32>>,
) -> Result<WarmupReport, WarmupError> {
    let attempted = questions.len();
    let mut report = WarmupReport::default();
    let mut last_error = None;
    let mut results = stream::iter(questions.into_iter().zip(vectors))
        .map(|(text, vector)| engine.cache_from_cloud(tenant.clone(), text, vector))
        .buffer_unordered(WARM_CONCURRENCY);
    while let Some(result) = results.next().await {
        match result {
            Ok(()) => report.cached += 1,
            Err(error) => {
                report.failed += 1;
                tracing::debug!(error = %error.display_full(), "a warm query was not cached");
                last_error = Some(error);
            }
        }
    }
    match last_error {
        Some(source) if report.cached == 0 => Err(WarmupError::AllFailed { attempted, source }),
        _ => Ok(report),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{Setup, fixture, topics};
    use crate::retrieval::Outcome;

    #[test]
    fn a_warm_file_yields_its_distinct_nonblank_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("warm.txt");
        std::fs::write(&path, "who wrote it?\n\n  where is it?  \nwho wrote it?\n").unwrap();
        assert_eq!(
            read_warm_queries(&path).unwrap(),
            ["who wrote it?", "where is it?"]
        );
        let missing = read_warm_queries(&dir.path().join("absent.txt")).unwrap_err();
        assert!(missing.to_string().contains("absent.txt"), "{missing}");
    }

    /// Warming caches every question through the cloud, even one a draft would accept
    /// (topic 0's sibling), and later questions are answered from what it cached.
    #[tokio::test]
    async fn warming_caches_every_question_and_later_drafts_use_them() {
        let (vectors, titles, centres) = topics(4, 12, 16);
        let edge = fixture(&vectors, &titles, Setup::default());
        let tenant = Tenant::default_tenant();
        let mut sibling = centres[0].clone();
        sibling[15] += 0.1;
        let sibling = crate::fixture::unit(sibling);
        let report = warm_cache(
            &edge.engine,
            &tenant,
            vec!["topic 0".into(), "topic 0 again".into(), "topic 2".into()],
            vec![centres[0].clone(), sibling, centres[2].clone()],
        )
        .await
        .unwrap();
        assert_eq!(
            report,
            WarmupReport {
                cached: 3,
                failed: 0
            }
        );
        assert_eq!(edge.calls(), 3);
        assert_eq!(edge.sizes().0, 3);
        let reply = edge.ask(&tenant, &centres[2], 4).await;
        assert_eq!(reply.outcome, Outcome::Accepted);
        assert_eq!(edge.calls(), 3);
    }
}
