//! The console's sign-in and its guards, over HTTP: a page without a session goes to the
//! sign-in; a token the API server refuses is refused; a signed-in browser sees what its token
//! may see and is refused the rest; a write by cookie needs the CSRF header; `baton console`'s
//! one-time address signs in once.

use std::sync::Arc;

use crate::common::TestNamespace;
use crate::common::worker_proc::*;
use crate::support::*;
use baton::crd::v1alpha1::{AgentRun, LeaseSpec};
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

fn cookie_of(response: &reqwest::Response) -> String {
    let set = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    set.split(';').next().unwrap().to_string()
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
    let r = b
        .post(format!("{url}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(token_form("not-a-real-token"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("refused this token"));

    let r = b
        .post(format!("{url}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(token_form(&alice))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let cookie = cookie_of(&r);
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
    assert!(r.headers().get("set-cookie").is_none());
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
    assert!(
        r.headers().get("set-cookie").is_none(),
        "the address signs in once"
    );
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
