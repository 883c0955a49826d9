//! OpenID Connect bearer tokens, issued by a real provider: panva's oidc-provider (tests/oidc/provider.mjs) on
//! loopback, whose services take tokens by the client-credentials grant.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::front_door::{CLIENT_ERAS, Confirming, call_as, connect_as, spawn_front_door, waiting_call};
use crate::helpers::{BINARY, BOTH_ERAS, Caller, Output, config_text, spawn_process, start_process, token_entry};
use crate::integrity::{pending_of, refused_through_mcp, untouched};

const AUDIENCE: &str = "toolnexus-gateway";

/// The provider's process on loopback, killed when dropped.
pub struct Provider {
    child: Child,
    pub issuer: String,
    port: u16,
    client: reqwest::Client,
}

impl Provider {
    /// Starts the provider with the signing keys in `keys` (made there when missing), on `port` (0: any).
    pub fn start(keys: &Path, port: u16) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
        assert!(
            dir.join("node_modules/oidc-provider").is_dir(),
            "the OpenID tests run panva's oidc-provider: run `npm ci` in tests/oidc (scripts/test.sh does)"
        );
        let mut child = Command::new("node")
            .arg("provider.mjs")
            .arg("--port")
            .arg(port.to_string())
            .arg("--keys")
            .arg(keys)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("node runs tests/oidc/provider.mjs");
        let _ = Output::collect(child.stderr.take().unwrap(), "[oidc] ");
        let stdout = Output::collect(child.stdout.take().unwrap(), "[oidc stdout] ");
        let issuer = stdout
            .wait_for("issuer ")
            .trim_start_matches("issuer ")
            .trim()
            .to_owned();
        let port = issuer.rsplit(':').next().unwrap().parse().unwrap();
        Self {
            child,
            issuer,
            port,
            client: reqwest::Client::new(),
        }
    }

    /// Stops it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it and starts it again on its port with the keys in `keys`: a rotation.
    pub fn restart_with(&mut self, keys: &Path) {
        self.stop();
        *self = Self::start(keys, self.port);
    }

    /// An access token for the service `client` (secret `<client>-secret`), by the client-credentials grant.
    pub async fn token(&self, client: &str) -> String {
        let response: Value = self
            .client
            .post(format!("{}/token", self.issuer))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                serde_urlencoded::to_string([
                    ("grant_type", "client_credentials"),
                    ("client_id", client),
                    ("client_secret", &format!("{client}-secret")),
                ])
                .unwrap(),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        response["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {client}: {response}"))
            .to_owned()
    }

    /// A token the provider's own key for `header.alg` signs, with these claims.
    pub async fn sign(&self, header: Value, claims: Value) -> String {
        self.signed(json!({"header": header, "claims": claims})).await
    }

    async fn signed(&self, body: Value) -> String {
        let response = self
            .client
            .post(format!("{}/test/sign", self.issuer))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        response.text().await.unwrap()
    }

    /// How often the signing keys were fetched.
    pub async fn key_fetches(&self) -> u64 {
        let counted: Value = self
            .client
            .get(format!("{}/test/jwks-fetches", self.issuer))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        counted["fetches"].as_u64().unwrap()
    }

    /// Claims that pass every check, for `sub`, in the groups given.
    pub fn claims(&self, sub: &str, groups: &[&str]) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        json!({"iss": self.issuer, "aud": AUDIENCE, "sub": sub, "groups": groups, "iat": now, "exp": now + 600})
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `[auth.oidc]` table of a gateway that trusts `provider`.
pub fn oidc_settings(issuer: &str) -> String {
    format!(
        "[auth.oidc]\nissuer = \"{issuer}\"\naudience = \"{AUDIENCE}\"\n\
         roles = {{ admin = [\"gateway-admins\"], approver = [\"sre\", \"on-call\"], agent = [\"agents\"] }}\n"
    )
}

/// A provider with fresh keys in `dir`.
fn provider_in(dir: &Path) -> Provider {
    Provider::start(&dir.join("keys.json"), 0)
}

/// `modern` `echo` needs an approver's yes.
const APPROVE_ECHO: &str = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n";

#[tokio::test]
async fn each_role_comes_from_the_groups_in_the_provider_s_token() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let app = spawn_front_door(BOTH_ERAS, &oidc_settings(&provider.issuer)).await;
    let caller = async |client: &str| Caller::bearing(&app, &provider.token(client).await);

    for agent in ["agent-1", "agent-es256", "agent-eddsa"] {
        let (status, call) = caller(agent)
            .await
            .post(
                "/calls?wait=20",
                json!({"server": "modern", "tool": "echo", "arguments": {"text": agent}}),
            )
            .await;
        assert_eq!((status, &call["status"]), (201, &json!("completed")), "{agent}: {call}");
        assert_eq!(
            call["owner"],
            format!("{}#{agent}", provider.issuer),
            "the owner is issuer and sub"
        );
        let (status, _) = caller(agent).await.get("/approvals").await;
        assert_eq!(status, 403, "{agent} is an agent, not an admin");
    }
    for approver in ["sre-bot", "on-call-bot"] {
        let approver = caller(approver).await;
        assert_eq!(approver.get("/requests").await.0, 200);
        let (status, problem) = approver
            .post("/calls", json!({"server": "modern", "tool": "echo", "arguments": {}}))
            .await;
        assert_eq!(status, 403, "an approver starts no call: {problem}");
    }
    assert_eq!(
        caller("admin-bot").await.get("/approvals").await.0,
        200,
        "the highest role wins"
    );

    let (status, problem) = caller("marketing-bot").await.get("/requests").await;
    assert_eq!(status, 403, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("marketing") && detail.contains("maps to a role"),
        "{detail}"
    );
    let (status, problem) = caller("groupless-bot").await.get("/requests").await;
    assert_eq!(status, 403, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("none of the token's groups"),
        "{problem}"
    );
}

#[tokio::test]
async fn an_approver_group_answers_and_no_agent_approves_its_own_call_at_any_door() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let settings = format!("[front_door]\nmax_hold = \"1s\"\n{}", oidc_settings(&provider.issuer));
    let app = spawn_front_door(&format!("{BOTH_ERAS}{APPROVE_ECHO}"), &settings).await;
    let sre = Caller::bearing(&app, &provider.token("sre-bot").await);
    let token = provider.token("agent-1").await;
    let other_agent = Caller::bearing(&app, &provider.token("agent-2").await);

    for era in CLIENT_ERAS {
        let case = format!("{era:?}");
        let client = connect_as(&app, &era, Some(&token), Confirming::default()).await;
        let held = call_as(&client, "modern__echo", json!({"text": case})).await;
        let call = waiting_call(&held)["id"].as_str().unwrap().to_owned();
        let approval = pending_of(&sre, &call).await;
        let request = approval["id"].as_str().unwrap();
        assert_eq!(approval["owner"], format!("{}#agent-1", provider.issuer));

        refused_through_mcp(&app, &token, &era, &call, request, "may not approve").await;
        let (status, problem) = Caller::bearing(&app, &token)
            .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
            .await;
        assert_eq!(status, 403, "{case}: {problem}");
        let (status, _) = other_agent
            .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
            .await;
        assert_eq!(status, 403, "{case}: it is another agent's");
        untouched(&sre, request, &call).await;

        let (status, approved) = sre
            .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
            .await;
        assert_eq!(
            (status, &approved["answeredBy"]),
            (200, &json!("sre-bot")),
            "{case}: {approved}"
        );
        assert_eq!(
            approved["answerer"],
            json!({"name": "sre-bot", "via": "oidc", "issuer": provider.issuer, "subject": "sre-bot"})
        );
        let (_, ended) = sre.get(&format!("/calls/{call}?wait=20")).await;
        assert_eq!(ended["status"], "completed", "{case}: {ended}");
        client.cancel().await.unwrap();
    }
}

#[tokio::test]
async fn approvers_name_the_provider_s_groups_and_users_and_self_approval_lets_the_caller_approve() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let policies = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\n\
        approvers = [\"group:on-call\", \"user:admin-bot\", \"lead\"]\n\n\
        [[approvals]]\nserver = \"legacy\"\ntools = [\"echo\"]\nself_approval = true\n";
    let settings = format!("{}{}", oidc_settings(&provider.issuer), token_entry("lead", "approver"));
    let app = spawn_front_door(&format!("{BOTH_ERAS}{policies}"), &settings).await;
    let agent = Caller::bearing(&app, &provider.token("agent-1").await);
    let start = async |server: &str| {
        let (status, call) = agent
            .post(
                "/calls",
                json!({"server": server, "tool": "echo", "arguments": {"text": server}}),
            )
            .await;
        assert_eq!(status, 201, "{call}");
        call["id"].as_str().unwrap().to_owned()
    };
    let answer = async |caller: &Caller, request: &str| {
        caller
            .post(&format!("/requests/{request}/answer"), json!({"ok": true}))
            .await
    };

    for (answerer, name) in [
        (
            Caller::bearing(&app, &provider.token("on-call-bot").await),
            "on-call-bot",
        ),
        (Caller::bearing(&app, &provider.token("admin-bot").await), "admin-bot"),
        (Caller::new(&app, "lead"), "lead"),
    ] {
        let call = start("modern").await;
        let approval = pending_of(&answerer, &call).await;
        let request = approval["id"].as_str().unwrap();
        assert_eq!(
            approval["data"]["approvers"],
            json!(["group:on-call", "user:admin-bot", "lead"])
        );
        assert_eq!(
            approval["data"]["call"]["caller"], "agent-1",
            "the caller by name; its owner by identity"
        );
        let sre = Caller::bearing(&app, &provider.token("sre-bot").await);
        let (status, problem) = answer(&sre, request).await;
        assert_eq!(status, 403, "sre is not a listed group: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("not among the approvers"),
            "{problem}"
        );
        let (status, answered) = answer(&answerer, request).await;
        assert_eq!((status, &answered["answeredBy"]), (200, &json!(name)), "{answered}");
        let via = if name == "lead" { "token" } else { "oidc" };
        assert_eq!(answered["answerer"]["via"], via, "{answered}");
    }

    let call = start("legacy").await;
    let approval = pending_of(&agent, &call).await;
    assert_eq!(approval["data"]["selfApproval"], true, "{approval}");
    let (status, answered) = answer(&agent, approval["id"].as_str().unwrap()).await;
    assert_eq!(
        (status, &answered["answeredBy"]),
        (200, &json!("agent-1")),
        "{answered}"
    );
    let (_, ended) = agent.get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(ended["status"], "completed", "{ended}");
}

#[tokio::test]
async fn a_quorum_of_two_takes_two_different_people_and_ends_on_any_no() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let policy = "[[approvals]]\nserver = \"modern\"\ntools = [\"echo\"]\nquorum = 2\n";
    let settings = format!("{}{}", oidc_settings(&provider.issuer), token_entry("lead", "approver"));
    let app = spawn_front_door(&format!("{BOTH_ERAS}{policy}"), &settings).await;
    let agent = Caller::bearing(&app, &provider.token("agent-1").await);
    let sre = Caller::bearing(&app, &provider.token("sre-bot").await);
    let lead = Caller::new(&app, "lead");
    let start = async || {
        let (status, call) = agent
            .post(
                "/calls",
                json!({"server": "modern", "tool": "echo", "arguments": {"text": "two"}}),
            )
            .await;
        assert_eq!(status, 201, "{call}");
        let call = call["id"].as_str().unwrap().to_owned();
        let approval = pending_of(&lead, &call).await;
        assert_eq!(approval["data"]["quorum"], 2, "{approval}");
        (call, approval["id"].as_str().unwrap().to_owned())
    };
    let answer = async |caller: &Caller, request: &str, ok: bool| {
        caller
            .post(&format!("/requests/{request}/answer"), json!({"ok": ok}))
            .await
    };

    let (call, request) = start().await;
    let (status, first) = answer(&sre, &request, true).await;
    assert_eq!((status, &first["status"]), (200, &json!("pending")), "{first}");
    let decisions = &first["decisions"];
    assert_eq!(decisions.as_array().unwrap().len(), 1, "{first}");
    assert_eq!(
        (&decisions[0]["by"], &decisions[0]["ok"]),
        (&json!("sre-bot"), &json!(true))
    );
    assert_eq!(decisions[0]["principal"], format!("{}#sre-bot", provider.issuer));
    assert!(first.get("answeredBy").is_none(), "{first}");
    let (status, again) = answer(&sre, &request, true).await;
    assert_eq!(
        (status, &again["decisions"]),
        (200, decisions),
        "the same yes again counts once"
    );
    let (status, problem) = answer(&sre, &request, false).await;
    assert_eq!(status, 409, "{problem}");
    let (_, held) = lead.get(&format!("/calls/{call}")).await;
    assert_eq!(held["status"], "input_required", "one yes forwards nothing: {held}");

    let (status, last) = answer(&lead, &request, true).await;
    assert_eq!(
        (status, &last["status"], &last["answeredBy"]),
        (200, &json!("answered"), &json!("lead")),
        "{last}"
    );
    assert_eq!(last["decisions"].as_array().unwrap().len(), 2, "{last}");
    let (_, ended) = lead.get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(ended["status"], "completed", "{ended}");

    let (call, request) = start().await;
    let (status, _) = answer(&sre, &request, true).await;
    assert_eq!(status, 200);
    let (status, declined) = answer(&lead, &request, false).await;
    assert_eq!((status, &declined["answer"]["ok"]), (200, &json!(false)), "{declined}");
    let (_, failed) = lead.get(&format!("/calls/{call}?wait=20")).await;
    assert_eq!(failed["status"], "failed", "a no after a yes ends it: {failed}");
}

#[tokio::test]
async fn a_token_s_namesake_at_the_provider_gets_nothing_of_the_token_s() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    // The token `agent-1` and the provider's service `agent-1` share a name, not an identity.
    let settings = format!("{}{}", oidc_settings(&provider.issuer), token_entry("agent-1", "agent"));
    let app = spawn_front_door(BOTH_ERAS, &settings).await;
    let configured = Caller::new(&app, "agent-1");
    let namesake = Caller::bearing(&app, &provider.token("agent-1").await);

    let (status, call) = configured
        .post(
            "/calls",
            json!({"server": "modern", "tool": "confirm_action", "arguments": {"action": "x"}}),
        )
        .await;
    assert_eq!(status, 201, "{call}");
    assert_eq!(call["owner"], "agent-1");
    let id = call["id"].as_str().unwrap();
    assert_eq!(namesake.get(&format!("/calls/{id}")).await.0, 403);
    assert_eq!(namesake.get("/calls").await.1, json!([]));
    assert_eq!(namesake.delete(&format!("/calls/{id}")).await.0, 403);
    let (_, requests) = configured.get(&format!("/requests?call={id}&wait=20")).await;
    let request = requests[0]["id"].as_str().unwrap();
    assert_eq!(namesake.get(&format!("/requests/{request}")).await.0, 403);
    let (status, _) = namesake
        .post(
            &format!("/requests/{request}/answer"),
            json!({"ok": true, "data": {"confirm": true}}),
        )
        .await;
    assert_eq!(status, 403);
    assert_eq!(namesake.get("/requests").await.1, json!([]));
}

#[tokio::test]
async fn tokens_failing_a_check_are_refused_saying_which_and_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let mut gateway = spawn_process(&oidc_settings(&provider.issuer), BOTH_ERAS, "").await;
    let claims = provider.claims("someone", &["agents"]);
    let with = |change: Value| {
        let mut changed = claims.clone();
        changed
            .as_object_mut()
            .unwrap()
            .extend(change.as_object().unwrap().clone());
        changed
    };
    let now = claims["iat"].as_u64().unwrap();
    let rs256 = json!({"alg": "RS256"});
    let good = provider.sign(rs256.clone(), claims.clone()).await;
    let mut tampered = good.split('.').map(str::to_owned).collect::<Vec<_>>();
    tampered[1] = base64_url(&serde_json::to_vec(&with(json!({"groups": ["gateway-admins"]}))).unwrap());
    let unsigned = format!(
        "{}.{}.",
        base64_url(br#"{"alg":"none"}"#),
        base64_url(&serde_json::to_vec(&claims).unwrap())
    );
    let kid = decoded_header(&good)["kid"].clone();
    let cases = [
        (
            "expired",
            provider.sign(rs256.clone(), with(json!({"exp": now - 3600}))).await,
            "expired",
        ),
        (
            "not yet valid",
            provider.sign(rs256.clone(), with(json!({"nbf": now + 3600}))).await,
            "not valid yet",
        ),
        (
            "another issuer",
            provider
                .sign(rs256.clone(), with(json!({"iss": "https://idp.example.com"})))
                .await,
            "not issued by",
        ),
        (
            "another audience",
            provider.sign(rs256.clone(), with(json!({"aud": "someone-else"}))).await,
            "audience",
        ),
        (
            "no subject",
            provider.sign(rs256.clone(), with(json!({"sub": null}))).await,
            "\"sub\"",
        ),
        ("alg none", unsigned, "unsigned"),
        (
            "HS256 keyed with the public key",
            provider
                .signed(json!({"header": {"kid": kid}, "claims": claims, "hmac": "public-key"}))
                .await,
            "shared secret",
        ),
        (
            "an unknown kid",
            provider
                .sign(json!({"alg": "RS256", "kid": "nobody-s-key"}), claims.clone())
                .await,
            "kid",
        ),
        ("tampered claims", tampered.join("."), "signature"),
        (
            "ES256 under the RSA key's kid",
            provider.sign(json!({"alg": "ES256", "kid": kid}), claims.clone()).await,
            "algorithm",
        ),
    ];
    let app: &crate::helpers::TestApp = &gateway;
    assert_eq!(
        Caller::bearing(app, &good).get("/calls").await.0,
        200,
        "the good token passes"
    );
    for (case, token, why) in &cases {
        let response = app
            .client
            .get(format!("{}/calls", app.address))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401, "{case}");
        let challenge = response.headers()["www-authenticate"].to_str().unwrap().to_owned();
        assert!(challenge.contains("error=\"invalid_token\""), "{case}: {challenge}");
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(why), "{case}: {detail}");
    }
    gateway.terminate();
    let logs = gateway.stderr().lines().join("\n");
    for (case, token, _) in &cases {
        let signature = token.rsplit('.').next().unwrap();
        let payload = token.split('.').nth(1).unwrap();
        assert!(
            !logs.contains(payload) && (signature.is_empty() || !logs.contains(signature)),
            "{case} logged"
        );
    }
}

#[tokio::test]
async fn a_rotated_key_is_fetched_without_a_restart_and_the_withdrawn_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut provider = provider_in(dir.path());
    let app = spawn_front_door(BOTH_ERAS, &oidc_settings(&provider.issuer)).await;
    let before = provider.token("agent-1").await;
    assert_eq!(Caller::bearing(&app, &before).get("/calls").await.0, 200);

    provider.restart_with(&dir.path().join("rotated.json"));
    let after = provider.token("agent-1").await;
    assert_ne!(decoded_header(&after)["kid"], decoded_header(&before)["kid"]);
    assert_eq!(
        Caller::bearing(&app, &after).get("/calls").await.0,
        200,
        "the new key is fetched"
    );
    let (status, problem) = Caller::bearing(&app, &before).get("/calls").await;
    assert_eq!(status, 401, "the withdrawn key is gone: {problem}");
    assert!(problem["detail"].as_str().unwrap().contains("kid"), "{problem}");
}

#[tokio::test]
async fn a_stream_of_unknown_kids_fetches_the_keys_once() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let app = spawn_front_door(BOTH_ERAS, &oidc_settings(&provider.issuer)).await;
    let fetched = provider.key_fetches().await;
    let claims = provider.claims("someone", &["agents"]);
    for index in 0..20 {
        let bogus = provider
            .sign(json!({"alg": "RS256", "kid": format!("bogus-{index}")}), claims.clone())
            .await;
        assert_eq!(Caller::bearing(&app, &bogus).get("/calls").await.0, 401);
    }
    assert_eq!(
        provider.key_fetches().await - fetched,
        1,
        "one fetch for twenty unknown kids"
    );
}

#[tokio::test]
async fn the_provider_down_after_start_leaves_the_cached_keys_working_and_down_at_start_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut provider = provider_in(dir.path());
    let settings = oidc_settings(&provider.issuer);
    let app = spawn_front_door(BOTH_ERAS, &settings).await;
    let token = provider.token("agent-1").await;
    provider.stop();
    assert_eq!(Caller::bearing(&app, &token).get("/calls").await.0, 200);
    let bogus = {
        // Any token naming a kid the gateway never saw: it tries the provider, which is down.
        let mut parts = token.split('.').map(str::to_owned).collect::<Vec<_>>();
        parts[0] = base64_url(br#"{"alg":"RS256","kid":"unseen"}"#);
        parts.join(".")
    };
    assert_eq!(Caller::bearing(&app, &bogus).get("/calls").await.0, 401);
    assert_eq!(
        Caller::bearing(&app, &token).get("/calls").await.0,
        200,
        "still the cached keys"
    );

    let config = dir.path().join("gateway.toml");
    std::fs::write(&config, config_text(dir.path(), &settings, BOTH_ERAS, "")).unwrap();
    let refused = Command::new(BINARY).arg("--config").arg(&config).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "it starts without its provider: {stderr}");
    assert!(
        stderr.contains("cannot read the OpenID provider's discovery document"),
        "{stderr}"
    );
}

#[tokio::test]
async fn mcp_challenges_with_its_protected_resource_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_in(dir.path());
    let app = spawn_front_door(BOTH_ERAS, &oidc_settings(&provider.issuer)).await;
    let metadata_url = format!("{}/.well-known/oauth-protected-resource/mcp", app.address);

    let response = app
        .client
        .post(format!("{}/mcp", app.address))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(
        response.headers()["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\"").as_str()
    );
    for url in [
        metadata_url.clone(),
        format!("{}/.well-known/oauth-protected-resource", app.address),
    ] {
        let metadata: Value = app.client.get(&url).send().await.unwrap().json().await.unwrap();
        assert_eq!(metadata["resource"], format!("{}/mcp", app.address), "{url}");
        assert_eq!(metadata["authorization_servers"], json!([provider.issuer]), "{url}");
    }
    assert_eq!(
        app.get("/requests").await.headers()["www-authenticate"],
        "Bearer",
        "only /mcp names it"
    );

    let without = start_process(&token_entry("ops", "admin"), BOTH_ERAS, "");
    assert_eq!(without.get("/.well-known/oauth-protected-resource").await.status(), 404);
}

fn base64_url(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn decoded_header(token: &str) -> Value {
    use base64::Engine;
    let header = token.split('.').next().unwrap();
    serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap()
}
