//! Tenants: who a request is for, from its bearer token.
//!
//! Each tenant has its own hot cache, so a draft is only ever validated by queries the same
//! tenant asked, and a fallback result is only ever served back to that tenant. Tokens come
//! from a TOML file (a Kubernetes Secret in production):
//!
//! ```toml
//! [tenants]
//! acme = ["token-one", "token-two"]   # several tokens allow rotation
//! globex = ["token-three"]
//! ```
//!
//! Only SHA-256 digests of the tokens are kept; a presented token's digest is compared with
//! every known digest in constant time, and no token reaches a log, an error or `Debug`.

use display_full_error::DisplayFullErrorExt;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hasten_proto::auth::{TokenDigest, bearer_token};
use serde::Deserialize;

/// The tenant of every request when the edge runs without a tenants file.
pub const DEFAULT_TENANT: &str = "default";

pub use hasten_proto::auth::MIN_TOKEN_CHARS;

/// A tenant's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    pub fn new(name: &str) -> Self {
        Self(Arc::from(name))
    }

    /// The tenant of an edge without tenants.
    pub fn default_tenant() -> Self {
        Self::new(DEFAULT_TENANT)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    #[error("tenants file {path}: {message}")]
    File { path: String, message: String },
}

/// Why a request was refused before retrieval.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("a bearer token is required (Authorization: Bearer <token>)")]
    Missing,
    #[error("the bearer token is not valid")]
    Invalid,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantsFile {
    tenants: BTreeMap<String, Vec<String>>,
}

/// Bearer tokens and the tenants they stand for; or, without a tenants file, one open tenant.
pub struct TenantDirectory {
    /// Token digests and their tenants; empty when the edge is open.
    tokens: Vec<(TokenDigest, Tenant)>,
    tenants: Vec<Tenant>,
}

impl std::fmt::Debug for TenantDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantDirectory")
            .field("tenants", &self.tenants)
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

/// Where a tenants file failed to parse, without the parser's message: that quotes the
/// offending line or value, which may be a token.
fn unreadable(text: &str, err: &toml::de::Error) -> String {
    let place = err
        .span()
        .map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}")
        })
        .unwrap_or_else(|| "somewhere".into());
    format!(
        "is not a valid tenants file at {place} (expected `[tenants]` then lines `name = [\"token\", ...]`; the line is not printed since it may hold a token)"
    )
}

impl TenantDirectory {
    /// No authentication: every request is [`DEFAULT_TENANT`]'s.
    pub fn open() -> Self {
        Self {
            tokens: Vec::new(),
            tenants: vec![Tenant::default_tenant()],
        }
    }

    /// Reads the tenants file at `path`.
    pub fn load(path: &Path) -> Result<Self, TenantsError> {
        let error = |message: String| TenantsError::File {
            path: path.display().to_string(),
            message,
        };
        if !path.exists() {
            return Err(error("does not exist".into()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string_full()))?;
        let file: TenantsFile = toml::from_str(&text).map_err(|e| error(unreadable(&text, &e)))?;
        Self::from_tokens(file.tenants).map_err(error)
    }

    fn from_tokens(tenants: BTreeMap<String, Vec<String>>) -> Result<Self, String> {
        if tenants.is_empty() {
            return Err("names no tenant".into());
        }
        let mut tokens: Vec<(TokenDigest, Tenant)> = Vec::new();
        let mut names = Vec::new();
        for (name, list) in tenants {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(format!(
                    "tenant name `{name}` must be letters, digits, `-`, `_` or `.` (it labels metrics)"
                ));
            }
            if list.is_empty() {
                return Err(format!("tenant `{name}` has no token"));
            }
            let tenant = Tenant::new(&name);
            for token in list {
                if token.chars().count() < MIN_TOKEN_CHARS {
                    return Err(format!(
                        "a token of tenant `{name}` is shorter than {MIN_TOKEN_CHARS} characters"
                    ));
                }
                let hashed = TokenDigest::of(&token);
                if let Some((_, owner)) = tokens.iter().find(|(known, _)| *known == hashed) {
                    return Err(format!("tenants `{owner}` and `{name}` share a token"));
                }
                tokens.push((hashed, tenant.clone()));
            }
            names.push(tenant);
        }
        Ok(Self {
            tokens,
            tenants: names,
        })
    }

    /// Whether requests must carry a token.
    pub fn requires_tokens(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Every tenant, in name order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// The tenant of a request with this `Authorization` header value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Tenant, AuthError> {
        if !self.requires_tokens() {
            return Ok(Tenant::default_tenant());
        }
        let token = authorization
            .and_then(bearer_token)
            .ok_or(AuthError::Missing)?;
        let presented = TokenDigest::of(token);
        // Every digest is compared, each in constant time, so the time taken says nothing
        // about which token (if any) matched or how much of it.
        let mut found = None;
        for (known, tenant) in &self.tokens {
            if known.matches(&presented) {
                found = Some(tenant);
            }
        }
        found.cloned().ok_or(AuthError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directory() -> TenantDirectory {
        TenantDirectory::from_tokens(BTreeMap::from([
            (
                "acme".to_string(),
                vec!["a".repeat(20), "rotated-acme-token".into()],
            ),
            ("globex".to_string(), vec!["g".repeat(20)]),
        ]))
        .unwrap()
    }

    #[test]
    fn a_token_names_its_tenant_and_anything_else_is_refused() {
        let tenants = directory();
        let bearer = |t: &str| format!("Bearer {t}");
        assert_eq!(
            tenants
                .authenticate(Some(&bearer(&"a".repeat(20))))
                .unwrap(),
            Tenant::new("acme")
        );
        assert_eq!(
            tenants
                .authenticate(Some("bearer rotated-acme-token"))
                .unwrap(),
            Tenant::new("acme")
        );
        assert_eq!(
            tenants
                .authenticate(Some(&bearer(&"g".repeat(20))))
                .unwrap(),
            Tenant::new("globex")
        );
        assert_eq!(tenants.authenticate(None), Err(AuthError::Missing));
        assert_eq!(
            tenants.authenticate(Some("Bearer ")),
            Err(AuthError::Missing)
        );
        assert_eq!(
            tenants.authenticate(Some(&format!("Basic {}", "a".repeat(20)))),
            Err(AuthError::Missing)
        );
        assert_eq!(
            tenants.authenticate(Some(&bearer(&"a".repeat(19)))),
            Err(AuthError::Invalid)
        );
        let open = TenantDirectory::open();
        assert_eq!(open.authenticate(None).unwrap(), Tenant::default_tenant());
    }

    #[test]
    fn bad_files_are_refused_with_a_reason_and_no_token_is_printed() {
        let short = TenantDirectory::from_tokens(BTreeMap::from([(
            "acme".to_string(),
            vec!["short".to_string()],
        )]));
        assert!(short.unwrap_err().contains("shorter than"));
        let shared = TenantDirectory::from_tokens(BTreeMap::from([
            ("acme".to_string(), vec!["s".repeat(20)]),
            ("globex".to_string(), vec!["s".repeat(20)]),
        ]));
        let message = shared.unwrap_err();
        assert!(message.contains("share a token") && !message.contains(&"s".repeat(20)));
        let label = TenantDirectory::from_tokens(BTreeMap::from([(
            "a b".to_string(),
            vec!["x".repeat(20)],
        )]));
        assert!(label.unwrap_err().contains("`a b`"));
        let printed = format!("{:?}", directory());
        assert!(!printed.contains(&"a".repeat(20)) && printed.contains("acme"));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        std::fs::write(
            &path,
            format!("[tenants]\nacme = [\"{}\"]\n", "k".repeat(20)),
        )
        .unwrap();
        let loaded = TenantDirectory::load(&path).unwrap();
        assert_eq!(loaded.tenants(), &[Tenant::new("acme")]);
        let missing = TenantDirectory::load(&dir.path().join("nope.toml")).unwrap_err();
        assert!(missing.to_string().contains("nope.toml"));
    }

    #[test]
    fn a_malformed_file_is_located_without_echoing_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenants.toml");
        let secret = "s3cret-token-value-1234";
        for (text, place) in [
            (format!("[tenants]\nacme = [\"{secret}\"\n"), "line 3"),
            (format!("[tenants]\nacme = \"{secret}\"\n"), "line 2"),
            (format!("[tenants]\nacme = [{secret}]\n"), "line 2"),
        ] {
            std::fs::write(&path, &text).unwrap();
            let message = TenantDirectory::load(&path).unwrap_err().to_string_full();
            assert!(!message.contains("s3cret"), "{text:?} echoed: {message}");
            assert!(message.contains(place), "{text:?}: {message}");
        }
    }
}
