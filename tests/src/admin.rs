//! Running `hasten-admin` against control-plane nodes, as an operator does.

// Test helpers fail the calling test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Output;

use hasten_eval::process::binary;
use serde_json::Value;

/// Runs `hasten-admin` against `nodes` with `args`, JSON output.
pub fn admin(nodes: &[&String], args: &[&str]) -> Output {
    let mut command = std::process::Command::new(binary("hasten-admin").unwrap());
    for node in nodes {
        command.args(["--control-plane", node]);
    }
    command
        .args(["--output", "json", "--timeout-s", "5"])
        .args(args)
        .output()
        .unwrap()
}

/// [`admin`], which must succeed: its JSON answer.
pub fn admin_json(nodes: &[&String], args: &[&str]) -> Value {
    let out = admin(nodes, args);
    assert!(
        out.status.success(),
        "hasten-admin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
