//! The console's sign-in and its guards, over HTTP: a page without a session goes to the
//! sign-in; a token the API server refuses is refused; a signed-in browser sees what its token
//! may see and is refused the rest; a write by cookie needs the CSRF header; `baton console`'s
//! one-time address signs in once.

use std::sync::Arc;

use baton::crd::v1alpha1::{AgentRun, LeaseSpec};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::server::*;
use kube::Api;
use kube::api::PostParams;

/// A client that follows no redirect and keeps no cookie: each test says what it sends.
fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The sign-in form's body (a token's characters, percent-encoded where they must be).
fn token_form(token: &str) -> String {
    let encoded: String = token
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("token={encoded}")
}

/// The session cookie a response sets (`name=value`).
fn cookie_of(response: &reqwest::Response) -> String {
    session_cookie(response).expect("a session cookie")
}

fn session_cookie(response: &reqwest::Response) -> Option<String> {
    let set = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.contains("baton_session=") && !v.contains("Max-Age=0"))?;
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    Some(set.split(';').next().unwrap().to_string())
}

/// The sign-in form as the server gives it to a browser: its cookie (`name=value`) and the
/// nonce the form repeats.
async fn sign_in_form(b: &reqwest::Client, url: &str) -> (String, String) {
    let r = b.get(format!("{url}/console/login")).send().await.unwrap();
    let cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.contains("baton_login="))
        .expect("the form's cookie");
    let cookie = cookie.split(';').next().unwrap().to_string();
    let page = r.text().await.unwrap();
    let nonce = page
        .split("name=\"nonce\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the form's nonce")
        .to_string();
    (cookie, nonce)
}

/// Signs in with `token` from the server's own form, as a browser does.
async fn sign_in(b: &reqwest::Client, url: &str, token: &str) -> reqwest::Response {
    let (cookie, nonce) = sign_in_form(b, url).await;
    b.post(format!("{url}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", cookie)
        .body(format!("{}&nonce={nonce}", token_form(token)))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_console_signs_in_with_a_token_and_shows_only_what_it_may_see() {
    let ns = TestNamespace::new("console-auth").await;
    let other = TestNamespace::new("console-auth-other").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    let run = scripted_run(
        "shown",
        vec![final_turn("hi", 0)],
        vec![],
        LeaseSpec::default(),
    );
    runs.create(&PostParams::default(), &run).await.unwrap();
    let b = browser();

    let r = b.get(format!("{url}/console")).send().await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/console/login");
    let r = sign_in(&b, &url, "not-a-real-token").await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("refused this token"));

    let r = sign_in(&b, &url, &alice).await;
    assert_eq!(r.status(), 303);
    let cookie = cookie_of(&r);
    assert!(
        !cookie.contains(&alice[..20]),
        "the cookie holds no token: {cookie}"
    );
    let r = b
        .get(format!("{url}/console?ns={}", ns.name))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    assert!(
        r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'self'")
    );
    let page = r.text().await.unwrap();
    assert!(page.contains("data-run=\"shown\""), "{page}");

    // Another namespace: the API server's refusal, as a page.
    let r = b
        .get(format!("{url}/console?ns={}", other.name))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("forbidden"));

    // A write by cookie alone (what another site's form could make a browser send) is refused.
    let stop = format!("{url}/api/v1/namespaces/{}/runs/shown/stop", ns.name);
    let r = b
        .post(&stop)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(!runs.get("shown").await.unwrap().spec.stop);
    let csrf = page
        .split("data-csrf=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    let r = b
        .post(&stop)
        .header("cookie", &cookie)
        .header("x-baton-csrf", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert!(runs.get("shown").await.unwrap().spec.stop);
    ns.cleanup().await;
    other.cleanup().await;
}

#[tokio::test]
async fn baton_consoles_one_time_address_signs_in_once() {
    let ns = TestNamespace::new("console-local").await;
    let settings = baton::server::ConsoleSettings {
        namespace: ns.name.clone(),
        namespaces: vec![],
        secure_cookies: false,
    };
    let state = Arc::new(baton::server::ServerState::local(
        ns.client.clone(),
        settings,
    ));
    let secret = state.one_time_secret().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = baton::server::router(state.clone());
    let _served = tokio::spawn(async move { axum::serve(listener, app).await });
    let b = browser();
    let r = b
        .get(format!("{url}/console/login?once=wrong"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(session_cookie(&r).is_none());
    let r = b
        .get(format!("{url}/console/login?once={secret}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = cookie_of(&r);
    let r = b
        .get(format!("{url}/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = b
        .get(format!("{url}/console/login?once={secret}"))
        .send()
        .await
        .unwrap();
    assert!(session_cookie(&r).is_none(), "the address signs in once");
    assert_eq!(state.one_time_secret(), None);
    // A bearer token is not what this console takes: it acts as one local user only.
    let r = b
        .get(format!("{url}/api/v1/namespaces/{}/runs", ns.name))
        .bearer_auth("someone-else")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    ns.cleanup().await;
}

#[tokio::test]
async fn the_baton_console_command_prints_an_address_that_signs_a_browser_in() {
    use tokio::io::AsyncBufReadExt;
    let ns = TestNamespace::new("console-bin").await;
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["console", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("loopback"));

    let mut console = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"))
        .args(["console", "-n", &ns.name])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = console.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = lines.next_line().await.unwrap().unwrap();
    let address = first.split("open ").nth(1).unwrap().trim().to_string();
    assert!(address.starts_with("http://127.0.0.1:"), "{first}");
    let b = browser();
    let r = b.get(&address).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let cookie = cookie_of(&r);
    let base = address.split("/console/login").next().unwrap();
    let r = b
        .get(format!("{base}/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains(&format!("Runs in {}", ns.name))
    );
    console.kill().await.unwrap();
    ns.cleanup().await;
}

/// A sign-in from another site's page (login CSRF: the victim signed in as the attacker) is
/// refused; the session cookie holds the token sealed, opens on every replica that holds the
/// same key and on no other, and is `Secure` and `__Host-` when browsers come over HTTPS.
#[tokio::test]
async fn a_sign_in_from_another_site_is_refused_and_a_session_is_sealed() {
    let ns = TestNamespace::new("console-session").await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let key_file = std::env::temp_dir().join(format!("baton-session-{}", ns.name));
    std::fs::write(&key_file, "k".repeat(48)).unwrap();
    let serve = |secure: bool, key: Option<&std::path::Path>| {
        let key = key.map(|k| baton::server::SessionKey::from_file(k).unwrap());
        let ns = ns.name.clone();
        async move {
            let config = kube::Config::infer().await.unwrap();
            let settings = baton::server::ConsoleSettings {
                namespace: ns,
                namespaces: vec![],
                secure_cookies: secure,
            };
            let mut state = baton::server::ServerState::new(config, settings);
            if let Some(key) = key {
                state = state.with_session_key(key);
            }
            serve_state(state).await
        }
    };
    let (one, _a) = serve(false, Some(&key_file)).await;
    let (two, _b) = serve(false, Some(&key_file)).await;
    let (stranger, _c) = serve(false, None).await;
    let b = browser();

    // The attacker's page posts its own token to the victim's console: no form cookie.
    let posted = |origin: Option<&'static str>, cookie: Option<String>, nonce: String| {
        let mut request = b
            .post(format!("{one}/console/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("{}&nonce={nonce}", token_form(&alice)));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        request.send()
    };
    let r = posted(Some("https://attacker.example"), None, "guess".into())
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(session_cookie(&r).is_none());
    // Even with a form of this server's in hand, another origin is refused.
    let (cookie, nonce) = sign_in_form(&b, &one).await;
    let r = posted(
        Some("https://attacker.example"),
        Some(cookie.clone()),
        nonce.clone(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("another site"));
    // From the page itself (same origin, its nonce and cookie): signed in.
    let origin: &'static str = Box::leak(one.clone().into_boxed_str());
    let r = posted(Some(origin), Some(cookie), nonce).await.unwrap();
    assert_eq!(r.status(), 303);
    let session = cookie_of(&r);
    assert!(!session.contains(&alice[..20]), "{session}");

    // Another replica with the same key opens it; a server with another key does not.
    let runs = |base: String| {
        let session = session.clone();
        let b = b.clone();
        let path = format!("{base}/api/v1/namespaces/{}/runs", ns.name);
        async move {
            b.get(path)
                .header("cookie", session)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(runs(one.clone()).await, 200);
    assert_eq!(runs(two.clone()).await, 200);
    assert_eq!(runs(stranger.clone()).await, 401);

    // Over HTTPS the cookie is Secure and __Host- prefixed.
    let (secure, _d) = serve(true, Some(&key_file)).await;
    let r = b
        .get(format!("{secure}/console/login"))
        .send()
        .await
        .unwrap();
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        set.iter()
            .any(|c| c.starts_with("__Host-baton_login=") && c.contains("; Secure")),
        "{set:?}"
    );
    std::fs::remove_file(key_file).unwrap();
    ns.cleanup().await;
}

/// A namespace of 130 runs is shown 100 to a page with a link to the rest, and an inbox with
/// more runs waiting than it shows (50) shows 50 and says so: no page lists a namespace whole.
#[tokio::test]
async fn long_lists_come_in_pages_and_the_inbox_shows_a_bounded_number() {
    let ns = TestNamespace::new("console-pages").await;
    let (url, _server) = start_server().await;
    let alice = person(&ns, "alice", run_user_rules()).await;
    let runs: Api<AgentRun> = ns.api();
    for i in 0..130 {
        let run = scripted_run(
            &format!("r{i:03}"),
            vec![final_turn("hi", 0)],
            vec![],
            LeaseSpec::default(),
        );
        runs.create(&PostParams::default(), &run).await.unwrap();
    }
    for i in 0..55 {
        let status = serde_json::json!({"status": {"phase": "WaitingApproval", "pendingApproval": {
            "step": 1, "callId": "c1", "tool": "sh", "arguments": "{}",
            "requestedAt": "2026-12-04T00:00:00Z",
        }}});
        runs.patch_status(
            &format!("r{i:03}"),
            &Default::default(),
            &kube::api::Patch::Merge(&status),
        )
        .await
        .unwrap();
    }
    let b = browser();
    let cookie = cookie_of(&sign_in(&b, &url, &alice).await);
    let page = |path: String| {
        let (b, cookie) = (b.clone(), cookie.clone());
        async move {
            let r = b.get(path).header("cookie", cookie).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap()
        }
    };
    let first = page(format!("{url}/console?ns={}", ns.name)).await;
    assert_eq!(first.matches("<tr data-run=").count(), 100);
    let next = first
        .split("id=\"next-page\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a link to the next page")
        .replace("&amp;", "&");
    let second = page(format!("{url}{next}")).await;
    assert_eq!(second.matches("<tr data-run=").count(), 30);
    assert!(!second.contains("next-page"), "the last page links nowhere");
    let inbox = page(format!("{url}/console/approvals?ns={}", ns.name)).await;
    assert_eq!(inbox.matches("class=\"call\"").count(), 50);
    assert!(
        inbox.contains("id=\"inbox-more\""),
        "the inbox says more wait"
    );
    ns.cleanup().await;
}
