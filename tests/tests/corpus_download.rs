//! `cloud-index build` with a corpus source given as a URL, as the chart's bootstrap takes
//! one (`corpus.bootstrap.args`): a real build process downloads a wiki18 JSON-lines export
//! from an HTTP server on loopback. The first attempt is cut off halfway (the server drops
//! the connection, as a killed pod or a broken link would): the build fails and keeps what
//! it had. Run again, it resumes with a range request for the rest only, and the bundle
//! holds every passage.

// A test fails by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::sync::{Arc, Mutex};

use hasten_eval::process::binary;
use hasten_tests::{model_dir, persistent_work_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const PASSAGES: usize = 40;

/// A wiki18 export: `id`, and `contents` with the title's line first.
fn export() -> Vec<u8> {
    (0..PASSAGES)
        .map(|i| {
            let line = serde_json::json!({
                "id": i.to_string(),
                "contents": format!("\"Town {i}\"\nTown {i} lies on river {} and has {} bridges.", i % 7, i * 3),
            });
            format!("{line}\n")
        })
        .collect::<String>()
        .into_bytes()
}

/// Serves `body` over HTTP/1.1, honouring `Range: bytes=N-`; the first whole-file request
/// gets only half of it before the connection drops. Records each request's range.
async fn serve(listener: TcpListener, body: Vec<u8>, ranges: Arc<Mutex<Vec<Option<u64>>>>) {
    let mut cut = true;
    loop {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let range = head
            .lines()
            .find_map(|l| l.strip_prefix("range: bytes="))
            .and_then(|r| r.trim().trim_end_matches('-').parse::<u64>().ok());
        ranges.lock().unwrap().push(range);
        let len = body.len();
        match range {
            Some(start) => {
                let start = start as usize;
                let reply = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{len}\r\nConnection: close\r\n\r\n",
                    len - start,
                    len - 1
                );
                socket.write_all(reply.as_bytes()).await.unwrap();
                socket.write_all(&body[start..]).await.unwrap();
            }
            None => {
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
                );
                socket.write_all(reply.as_bytes()).await.unwrap();
                let end = if cut { len / 2 } else { len };
                cut = false;
                socket.write_all(&body[..end]).await.unwrap();
            }
        }
        socket.shutdown().await.ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_download_resumes_and_the_bundle_holds_every_passage() {
    let work = persistent_work_dir("corpus-download").unwrap();
    let out = work.join("bundle");
    let downloads = work.join("downloads");
    for dir in [&out, &downloads] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let body = export();
    let half = (body.len() / 2) as u64;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/exports/passages.jsonl",
        listener.local_addr().unwrap()
    );
    let ranges = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(serve(listener, body, Arc::clone(&ranges)));

    let build = || {
        let (out, downloads, url) = (out.clone(), downloads.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            Command::new(binary("cloud-index").unwrap())
                .args(["build", "--wiki18", &url, "--out"])
                .arg(&out)
                .arg("--download-dir")
                .arg(&downloads)
                .arg("--model-dir")
                .arg(model_dir())
                .output()
                .unwrap()
        })
    };
    let cut = build().await.unwrap();
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert!(!cut.status.success(), "a cut download was built: {stderr}");
    assert!(stderr.contains("run again to resume"), "{stderr}");
    assert!(!out.exists(), "a bundle was written from half a download");

    let resumed = build().await.unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(
        *ranges.lock().unwrap(),
        vec![None, Some(half)],
        "the second attempt asks for the missing half only"
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["documents"], PASSAGES, "{manifest}");
}
