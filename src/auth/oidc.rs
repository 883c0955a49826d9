//! OpenID Connect bearer tokens: JWTs an identity provider signs, checked against the keys it publishes, whose
//! groups map to roles.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::{AuthError, Principal, Role, SignIn};

/// How far `exp` and `nbf` may be off, for clocks that differ a little.
const LEEWAY: Duration = Duration::from_secs(60);
/// The least time between two fetches of the provider's keys that a token asks for: a stream of tokens with
/// unknown `kid`s makes one fetch per interval, not one each.
const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// How old the cached keys may grow before the next token has them fetched again, so that a key the provider
/// withdrew stops working without a token naming a new one.
const KEYS_MAX_AGE: Duration = Duration::from_secs(15 * 60);
/// How long a fetch from the provider may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery document or key set read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// The groups that give each role.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoleGroups {
    pub admin: Vec<String>,
    pub approver: Vec<String>,
    pub agent: Vec<String>,
}

impl RoleGroups {
    /// The highest role any of `groups` gives.
    fn role_of<'a>(&self, groups: impl Iterator<Item = &'a str> + Clone) -> Option<Role> {
        [
            (Role::Admin, &self.admin),
            (Role::Approver, &self.approver),
            (Role::Agent, &self.agent),
        ]
        .into_iter()
        .find(|(_, mapped)| groups.clone().any(|group| mapped.iter().any(|name| name == group)))
        .map(|(role, _)| role)
    }
}

/// What the gateway is told about its identity provider.
#[derive(Debug, Clone)]
pub struct OidcSettings {
    /// The issuer URL, exactly as its tokens' `iss` and its discovery document name it.
    pub issuer: String,
    /// What a token's `aud` must contain.
    pub audience: String,
    /// The claim that names a person; `preferred_username`, then `email`, then `sub` when unset.
    pub name_claim: Option<String>,
    /// The claim that lists a token's groups.
    pub groups_claim: String,
    pub roles: RoleGroups,
    /// The inbox's client at the provider, when the inbox signs in there by itself.
    pub ui: Option<InboxClient>,
}

/// The inbox as a client of the provider: a public one, which signs in with the authorization-code flow and
/// PKCE.
#[derive(Debug, Clone)]
pub struct InboxClient {
    pub client_id: String,
    /// The scopes it asks for, space-separated.
    pub scope: String,
}

/// What the inbox needs to sign in at the provider, as `GET /ui/sign-in.json` gives it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxSignIn {
    pub issuer: String,
    pub client_id: String,
    pub scope: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
}

/// The provider's signing keys by `kid`, as last fetched.
struct Keys {
    by_kid: HashMap<String, Arc<Key>>,
    fetched: Instant,
}

struct Key {
    decoding: DecodingKey,
    /// The algorithms the key may verify: its JWK's `alg` when it names one, else its family's.
    algorithms: Vec<Algorithm>,
}

/// Checks JWT bearer tokens from one OpenID provider.
pub struct Oidc {
    settings: OidcSettings,
    jwks_uri: String,
    inbox: Option<InboxSignIn>,
    client: reqwest::Client,
    keys: RwLock<Arc<Keys>>,
    /// When a token last had the keys fetched; held while a fetch runs, so that one fetch serves everyone
    /// waiting for it.
    refetched: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Oidc")
            .field("issuer", &self.settings.issuer)
            .field("jwks_uri", &self.jwks_uri)
            .finish_non_exhaustive()
    }
}

/// Why a token was refused, as its problem detail says.
fn rejected(why: impl Into<String>) -> AuthError {
    AuthError::Rejected(why.into())
}

impl Oidc {
    /// Reads the provider's discovery document and its keys: a provider that cannot be reached, or whose
    /// document names another issuer, is an error.
    pub async fn discover(settings: OidcSettings) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("cannot build the OpenID provider's HTTP client: {error}"))?;
        let issuer = &settings.issuer;
        let discovery = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        let document = fetch_json(&client, &discovery)
            .await
            .map_err(|why| format!("cannot read the OpenID provider's discovery document {discovery}: {why}"))?;
        match document.get("issuer").and_then(Value::as_str) {
            Some(named) if named == issuer => {}
            named => {
                return Err(format!(
                    "the discovery document {discovery} names the issuer {named:?}, not {issuer:?}: set \
                     [auth.oidc] issuer to exactly what the provider's tokens carry in `iss`"
                ));
            }
        }
        let jwks_uri = document
            .get("jwks_uri")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the discovery document {discovery} has no jwks_uri"))?
            .to_owned();
        if !is_safe_url(&jwks_uri) {
            return Err(format!(
                "the discovery document {discovery} names the key set {jwks_uri}, which is not https:// (http:// \
                 only on a loopback address)"
            ));
        }
        let inbox = match &settings.ui {
            Some(ui) => {
                let endpoint = |name: &str| match document.get(name).and_then(Value::as_str) {
                    Some(url) if is_safe_url(url) => Ok(url.to_owned()),
                    Some(url) => Err(format!(
                        "the discovery document {discovery} names the {name} {url}, which is not https:// (http:// \
                         only on a loopback address)"
                    )),
                    None => Err(format!(
                        "the discovery document {discovery} has no {name}, which the inbox needs to sign in \
                         (auth.oidc.ui_client_id)"
                    )),
                };
                Some(InboxSignIn {
                    issuer: settings.issuer.clone(),
                    client_id: ui.client_id.clone(),
                    scope: ui.scope.clone(),
                    authorization_endpoint: endpoint("authorization_endpoint")?,
                    token_endpoint: endpoint("token_endpoint")?,
                })
            }
            None => None,
        };
        let keys = fetch_keys(&client, &jwks_uri)
            .await
            .map_err(|why| format!("cannot read the OpenID provider's keys at {jwks_uri}: {why}"))?;
        if keys.by_kid.is_empty() {
            return Err(format!(
                "the OpenID provider's key set {jwks_uri} holds no signing key this gateway accepts (RSA, EC \
                 P-256/P-384 or Ed25519)"
            ));
        }
        Ok(Self {
            settings,
            jwks_uri,
            inbox,
            client,
            keys: RwLock::new(Arc::new(keys)),
            refetched: tokio::sync::Mutex::new(None),
        })
    }

    /// The issuer, for the protected resource metadata.
    pub fn issuer(&self) -> &str {
        &self.settings.issuer
    }

    /// The HTTP client that asks the provider: a short timeout, no redirects followed.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// What the inbox needs to sign in here, when it does.
    pub fn inbox(&self) -> Option<&InboxSignIn> {
        self.inbox.as_ref()
    }

    /// The principal a JWT names: its signature, issuer, audience and times checked, its groups mapped to a
    /// role. The error says which check failed and nothing of the token.
    pub async fn authenticate(self: &Arc<Self>, token: &str) -> Result<Principal, AuthError> {
        let header = Header::of(token)?;
        let (key, algorithm) = self.key_for(&header).await?;
        let settings = &self.settings;
        let mut validation = Validation::new(algorithm);
        validation.set_issuer(&[&settings.issuer]);
        validation.set_audience(&[&settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &validation)
            .map_err(|error| self.refusal(error.kind()))?
            .claims;
        self.principal(&claims)
    }

    /// The key that verifies a token with this header. A token naming a key not cached waits for the provider's
    /// keys to be fetched again, unless a fetch was made lately; a token whose key is cached never waits, and
    /// when the cache has aged it has the keys fetched again in the background.
    async fn key_for(self: &Arc<Self>, header: &Header) -> Result<(Arc<Key>, Algorithm), AuthError> {
        let algorithm = header.algorithm()?;
        let cached = self.cached();
        if let Some(found) = pick(&cached, header, algorithm) {
            if cached.fetched.elapsed() >= KEYS_MAX_AGE && self.refetch_due() {
                let oidc = self.clone();
                tokio::spawn(async move {
                    if let Ok(refetched) = oidc.refetched.try_lock() {
                        oidc.refetch(refetched).await;
                    }
                });
            }
            return found;
        }
        let refetched = self.refetched.lock().await;
        // Another token's fetch may have brought the key while this one waited.
        if let Some(found) = pick(&self.cached(), header, algorithm) {
            return found;
        }
        self.refetch(refetched).await;
        pick(&self.cached(), header, algorithm).unwrap_or_else(|| {
            Err(rejected(match &header.kid {
                Some(_) => "the token's key id (kid) names none of the issuer's signing keys",
                None => "the token names no key id (kid), and the issuer has more than one key for its algorithm",
            }))
        })
    }

    /// Whether a fetch of the keys could start now: none is running, and none was tried lately.
    fn refetch_due(&self) -> bool {
        self.refetched
            .try_lock()
            .is_ok_and(|at| at.is_none_or(|at| at.elapsed() >= REFETCH_INTERVAL))
    }

    /// Fetches the provider's keys again, unless that was tried less than [`REFETCH_INTERVAL`] ago. A set with no
    /// key this gateway accepts, or a provider that cannot be reached, leaves the cached keys in use.
    async fn refetch(&self, mut refetched: tokio::sync::MutexGuard<'_, Option<Instant>>) {
        if refetched.is_some_and(|at| at.elapsed() < REFETCH_INTERVAL) {
            return;
        }
        *refetched = Some(Instant::now());
        let why = match fetch_keys(&self.client, &self.jwks_uri).await {
            Ok(keys) if !keys.by_kid.is_empty() => {
                *self.keys.write().expect("the keys' lock is never poisoned") = Arc::new(keys);
                return;
            }
            Ok(_) => "it holds no signing key this gateway accepts".to_owned(),
            Err(why) => why,
        };
        tracing::warn!(
            issuer = %self.settings.issuer,
            jwks_uri = %self.jwks_uri,
            "cannot fetch the OpenID provider's keys, the cached ones stay in use: {why}"
        );
    }

    fn cached(&self) -> Arc<Keys> {
        self.keys.read().expect("the keys' lock is never poisoned").clone()
    }

    fn refusal(&self, kind: &ErrorKind) -> AuthError {
        let settings = &self.settings;
        match kind {
            ErrorKind::ExpiredSignature => rejected("the token has expired (exp)"),
            ErrorKind::ImmatureSignature => rejected("the token is not valid yet (nbf)"),
            ErrorKind::InvalidIssuer => rejected(format!("the token was not issued by {} (iss)", settings.issuer)),
            ErrorKind::InvalidAudience => rejected(format!(
                "the token's audience (aud) does not include {:?}",
                settings.audience
            )),
            ErrorKind::InvalidSignature => rejected("the token's signature does not verify"),
            ErrorKind::MissingRequiredClaim(claim) => rejected(format!("the token has no {claim:?} claim")),
            ErrorKind::InvalidAlgorithm => rejected("the token's algorithm does not match its key"),
            _ => rejected("the token is not a well-formed JWT"),
        }
    }

    /// The principal of verified claims: its identity is the issuer and `sub`, its name the configured claim,
    /// its role the highest its groups give.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, AuthError> {
        let settings = &self.settings;
        let text = |claim: &str| {
            claims
                .get(claim)
                .and_then(Value::as_str)
                .filter(|text| !text.is_empty())
        };
        let subject = text("sub").ok_or_else(|| rejected("the token's \"sub\" claim is not a string"))?;
        let name = match &settings.name_claim {
            Some(claim) => text(claim),
            None => text("preferred_username").or_else(|| text("email")),
        }
        .unwrap_or(subject);
        let claim = &settings.groups_claim;
        let groups: Vec<&str> = match claims.get(claim) {
            Some(Value::Array(groups)) => groups.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(groups)) => groups.split_whitespace().collect(),
            _ => {
                return Err(AuthError::Forbidden(format!(
                    "the token has no {claim:?} claim listing its groups, so it maps to no role: have the \
                     provider put groups in it, or set [auth.oidc] groups_claim to the claim that holds them"
                )));
            }
        };
        let role = settings.roles.role_of(groups.iter().copied()).ok_or_else(|| {
            AuthError::Forbidden(format!(
                "none of the token's groups ({groups:?} in {claim:?}) maps to a role in [auth.oidc] roles"
            ))
        })?;
        Ok(Principal {
            id: identity(&settings.issuer, subject),
            name: name.to_owned(),
            role,
            signed_in: SignIn::Oidc {
                issuer: settings.issuer.clone(),
                subject: subject.to_owned(),
                email: text("email")
                    .filter(|_| {
                        let verified = claims.get("email_verified");
                        verified == Some(&Value::Bool(true)) || verified.and_then(Value::as_str) == Some("true")
                    })
                    .map(str::to_owned),
                groups: groups.into_iter().map(str::to_owned).collect(),
            },
        })
    }
}

/// Whether a URL of the provider may be trusted: `https://`, or `http://` on a loopback address.
pub fn is_safe_url(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = url.host_str().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    url.scheme() == "https" || (url.scheme() == "http" && loopback)
}

/// The stable identity of an OpenID subject: its issuer and `sub`. No token's name can take this form.
pub fn identity(issuer: &str, subject: &str) -> String {
    format!("{issuer}#{subject}")
}

/// Whether a name has the form of an OpenID identity, which a token's name may not take.
pub fn is_identity_form(name: &str) -> bool {
    name.starts_with("https://") || name.starts_with("http://")
}

/// A JWT's header, read before anything is verified to choose the key.
#[derive(Debug, Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

impl Header {
    fn of(token: &str) -> Result<Self, AuthError> {
        let malformed = || rejected("the token is not a well-formed JWT");
        let encoded = token.split('.').next().ok_or_else(malformed)?;
        let bytes = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| malformed())?;
        serde_json::from_slice(&bytes).map_err(|_| malformed())
    }

    /// The header's algorithm, when it is one the provider's public keys sign with.
    fn algorithm(&self) -> Result<Algorithm, AuthError> {
        if self.alg.eq_ignore_ascii_case("none") {
            return Err(rejected(
                "the token is unsigned (alg \"none\"), which is never accepted",
            ));
        }
        match Algorithm::from_str(&self.alg) {
            Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) => Err(rejected(
                "the token is signed with a shared secret (HS256/384/512), which is never accepted: only the \
                 issuer's public keys sign tokens here",
            )),
            Ok(algorithm) => Ok(algorithm),
            Err(_) => Err(rejected("the token's algorithm (alg) is not one this gateway verifies")),
        }
    }
}

/// The cached key the header names (by `kid`, or the only one for its algorithm without one), and whether it
/// may verify the header's algorithm.
fn pick(keys: &Keys, header: &Header, algorithm: Algorithm) -> Option<Result<(Arc<Key>, Algorithm), AuthError>> {
    let key = match &header.kid {
        Some(kid) => keys.by_kid.get(kid)?,
        None => {
            let mut fitting = keys.by_kid.values().filter(|key| key.algorithms.contains(&algorithm));
            match (fitting.next(), fitting.next()) {
                (Some(only), None) => only,
                _ => return None,
            }
        }
    };
    Some(if key.algorithms.contains(&algorithm) {
        Ok((key.clone(), algorithm))
    } else {
        Err(rejected("the token's algorithm (alg) is not the one its key is for"))
    })
}

async fn fetch_json(client: &reqwest::Client, url: &str) -> Result<Value, String> {
    let mut response = client.get(url).send().await.map_err(|error| error.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("it answered {status}"));
    }
    let too_large = || format!("it is larger than {MAX_DOCUMENT_BYTES} bytes");
    if response
        .content_length()
        .is_some_and(|length| length > MAX_DOCUMENT_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|error| error.to_string())? {
        if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|error| format!("it is not JSON: {error}"))
}

/// The provider's signing keys that have a `kid`: RSA, EC and OKP keys only (a symmetric key in a public key
/// set is skipped, never used), each for its algorithm or its family's.
async fn fetch_keys(client: &reqwest::Client, url: &str) -> Result<Keys, String> {
    let document = fetch_json(client, url).await?;
    let set: JwkSet = serde_json::from_value(document).map_err(|error| format!("it is not a JWK set: {error}"))?;
    Ok(keys_of(set))
}

/// The signing keys of a key set, as [`fetch_keys`] keeps them.
fn keys_of(set: JwkSet) -> Keys {
    let mut by_kid = HashMap::new();
    for jwk in set.keys {
        let Some(kid) = jwk.common.key_id.clone() else {
            continue;
        };
        let common = &jwk.common;
        let encrypts = matches!(common.public_key_use, Some(jsonwebtoken::jwk::PublicKeyUse::Encryption));
        let verifies = common
            .key_operations
            .as_ref()
            .is_none_or(|operations| operations.contains(&jsonwebtoken::jwk::KeyOperations::Verify));
        if encrypts || !verifies {
            continue;
        }
        let family: &[Algorithm] = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => &[
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
            AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
                EllipticCurve::P256 => &[Algorithm::ES256],
                EllipticCurve::P384 => &[Algorithm::ES384],
                _ => continue,
            },
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => &[Algorithm::EdDSA],
            _ => continue,
        };
        // A key named for an algorithm that signs nothing (an encryption key's) is none of ours.
        let algorithms = match common
            .key_algorithm
            .map(|named| Algorithm::from_str(&named.to_string()))
        {
            Some(Ok(named)) if family.contains(&named) => vec![named],
            Some(_) => continue,
            None => family.to_vec(),
        };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        by_kid.insert(kid, Arc::new(Key { decoding, algorithms }));
    }
    Keys {
        by_kid,
        fetched: Instant::now(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_role_a_group_gives_wins() {
        let roles = RoleGroups {
            admin: vec!["admins".into()],
            approver: vec!["sre".into(), "on-call".into()],
            agent: vec!["agents".into()],
        };
        let role = |groups: &[&str]| roles.role_of(groups.iter().copied());
        assert_eq!(role(&["agents", "on-call"]), Some(Role::Approver));
        assert_eq!(role(&["agents", "admins", "sre"]), Some(Role::Admin));
        assert_eq!(role(&["agents"]), Some(Role::Agent));
        assert_eq!(role(&["marketing"]), None);
        assert_eq!(role(&[]), None);
    }

    #[test]
    fn only_signing_keys_of_the_curves_and_algorithms_verified_are_kept() {
        let rsa = serde_json::json!({"kty": "RSA", "e": "AQAB", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw"});
        let with = |extra: serde_json::Value| {
            let mut key = rsa.clone();
            key.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            key
        };
        let set = serde_json::json!({"keys": [
            with(serde_json::json!({"kid": "sig", "use": "sig", "alg": "RS256"})),
            with(serde_json::json!({"kid": "family"})),
            with(serde_json::json!({"kid": "enc", "use": "enc"})),
            with(serde_json::json!({"kid": "oaep", "alg": "RSA-OAEP"})),
            with(serde_json::json!({"kid": "wraps", "key_ops": ["wrapKey"]})),
            with(serde_json::json!({})),
            {"kid": "x25519", "kty": "OKP", "crv": "X25519", "x": "3p7bfXt9wbTTW2HC7OQ1Nz-DQ8hbeGdNrfx-FG-IK08"},
            {"kid": "hmac", "kty": "oct", "k": "c2VjcmV0"},
        ]});
        let keys = keys_of(serde_json::from_value(set).unwrap());
        let mut kept: Vec<_> = keys.by_kid.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["family", "sig"]);
        assert_eq!(keys.by_kid["sig"].algorithms, [Algorithm::RS256]);
        assert!(keys.by_kid["family"].algorithms.contains(&Algorithm::PS512));
    }

    #[test]
    fn unsigned_and_shared_secret_tokens_are_refused_before_any_key_is_looked_up() {
        let header = |alg: &str| Header {
            alg: alg.into(),
            kid: None,
        };
        for alg in ["none", "None", "HS256", "HS512", "XX1"] {
            assert!(matches!(header(alg).algorithm(), Err(AuthError::Rejected(_))), "{alg}");
        }
        assert_eq!(header("ES256").algorithm(), Ok(Algorithm::ES256));
        assert!(is_identity_form(&identity("https://idp.example.com", "248289761001")));
        assert!(!is_identity_form("ci"));
    }
}
