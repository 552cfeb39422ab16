//! What each binary says about a configuration before it serves anything, as real
//! processes: `--print-config` refuses an invalid configuration (non-zero, naming the key)
//! instead of printing it, a malformed tenants file is located without its tokens, and a
//! failure's causes are printed once each.

// A test fails by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

use hasten_eval::process::binary;

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

/// An error's message leaves its source to the chain, which the binary prints as "Caused
/// by:" lines: each cause once. (Before errors kept to that, this printed the OS error twice:
/// `0: DIR/manifest.json: No such file or directory`, then `1: No such file or directory`.)
#[test]
fn a_failure_prints_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("absent-bundle");
    let output = run(
        "cloud-index",
        &[
            "serve",
            "--bundle",
            absent.to_str().unwrap(),
            "--grpc-addr",
            "127.0.0.1:0",
            "--quic-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let chain = &stderr[stderr.find("Error: ").expect("an error chain")..];
    assert!(chain.contains("manifest.json"), "{chain}");
    assert_eq!(chain.matches("No such file").count(), 1, "{chain}");
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

/// The four configurations the chart renders: the binary and subcommand, the values key
/// whose `config` table holds its keys, and the keys a valid file needs besides.
const CHART_CONFIGS: [(&str, &[&str], &str, &str); 4] = [
    ("edge-node", &["serve"], "edge", "bundle = \"b\"\n"),
    ("cloud-index", &["serve"], "shard", "bundle = \"b\"\n"),
    (
        "cloud-index",
        &["route"],
        "router",
        "shards = [[\"127.0.0.1:7101\"]]\n",
    ),
    (
        "control-plane",
        &[],
        "control-plane",
        "id = 1\npeers = [\"1=127.0.0.1:7400\"]\n",
    ),
];

fn config_schema(name: &str, command: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = command
        .iter()
        .copied()
        .chain(["--print-config-schema"])
        .collect();
    let output = run(name, &args);
    assert!(output.status.success(), "{name} {args:?}: {output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Every numeric bound of a schema, as (dotted key, value just outside it).
fn values_outside_bounds(
    schema: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<(String, serde_json::Value)>,
) {
    let Some(properties) = schema["properties"].as_object() else {
        return;
    };
    for (key, property) in properties {
        let path = format!("{prefix}{key}");
        let integer = property["type"] == "integer"
            || property["type"]
                .as_array()
                .is_some_and(|types| types.iter().any(|t| t == "integer"));
        let step = if integer { 1.0 } else { 0.5 };
        let outside = |bound: f64, below: bool| {
            let value = if below { bound - step } else { bound + step };
            if integer {
                serde_json::json!(value as i64)
            } else {
                serde_json::json!(value)
            }
        };
        // `minimum: 0` of an unsigned integer only restates its type.
        if let Some(min) = property["minimum"].as_f64()
            && !(integer && min == 0.0)
        {
            out.push((path.clone(), outside(min, true)));
        }
        if let Some(max) = property["maximum"].as_f64() {
            out.push((path.clone(), outside(max, false)));
        }
        if let Some(min) = property["exclusiveMinimum"].as_f64() {
            out.push((path.clone(), serde_json::json!(min)));
        }
        values_outside_bounds(property, &format!("{path}."), out);
    }
}

/// Whether `text` holds `word` with no key character on either side.
fn names_key(text: &str, word: &str) -> bool {
    let is_key_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_key_char) && !after.is_some_and(is_key_char)
    })
}

/// A value the chart's schema refuses at `helm install` must be one the binary refuses at
/// start, or the schema would turn away a working configuration: each bound of each
/// `--print-config-schema` is crossed in a file, which `--print-config` must refuse naming
/// the key.
#[test]
fn every_schema_bound_is_one_the_binary_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (name, command, _, base) in CHART_CONFIGS {
        let mut outside = Vec::new();
        values_outside_bounds(&config_schema(name, command), "", &mut outside);
        assert!(!outside.is_empty(), "{name} {command:?}: no bounds");
        for (path, value) in outside {
            let (table, key) = match path.rsplit_once('.') {
                Some((table, key)) => (Some(table), key),
                None => (None, path.as_str()),
            };
            let text = match table {
                Some(table) => format!("{base}[{table}]\n{key} = {value}\n"),
                None => format!("{base}{key} = {value}\n"),
            };
            let file = dir.path().join("config.toml");
            std::fs::write(&file, &text).unwrap();
            let file = file.to_str().unwrap();
            let args: Vec<&str> = command
                .iter()
                .copied()
                .chain(["--config", file, "--print-config"])
                .collect();
            let output = run(name, &args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success(),
                "{name} {command:?} accepts {path} = {value}, which its schema refuses"
            );
            assert!(
                names_key(&stderr, key),
                "{name} {command:?} refused {path} = {value} without naming it: {stderr}"
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} bounds checked");
}

/// Every binary's configuration schema, as the binary prints it, is in docs/config-schemas/
/// (`make config-schemas` writes them; the chart's values schema embeds four and the
/// configuration reference is made from all).
#[test]
fn the_committed_config_schemas_are_the_binaries() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config-schemas");
    let others: [(&str, &[&str], &str); 4] = [
        ("kv-worker", &["serve"], "kv-worker"),
        ("lm-worker", &["serve"], "lm-worker"),
        ("kv-operator", &["run"], "kv-operator"),
        ("hasten-admin", &[], "admin"),
    ];
    let chart = CHART_CONFIGS.map(|(name, command, file, _)| (name, command, file));
    for (name, command, file) in chart.into_iter().chain(others) {
        let path = dir.join(format!("{file}.json"));
        let committed: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(
            committed == config_schema(name, command),
            "{} differs from `{name} {} --print-config-schema`: run `make config-schemas`",
            path.display(),
            command.join(" ")
        );
    }
}

/// The flags' help of `name command`, as `--help` prints it: each flag's name and its help
/// text joined into one line.
fn flag_helps(name: &str, command: &[&str]) -> Vec<(String, String)> {
    let args: Vec<&str> = command.iter().copied().chain(["--help"]).collect();
    let output = run(name, &args);
    assert!(output.status.success(), "{name} {args:?}: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let mut flags: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        let flag = trimmed
            .strip_prefix("-")
            .and_then(|rest| rest.split_once("--").map(|(_, long)| long))
            .or_else(|| trimmed.strip_prefix("--"));
        match flag {
            Some(long) if line.starts_with("  ") && !line.starts_with("          ") => {
                let name = long.split([' ', '=']).next().unwrap_or_default();
                flags.push((name.to_string(), String::new()));
            }
            _ => {
                if let Some((_, help)) = flags.last_mut() {
                    help.push(' ');
                    help.push_str(trimmed);
                }
            }
        }
    }
    flags
}

/// Each flag that sets a configuration key shows that key's default, as the binary's own
/// schema has it, once: defaults are written in the config type alone, and the help is
/// generated from it (a default written by hand in a flag's help drifted from the type's).
#[test]
fn every_flag_shows_its_keys_default_once() {
    let others: [(&str, &[&str]); 4] = [
        ("kv-worker", &["serve"]),
        ("lm-worker", &["serve"]),
        ("kv-operator", &["run"]),
        ("hasten-admin", &[]),
    ];
    let chart = CHART_CONFIGS.map(|(name, command, _, _)| (name, command));
    for (name, command) in chart.into_iter().chain(others) {
        let schema = config_schema(name, command);
        let helps = flag_helps(name, command);
        for (flag, help) in &helps {
            assert!(
                help.matches("[default:").count() <= 1,
                "{name} {command:?} --{flag} shows two defaults: {help}"
            );
        }
        // Each key with the flags that may set it: its own name, and for a key of a table
        // also the table's name before it (`cloud.addr`: `--cloud-addr`).
        let mut keys: Vec<(Vec<String>, serde_json::Value)> = Vec::new();
        for (key, property) in schema["properties"].as_object().unwrap() {
            match property.get("properties") {
                Some(table) => keys.extend(table.as_object().unwrap().iter().map(|(k, p)| {
                    (
                        vec![k.replace('_', "-"), format!("{key}_{k}").replace('_', "-")],
                        p.get("default").cloned().unwrap_or_default(),
                    )
                })),
                None => keys.push((
                    vec![key.replace('_', "-")],
                    property.get("default").cloned().unwrap_or_default(),
                )),
            }
        }
        let mut checked = 0;
        for (flags, default) in keys {
            let Some((flag, help)) = helps.iter().find(|(f, _)| flags.contains(f)) else {
                continue;
            };
            let shown = help
                .split("[default: ")
                .nth(1)
                .and_then(|rest| rest.split(']').next());
            let matches = match (&default, shown) {
                (serde_json::Value::Number(n), Some(shown)) => shown
                    .parse::<f64>()
                    .is_ok_and(|s| (s - n.as_f64().unwrap()).abs() <= 1e-6 * s.abs().max(1.0)),
                (serde_json::Value::String(s), Some(shown)) => s == shown,
                (serde_json::Value::Bool(b), Some(shown)) => b.to_string() == shown,
                // No value by default, a list or a table: the help says it in words.
                _ => continue,
            };
            assert!(
                matches,
                "{name} {command:?} --{flag}: help shows {shown:?}, the type's default is {default}"
            );
            checked += 1;
        }
        assert!(checked > 0, "{name} {command:?}: no flag shows a default");
    }
}
