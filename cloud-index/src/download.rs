//! Corpus sources given to `cloud-index build` as HTTP(S) URLs instead of files: each is
//! downloaded into a directory beside the bundle before the build reads it. A download
//! interrupted (the pod killed, the connection cut) resumes where it stopped with an HTTP
//! range request, and a finished one is not fetched again, so a bootstrap that is run again
//! picks up where it was.

use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// Progress is logged every this many bytes.
const PROGRESS_EVERY: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error("downloading {url}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url} answered HTTP {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("writing {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{url} ended after {got} of its {expected} bytes (run again to resume)")]
    Truncated {
        url: String,
        got: u64,
        expected: u64,
    },
    #[error("{url} was cut off after {got} bytes (run again to resume)")]
    Interrupted {
        url: String,
        got: u64,
        #[source]
        source: reqwest::Error,
    },
}

/// Whether a source names an HTTP(S) URL rather than a file.
pub fn is_url(source: &Path) -> bool {
    source
        .to_str()
        .is_some_and(|s| s.starts_with("http://") || s.starts_with("https://"))
}

/// Replaces every URL among `sources` by the file it is downloaded to in `dir`.
pub async fn localize(sources: &mut [PathBuf], dir: &Path) -> Result<(), DownloadError> {
    let client = reqwest::Client::new();
    for source in sources.iter_mut().filter(|s| is_url(s)) {
        let url = source.to_string_lossy().into_owned();
        *source = download(&client, &url, dir).await?;
    }
    Ok(())
}

/// The file a URL is downloaded to: its last path segment (for the loaders' extensions, such
/// as `.gz`) after a digest of the whole URL (two URLs ending alike do not collide).
fn local_name(url: &str) -> String {
    let digest = hex::encode(&Sha256::digest(url.as_bytes())[..6]);
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let last: String = path
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{digest}-{last}")
}

async fn download(
    client: &reqwest::Client,
    url: &str,
    dir: &Path,
) -> Result<PathBuf, DownloadError> {
    let target = dir.join(local_name(url));
    if target.exists() {
        tracing::info!(%url, path = %target.display(), "already downloaded");
        return Ok(target);
    }
    let partial = dir.join(format!("{}.part", local_name(url)));
    let write_error = |path: &Path| {
        let path = path.display().to_string();
        move |source| DownloadError::Write { path, source }
    };
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(write_error(dir))?;
    let mut have = tokio::fs::metadata(&partial)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    let http_error = |source| DownloadError::Http {
        url: url.to_string(),
        source,
    };
    let mut request = client.get(url);
    if have > 0 {
        request = request.header(reqwest::header::RANGE, format!("bytes={have}-"));
    }
    let mut response = request.send().await.map_err(http_error)?;
    let status = response.status();
    let resumed = have > 0 && status == reqwest::StatusCode::PARTIAL_CONTENT;
    if !resumed {
        if status != reqwest::StatusCode::OK {
            return Err(DownloadError::Status {
                url: url.to_string(),
                status,
            });
        }
        // A server that ignores ranges sends the whole file again.
        have = 0;
    }
    let expected = response.content_length().map(|rest| have + rest);
    tracing::info!(%url, resumed_at = have, bytes = ?expected, "downloading");
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(resumed)
        .truncate(!resumed)
        .open(&partial)
        .await
        .map_err(write_error(&partial))?;
    let (started, mut got, mut logged) = (Instant::now(), have, have);
    // Every chunk is written as it comes, so that an interrupted download keeps it.
    let body = async {
        loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(source) => {
                    return Err(DownloadError::Interrupted {
                        url: url.to_string(),
                        got,
                        source,
                    });
                }
            };
            file.write_all(&chunk)
                .await
                .map_err(write_error(&partial))?;
            got += chunk.len() as u64;
            if got - logged >= PROGRESS_EVERY {
                logged = got;
                tracing::info!(%url, bytes = got, of = ?expected, "downloading");
            }
        }
        Ok::<(), DownloadError>(())
    };
    let outcome = body.await;
    file.flush().await.map_err(write_error(&partial))?;
    file.sync_all().await.map_err(write_error(&partial))?;
    outcome?;
    if let Some(expected) = expected
        && got != expected
    {
        return Err(DownloadError::Truncated {
            url: url.to_string(),
            got,
            expected,
        });
    }
    tokio::fs::rename(&partial, &target)
        .await
        .map_err(write_error(&target))?;
    tracing::info!(
        %url,
        bytes = got,
        seconds = format!("{:.1}", started.elapsed().as_secs_f64()),
        "downloaded"
    );
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_from_files_and_named_apart() {
        assert!(is_url(Path::new("https://example.com/a/passages.jsonl.gz")));
        assert!(!is_url(Path::new("/data/passages.jsonl")));
        let name = local_name("https://example.com/a/passages.jsonl.gz?sig=1");
        assert!(name.ends_with("-passages.jsonl.gz"), "{name}");
        assert_ne!(name, local_name("https://example.org/b/passages.jsonl.gz"));
    }
}
