//! A shared bearer token for the control plane's gRPC services, for deployments without
//! mutual TLS: every node, edge and router holds the same secret (a Kubernetes Secret), sends
//! it as `authorization: Bearer <token>` and the nodes refuse a call without it
//! (UNAUTHENTICATED). Without either, any client that reaches a node could read every cached
//! query (Subscribe), set tau fleet-wide or insert entries into users' replies (Propose).
//!
//! Only a SHA-256 digest is kept for checking, compared in constant time; the token reaches
//! no log, error or `Debug`. The edge's tenant tokens use the same parsing and digests
//! ([`bearer_token`], [`TokenDigest`]).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// Shortest token accepted: 16 characters of a random alphabet are beyond guessing, and a
/// short one is usually a placeholder.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The token of an `Authorization` value `Bearer <token>` (the scheme in any case); `None`
/// for another scheme or an empty token.
pub fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What is kept of a token: its SHA-256 digest.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TokenDigest([u8; 32]);

impl TokenDigest {
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    /// Whether both are the digest of one token, in time that does not depend on where they
    /// differ.
    pub fn matches(&self, other: &Self) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

const AUTHORIZATION: &str = "authorization";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("reading the token file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the token in {path} must be at least {MIN_TOKEN_CHARS} printable ASCII characters without spaces"
    )]
    Weak { path: PathBuf },
}

/// The control plane's shared token.
#[derive(Clone)]
pub struct AccessToken {
    header: MetadataValue<Ascii>,
    digest: TokenDigest,
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(..)")
    }
}

impl AccessToken {
    /// Reads the token from `path` (surrounding whitespace, such as a final newline, is
    /// not part of it).
    pub fn load(path: &Path) -> Result<Self, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(text.trim()).ok_or_else(|| TokenError::Weak {
            path: path.to_path_buf(),
        })
    }

    /// `token`, when it is strong enough to be one.
    pub fn new(token: &str) -> Option<Self> {
        let printable = token.chars().all(|c| c.is_ascii_graphic());
        if token.len() < MIN_TOKEN_CHARS || !printable {
            return None;
        }
        let header = format!("Bearer {token}").parse().ok()?;
        Some(Self {
            header,
            digest: TokenDigest::of(token),
        })
    }
}

/// Client side: adds the token, when there is one, to every request.
#[derive(Clone, Debug, Default)]
pub struct BearerToken(Option<AccessToken>);

impl BearerToken {
    pub fn new(token: Option<AccessToken>) -> Self {
        Self(token)
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, token.header.clone());
        }
        Ok(request)
    }
}

/// Server side: with a token, refuses every request that does not carry it.
#[derive(Clone, Debug, Default)]
pub struct RequireToken(Option<AccessToken>);

impl RequireToken {
    pub fn new(token: Option<AccessToken>) -> Self {
        Self(token)
    }
}

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(bearer_token);
        let Some(presented) = presented else {
            return Err(Status::unauthenticated(
                "this control plane requires its token (authorization: Bearer <token>)",
            ));
        };
        if TokenDigest::of(presented).matches(&token.digest) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("the token is not valid"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use display_full_error::DisplayFullErrorExt;

    fn token(text: &str) -> AccessToken {
        AccessToken::new(text).unwrap()
    }

    #[test]
    fn a_server_with_a_token_admits_only_requests_that_carry_it() {
        let mut server = RequireToken::new(Some(token("the-shared-token-0001")));
        let sent =
            |client: Option<AccessToken>| BearerToken::new(client).call(Request::new(())).unwrap();
        assert!(
            server
                .call(sent(Some(token("the-shared-token-0001"))))
                .is_ok()
        );
        for refused in [None, Some(token("another-token-000001"))] {
            let status = server.call(sent(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        // Without a token of its own the server admits anyone (mutual TLS or loopback).
        assert!(RequireToken::default().call(sent(None)).is_ok());
    }

    #[test]
    fn weak_tokens_are_refused_and_none_is_printed() {
        assert!(AccessToken::new("short").is_none());
        assert!(AccessToken::new("has a space in it 0123").is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "a-token-read-from-a-file\n").unwrap();
        let loaded = AccessToken::load(&path).unwrap();
        assert!(!format!("{loaded:?}").contains("a-token"));
        std::fs::write(&path, "weak\n").unwrap();
        let err = AccessToken::load(&path).unwrap_err().to_string_full();
        assert!(err.contains("token") && !err.contains("weak"), "{err}");
    }
}
