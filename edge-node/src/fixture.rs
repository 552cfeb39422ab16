//! A small edge over a real bundle, faiss indexes and the real exact searcher in process,
//! for the unit tests of retrieval and caches. Vectors are chosen by each test so that
//! which documents a query shares with a cached one is known in advance.

use display_full_error::DisplayFullErrorExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hasten_cloud_index::ExactSearcher;
use hasten_core::DocId;
use hasten_core::bundle::{CorpusBundle, write_bundle};
use hasten_core::corpus::Document;
use hasten_core::encoder::EncoderError;
use hasten_core::vector::dot;

use crate::caches::{Eviction, TenantCaches};
use crate::fallback::quic::{fallback_documents, fallback_request};
use crate::fallback::{CloudDocument, CloudError, CloudSearch};
use crate::has::{CacheChannel, DocumentStore, FuzzyChannel, ValidationRules, in_edge_share};
use crate::retrieval::{
    EngineSettings, Query, Retrieval, RetrievalEngine, RetrievalPolicy, RetrievalRequest,
};
use crate::tenants::Tenant;

pub const CORPUS_VERSION: &str = "fixture-v1";

/// The real exact searcher, in process, counting the fallbacks that reach it.
pub struct LocalCloud {
    searcher: ExactSearcher,
    calls: AtomicUsize,
}

impl LocalCloud {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl CloudSearch for LocalCloud {
    async fn search_batch(
        &self,
        queries: &[Vec<f32>],
        k: usize,
        _deadline: Option<Instant>,
    ) -> Result<Vec<Vec<CloudDocument>>, CloudError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let response = self
            .searcher
            .search(&fallback_request(queries, k, Duration::from_secs(1)))
            .map_err(|e| CloudError::Refused(e.to_string_full()))?;
        fallback_documents(response, queries.len())
    }

    async fn documents(&self, ids: &[DocId]) -> Result<Vec<CloudDocument>, CloudError> {
        let request = hasten_proto::v1::DocumentsRequest {
            ids: ids.to_vec(),
            include_vectors: true,
            include_texts: true,
            timeout_ms: 0,
        };
        let response = self
            .searcher
            .documents(&request)
            .map_err(|e| CloudError::Refused(e.to_string_full()))?;
        Ok(response
            .documents
            .into_iter()
            .map(CloudDocument::from)
            .collect())
    }
}

pub fn unit(v: Vec<f32>) -> Vec<f32> {
    let n = dot(&v, &v).sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// A unit vector along `axes` with the given weights, in `dimension` dimensions.
pub fn along(dimension: usize, axes: &[(usize, f32)]) -> Vec<f32> {
    let mut v = vec![0.0; dimension];
    for (axis, weight) in axes {
        v[*axis] += weight;
    }
    unit(v)
}

/// How the fixture's edge is set up.
pub struct Setup {
    pub policy: RetrievalPolicy,
    pub tau: f64,
    pub eviction: Eviction,
    pub depth: usize,
    pub tenants: Vec<Tenant>,
    pub fuzzy_in_validation: bool,
    pub fuzzy_in_draft: bool,
    pub validation: ValidationRules,
    pub draft_with_matched: bool,
    pub hybrid_similarity: Option<f32>,
    /// The edge's share of the corpus; the cloud holds all of it.
    pub corpus_fraction: f64,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            policy: RetrievalPolicy::Has,
            tau: 0.2,
            eviction: Eviction::Fifo(10),
            depth: 10,
            tenants: vec![Tenant::default_tenant()],
            fuzzy_in_validation: true,
            fuzzy_in_draft: true,
            validation: ValidationRules::default(),
            draft_with_matched: true,
            hybrid_similarity: None,
            corpus_fraction: 1.0,
        }
    }
}

pub struct Fixture {
    _dir: tempfile::TempDir,
    pub engine: RetrievalEngine<LocalCloud>,
    pub caches: Arc<TenantCaches>,
}

/// Documents with the given vectors (document i has id i and title `titles[i]`), an edge
/// over them set up by `setup`. Every channel sees every document: the fuzzy channel
/// returns the whole corpus, and the exact re-rank decides.
pub fn fixture(vectors: &[Vec<f32>], titles: &[String], setup: Setup) -> Fixture {
    let dimension = vectors[0].len();
    let docs: Vec<Document> = titles
        .iter()
        .enumerate()
        .map(|(i, title)| Document {
            id: i as u64,
            title: title.clone(),
            text: format!("{title} document {i}"),
        })
        .collect();
    let flat: Vec<f32> = vectors.iter().flatten().copied().collect();
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_bundle(&dir.path().join("b"), vec![], &docs, &flat, dimension, &[]).expect("bundle");
    let bundle = CorpusBundle::load(&dir.path().join("b")).expect("bundle loads");
    let fraction = setup.corpus_fraction;
    let share = CorpusBundle::load_share(&dir.path().join("b"), |id| in_edge_share(id, fraction))
        .expect("share loads");
    let documents = Arc::new(DocumentStore::from_bundle(&share));
    let fuzzy = FuzzyChannel::build(&documents, 1.0, Some(2), Some(2)).expect("fuzzy channel");
    let channel =
        CacheChannel::train(dimension, share.vectors(), Some(2), Some(2)).expect("cache channel");
    let caches = Arc::new(
        TenantCaches::new(
            setup.policy.lookup(setup.hybrid_similarity.is_some()),
            &setup.tenants,
            setup.eviction,
            &channel,
            documents,
            CORPUS_VERSION.into(),
            setup.depth,
        )
        .expect("caches"),
    );
    let cloud = LocalCloud {
        searcher: ExactSearcher::new(bundle).expect("searcher"),
        calls: AtomicUsize::new(0),
    };
    let settings = EngineSettings {
        policy: setup.policy,
        tau: setup.tau,
        fuzzy_candidates: docs.len(),
        cache_candidates: docs.len(),
        semantic_threshold: 0.95,
        fuzzy_in_validation: setup.fuzzy_in_validation,
        fuzzy_in_draft: setup.fuzzy_in_draft,
        validation: setup.validation,
        draft_with_matched: setup.draft_with_matched,
        hybrid_similarity: setup.hybrid_similarity,
    };
    let engine =
        RetrievalEngine::new(settings, Arc::clone(&caches), Some(fuzzy), cloud).expect("engine");
    Fixture {
        _dir: dir,
        engine,
        caches,
    }
}

/// `topics` well-separated topics of `per_topic` documents each, around the first
/// `topics` axes of `dimension`; returns the vectors, titles (`t<topic>`) and centres.
pub fn topics(
    topics: usize,
    per_topic: usize,
    dimension: usize,
) -> (Vec<Vec<f32>>, Vec<String>, Vec<Vec<f32>>) {
    let centres: Vec<Vec<f32>> = (0..topics).map(|t| along(dimension, &[(t, 1.0)])).collect();
    let mut vectors = Vec::new();
    let mut titles = Vec::new();
    for (t, centre) in centres.iter().enumerate() {
        for j in 0..per_topic {
            // A fixed spread over the spare axes: members differ, topics stay apart.
            let spare = topics + (j % (dimension - topics));
            let mut v = centre.clone();
            v[spare] += 0.1 + 0.02 * j as f32;
            vectors.push(unit(v));
            titles.push(format!("t{t}"));
        }
    }
    (vectors, titles, centres)
}

/// The encoder is never needed: tests ask with vectors, or texts only under policies that
/// answer before encoding.
pub fn no_encoder(_: &str) -> Result<Vec<f32>, EncoderError> {
    panic!("the test asked the encoder")
}

impl Fixture {
    /// Asks `tenant`'s `vector` at `k`.
    pub async fn ask(&self, tenant: &Tenant, vector: &[f32], k: usize) -> Retrieval {
        let request = RetrievalRequest {
            tenant: tenant.clone(),
            query: Query::Vector(vector.to_vec()),
            k,
            deadline: None,
            trace: false,
        };
        self.engine
            .retrieve(request, no_encoder)
            .await
            .expect("retrieval")
    }

    /// Asks `tenant`'s question `text`, which the encoder turns into `vector`.
    pub async fn ask_text(
        &self,
        tenant: &Tenant,
        text: &str,
        vector: &[f32],
        k: usize,
    ) -> Retrieval {
        let request = RetrievalRequest {
            tenant: tenant.clone(),
            query: Query::Text(text.into()),
            k,
            deadline: None,
            trace: false,
        };
        let encoded = vector.to_vec();
        self.engine
            .retrieve(request, move |_| Ok(encoded))
            .await
            .expect("retrieval")
    }

    pub fn calls(&self) -> usize {
        self.engine.cloud().calls()
    }

    /// (cached queries, cached documents) over all tenants.
    pub fn sizes(&self) -> (usize, usize) {
        let total = self.caches.total();
        (total.queries, total.documents)
    }
}
