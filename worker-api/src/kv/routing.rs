//! Which KV worker owns a chunk: rendezvous (highest random weight) hashing of the chunk id
//! against each worker's name. Every edge computes the same owner from the same list of
//! workers, with nothing to coordinate, and a worker joining takes over only the chunks it now
//! wins (about 1/(n+1) of them) while one leaving hands on only its own: each chunk's KV stays
//! hot in the memory of one worker instead of being loaded into all of them.

/// How a pool picks the worker for a request.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum KvRouting {
    /// The worker owning most of the request's chunks (rendezvous), then the next owners.
    #[default]
    KvAware,
    /// Each request starts at the next worker in turn.
    RoundRobin,
}

/// A stable 64-bit score of `chunk` on `worker` (FNV-1a over the name, then a splitmix64
/// finaliser over name hash and chunk): the same on every machine and build.
pub fn score(worker: &str, chunk: u64) -> u64 {
    let name = worker.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let mut x = name ^ chunk.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The index of the worker that owns `chunk` (highest score; ties to the lower index).
pub fn owner(workers: &[String], chunk: u64) -> Option<usize> {
    workers
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| score(a, chunk).cmp(&score(b, chunk)).then(j.cmp(i)))
        .map(|(i, _)| i)
}

/// The order in which a request over `chunks` tries the workers: the worker owning most of
/// them first (ties to the lower index), the others after it by the same count, so that a
/// worker that is down hands the request to the next-best owner.
pub fn route(workers: &[String], chunks: &[u64]) -> Vec<usize> {
    let mut owned = vec![0usize; workers.len()];
    for &chunk in chunks {
        if let Some(i) = owner(workers, chunk) {
            owned[i] += 1;
        }
    }
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by(|&a, &b| owned[b].cmp(&owned[a]).then(a.cmp(&b)));
    order
}
