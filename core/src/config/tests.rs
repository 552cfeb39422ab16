use super::*;
use display_full_error::DisplayFullErrorExt;

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
struct Sample {
    tau: f64,
    capacity: usize,
    name: String,
}

#[derive(Serialize)]
struct Flags {
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<usize>,
}

#[derive(Serialize)]
struct HelpSample {
    threshold: f32,
    peers: Vec<String>,
    limit: Option<u32>,
    server: HelpServer,
    batching: HelpBatching,
}

#[derive(Serialize)]
struct HelpServer {
    addr: String,
    workers: u32,
}

#[derive(Serialize)]
struct HelpBatching {
    workers: u32,
    window_ms: u64,
}

impl Default for HelpSample {
    fn default() -> Self {
        Self {
            threshold: 0.9,
            peers: vec!["a:1".into(), "b:2".into()],
            limit: None,
            server: HelpServer {
                addr: "127.0.0.1:7000".into(),
                workers: 2,
            },
            batching: HelpBatching {
                workers: 4,
                window_ms: 5,
            },
        }
    }
}

#[test]
fn help_shows_each_keys_default_from_the_type() {
    let command = clap::Command::new("t").args([
        clap::Arg::new("threshold")
            .long("threshold")
            .help("Reuse above this"),
        clap::Arg::new("peers").long("peers").help("Peers"),
        clap::Arg::new("limit")
            .long("limit")
            .help("Limit [default: none]"),
        clap::Arg::new("addr")
            .long("addr")
            .help("Address")
            .long_help("Address.\n\nWhere it listens."),
        clap::Arg::new("window_ms").long("window-ms").help("Window"),
        clap::Arg::new("workers").long("workers").help("Workers"),
        clap::Arg::new("other").long("other").help("Not a key"),
        clap::Arg::new("batching.workers")
            .long("batch-workers")
            .help("Batch workers"),
    ]);
    let command = help_with_defaults::<HelpSample>(command);
    let help = |id: &str| {
        let arg = command.get_arguments().find(|a| a.get_id() == id).unwrap();
        (
            arg.get_help().unwrap().to_string(),
            arg.get_long_help().map(ToString::to_string),
        )
    };
    // An f32 prints as written, not as its f64 widening.
    assert_eq!(help("threshold").0, "Reuse above this [default: 0.9]");
    assert_eq!(help("peers").0, "Peers [default: a:1,b:2]");
    // No value by default: the help says what absence means.
    assert_eq!(help("limit").0, "Limit [default: none]");
    // A key of one table, in the short and the long help.
    assert_eq!(help("addr").0, "Address [default: 127.0.0.1:7000]");
    assert!(
        help("addr")
            .1
            .unwrap()
            .ends_with("listens. [default: 127.0.0.1:7000]")
    );
    assert_eq!(help("window_ms").0, "Window [default: 5]");
    // In two tables: which one the flag sets is not the help's to guess.
    assert_eq!(help("workers").0, "Workers");
    assert_eq!(help("other").0, "Not a key");
    // A dotted id names its table, even where the key is in two.
    assert_eq!(help("batching.workers").0, "Batch workers [default: 4]");
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
fn flags_override_env_override_file_override_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "tau = 0.5\ncapacity = 3\nname = \"file\"\n").unwrap();
    figment::Jail::expect_with(|jail| {
        jail.set_env("HASTEN_TEST_NAME", "env");
        let got: Sample = load_config(
            Some(&file),
            "HASTEN_TEST_",
            &Flags { capacity: Some(9) },
            &[],
        )
        .unwrap();
        assert_eq!(
            got,
            Sample {
                tau: 0.5,
                capacity: 9,
                name: "env".into()
            }
        );
        let unset: Sample =
            load_config(None, "HASTEN_TEST_", &Flags { capacity: None }, &[]).unwrap();
        assert_eq!(unset.capacity, 0);
        Ok(())
    });
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(default, deny_unknown_fields)]
struct WithTls {
    capacity: usize,
    #[serde(flatten)]
    tls: TlsConfig,
}

#[derive(Serialize)]
struct TlsFlags {
    #[serde(flatten)]
    tls: TlsConfig,
}

#[test]
fn tls_keys_stay_at_the_top_level_and_unknown_keys_are_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "capacity = 3\ntls_ca = \"ca.pem\"\ntls_cert = \"c.pem\"\n",
    )
    .unwrap();
    let flags = TlsFlags {
        tls: TlsConfig {
            tls_key: Some("k.pem".into()),
            ..TlsConfig::default()
        },
    };
    let got: WithTls = load_config(Some(&file), "HASTEN_TLS_TEST_", &flags, &[]).unwrap();
    assert_eq!(got.capacity, 3);
    let paths = got.tls.mutual_tls().unwrap().unwrap();
    assert_eq!(
        (paths.ca, paths.cert, paths.key),
        ("ca.pem".into(), "c.pem".into(), "k.pem".into())
    );

    std::fs::write(&file, "capacity = 3\ntls_cerrt = \"c.pem\"\n").unwrap();
    let refused = load_config::<WithTls, _>(Some(&file), "HASTEN_TLS_TEST_", &flags, &[])
        .unwrap_err()
        .to_string_full();
    assert!(refused.contains("tls_cerrt"), "{refused}");

    let schema = serde_json::to_value(config_schema::<WithTls>()).unwrap();
    for key in ["capacity", "tls_ca", "tls_cert", "tls_key", "tls_extra_ca"] {
        assert!(schema["properties"][key].is_object(), "{key}: {schema}");
    }
    assert_eq!(schema["additionalProperties"], false, "{schema}");
}

#[test]
fn half_a_tls_configuration_names_its_key() {
    let half = TlsConfig {
        tls_cert: Some("c.pem".into()),
        ..TlsConfig::default()
    };
    assert!(matches!(
        half.mutual_tls(),
        Err(ConfigError::Invalid { key: "tls_ca", .. })
    ));
    assert_eq!(TlsConfig::default().mutual_tls().unwrap(), None);
}

#[test]
fn loading_mutual_tls_names_the_files_that_failed() {
    assert!(TlsConfig::default().load_mutual().unwrap().is_none());
    let missing = TlsConfig {
        tls_ca: Some("/nonexistent/ca.pem".into()),
        tls_cert: Some("/nonexistent/c.pem".into()),
        tls_key: Some("/nonexistent/k.pem".into()),
        tls_extra_ca: None,
    };
    let error = missing.load_mutual().unwrap_err();
    assert!(matches!(error, MutualTlsError::Load(_)), "{error:?}");
    assert!(
        error.to_string_full().contains("/nonexistent/"),
        "{}",
        error.to_string_full()
    );
    let half = TlsConfig {
        tls_cert: None,
        ..missing
    };
    assert!(matches!(
        half.load_mutual(),
        Err(MutualTlsError::Config(ConfigError::Invalid {
            key: "tls_ca",
            ..
        }))
    ));
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Nested {
    cloud_timeout_ms: u64,
    server: Server,
}

#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
struct Server {
    quic_addr: String,
    max_in_flight: usize,
}

#[derive(Serialize)]
struct NestedFlags {
    server: ServerFlags,
}

#[derive(Serialize)]
struct ServerFlags {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_in_flight: Option<usize>,
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
fn a_double_underscore_reaches_into_a_table_and_single_ones_stay_in_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[server]\nquic_addr = \"file\"\nmax_in_flight = 3\n").unwrap();
    figment::Jail::expect_with(|jail| {
        jail.set_env("HASTEN_TEST_SERVER__QUIC_ADDR", "env");
        jail.set_env("HASTEN_TEST_CLOUD_TIMEOUT_MS", "1500");
        let flags = NestedFlags {
            server: ServerFlags {
                max_in_flight: Some(9),
            },
        };
        let got: Nested = load_config(Some(&file), "HASTEN_TEST_", &flags, &[]).unwrap();
        assert_eq!(
            got,
            Nested {
                cloud_timeout_ms: 1500,
                server: Server {
                    quic_addr: "env".into(),
                    max_in_flight: 9,
                },
            }
        );
        let unset = NestedFlags {
            server: ServerFlags {
                max_in_flight: None,
            },
        };
        let from_file: Nested = load_config(Some(&file), "HASTEN_NONE_", &unset, &[]).unwrap();
        assert_eq!(
            from_file.server.max_in_flight, 3,
            "an empty flag table keeps the file's keys"
        );
        Ok(())
    });
}

#[test]
fn a_bad_value_names_its_key_and_a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "capacity = \"many\"\n").unwrap();
    let err = load_config::<Sample, _>(Some(&file), "HASTEN_NONE_", &Flags { capacity: None }, &[])
        .unwrap_err()
        .to_string_full();
    assert!(err.contains("capacity"), "{err}");
    let missing = dir.path().join("absent.toml");
    assert!(matches!(
        load_config::<Sample, _>(
            Some(&missing),
            "HASTEN_NONE_",
            &Flags { capacity: None },
            &[]
        ),
        Err(ConfigError::MissingFile(_))
    ));
}

#[test]
#[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
fn a_set_key_wins_over_flags_and_reaches_into_tables() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[server]\nquic_addr = \"file\"\nmax_in_flight = 3\n").unwrap();
    figment::Jail::expect_with(|jail| {
        jail.set_env("HASTEN_TEST_CLOUD_TIMEOUT_MS", "1500");
        let flags = NestedFlags {
            server: ServerFlags {
                max_in_flight: Some(9),
            },
        };
        let settings = [
            "server.max_in_flight=12",
            "cloud_timeout_ms=250",
            "server.quic_addr=[::1]:1",
        ]
        .map(|text| parse_setting(text).unwrap());
        let got: Nested = load_config(Some(&file), "HASTEN_TEST_", &flags, &settings).unwrap();
        assert_eq!(
            got,
            Nested {
                cloud_timeout_ms: 250,
                server: Server {
                    quic_addr: "[::1]:1".into(),
                    max_in_flight: 12,
                },
            }
        );
        let unknown = [parse_setting("server.max_inflight=1").unwrap()];
        let error = load_config::<Nested, _>(None, "HASTEN_NONE_", &flags, &unknown)
            .unwrap_err()
            .to_string_full();
        assert!(error.contains("max_inflight"), "{error}");
        Ok(())
    });
    for bad in ["tau", "=1", "retrieval..tau=1", "a b=1"] {
        assert!(parse_setting(bad).is_err(), "{bad}");
    }
    assert_eq!(
        parse_setting("retrieval.tau=0.2")
            .unwrap()
            .value
            .to_num()
            .and_then(|n| n.to_f64()),
        Some(0.2)
    );
}
