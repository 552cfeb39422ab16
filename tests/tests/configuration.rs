//! What each binary says about a configuration before it serves anything, as real
//! processes: `--print-config` refuses an invalid configuration (non-zero, naming the key)
//! instead of printing it, and a malformed tenants file is located without its tokens.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use loadtest::process::binary;

fn run(name: &str, args: &[&str]) -> Output {
    Command::new(binary(name).unwrap())
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

/// Runs `name args`, which must fail naming `key` on stderr and print nothing on stdout.
fn refused(name: &str, args: &[&str], key: &str) -> String {
    let output = run(name, args);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        !output.status.success(),
        "{name} {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(output.stdout.is_empty(), "{name} {args:?} printed a config");
    assert!(stderr.contains(key), "{name} {args:?}: {stderr}");
    stderr
}

#[test]
fn print_config_refuses_what_serving_would_refuse() {
    refused("cloud-index", &["serve", "--print-config"], "`bundle`");
    refused("cloud-index", &["route", "--print-config"], "`shards`");
    refused(
        "edge-node",
        &[
            "serve",
            "--print-config",
            "--bundle",
            "b",
            "--tenants-file",
            "t.toml",
        ],
        "metrics_addr",
    );
    refused(
        "control-plane",
        &["--print-config", "--id", "4", "--peer", "1=127.0.0.1:7400"],
        "peers",
    );
    // Without mutual TLS, a node reachable beyond loopback needs the shared token.
    refused(
        "control-plane",
        &[
            "--print-config",
            "--listen",
            "0.0.0.0:7400",
            "--peer",
            "1=10.0.0.1:7400",
        ],
        "auth_token_file",
    );
    // A valid configuration is printed, as JSON.
    let output = run("cloud-index", &["serve", "--print-config", "--bundle", "b"]);
    assert!(output.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed["bundle"], "b");
}

#[test]
fn a_malformed_tenants_file_is_located_without_echoing_its_tokens() {
    let dir = std::env::temp_dir().join(format!("hasten-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tenants.toml");
    let token = "leaked-token-0123456789abcdef";
    std::fs::write(&path, format!("[tenants]\nacme = [\"{token}\"\n")).unwrap();
    let path = path.display().to_string();
    let stderr = refused(
        "edge-node",
        &[
            "serve",
            "--tenants-file",
            &path,
            "--metrics-addr",
            "127.0.0.1:0",
            "--bundle",
            "no-such-bundle",
        ],
        "tenants.toml",
    );
    assert!(!stderr.contains(token), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
