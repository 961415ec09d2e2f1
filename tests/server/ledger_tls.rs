//! The ledger server over TLS: the real `baton server` with a certificate for 127.0.0.1 from
//! a CA of the test's own; the controller trusting that CA alone and handing it to the worker
//! pod; a run kept in PostgreSQL written and read over HTTPS. A writer that trusts another CA,
//! or the system's roots, and a plain-HTTP writer get nothing.

use crate::pg_runs::{
    TlsFiles, free_addr, server_process_with, start_pg_controller_with, start_pg_worker,
    test_controller, worker_env,
};
use crate::transcript_cli::exec_kubeconfig;
use baton::crd::v1alpha1::{AgentRun, LeaseSpec, Phase};
use baton::ledger::served::LEDGER_AUDIENCE;
use baton::ledger::{LedgerClient, LedgerToken};
use baton_testkit::common::TestNamespace;
use baton_testkit::common::worker_proc::*;
use baton_testkit::rbac::mint_token_for;
use baton_testkit::server::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};

#[tokio::test]
async fn a_run_kept_in_postgresql_is_written_over_tls_to_the_server_its_ca_names() {
    let ns = TestNamespace::new("served-tls").await;
    let tls = TlsFiles::issue(&ns.name);
    let (controller_user, seal) = test_controller(&ns).await;
    let addr = free_addr().await;
    let base = format!("https://{addr}");
    let _server = server_process_with(&addr, &controller_user, Some(&tls)).await;
    let writer = LedgerClient::new(&base, LedgerToken::Fixed(seal.clone()));
    let _controller = start_pg_controller_with(&ns, writer.trusting(&tls.ca_pem).unwrap());
    let lease = LeaseSpec {
        duration_seconds: 4,
        renew_seconds: 1,
        startup_seconds: 60,
    };
    let run = scripted_run("tls", vec![final_turn("over TLS", 500)], vec![], lease);
    let runs: Api<AgentRun> = ns.api();
    let uid = create_run(&runs, &run).await;

    // The worker pod is given the CA with the address; its worker writes over HTTPS.
    let mut worker = start_pg_worker(&ns, "tls", 1).await;
    let pod = ns.api::<Pod>().get("tls-w1").await.unwrap();
    let given = worker_env(&pod, "BATON_LEDGER_SERVER_CA");
    assert_eq!(given.as_deref(), Some(tls.ca_pem.as_str()));
    wait_phase(&runs, "tls", Phase::Succeeded, T).await;
    assert_eq!(worker.wait(T).await, 0, "{}", worker.log_text());
    assert_eq!(runs.get("tls").await.unwrap().uid(), Some(uid.clone()));

    // A reader of transcripts reads the rows over HTTPS; one that does not trust the
    // server's CA gets nothing, and says why.
    let reader = person(&ns, "alice", run_user_rules()).await;
    let token = mint_token_for(&ns.client, &ns.name, "alice", LEDGER_AUDIENCE, None).await;
    let other = TlsFiles::issue(&format!("{}-other", ns.name));
    let read = |server: LedgerClient| {
        let ledger = server.for_run(&ns.name, "tls", &uid);
        async move { ledger.list().await.map(|rows| rows.len()) }
    };
    let trusted = LedgerClient::new(&base, LedgerToken::Fixed(token.clone()));
    let trusted = read(trusted.trusting(&tls.ca_pem).unwrap()).await;
    assert!(
        trusted.as_ref().is_ok_and(|n| *n >= 2),
        "the trusted reader reads: {trusted:?}"
    );
    for (who, server) in [
        (
            "the system's roots",
            LedgerClient::new(&base, LedgerToken::Fixed(seal.clone())),
        ),
        (
            "another CA",
            LedgerClient::new(&base, LedgerToken::Fixed(seal.clone()))
                .trusting(&other.ca_pem)
                .unwrap(),
        ),
    ] {
        let refused = read(server).await.unwrap_err().to_string();
        assert!(refused.contains("certificate"), "{who}: {refused}");
    }
    let plain = LedgerClient::new(&format!("http://{addr}"), LedgerToken::Fixed(token));
    assert!(read(plain).await.is_err(), "plain HTTP is not served");
    let not_a_ca = LedgerClient::new(&base, LedgerToken::Fixed(seal)).trusting("no PEM here");
    assert!(not_a_ca.unwrap_err().to_string().contains("no certificate"));

    // `baton transcript --server https://…` with the CA named, and refused without it.
    let alice = exec_kubeconfig(&ns, "alice", &reader);
    let transcript = |ca: Option<&str>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_baton"));
        command
            .args(["transcript", "tls", "-n", &ns.name, "--server", &base])
            .env("KUBECONFIG", &alice);
        if let Some(ca) = ca {
            command.args(["--server-ca-file", ca]);
        }
        async move { command.output().await.unwrap() }
    };
    let out = transcript(Some(&tls.ca)).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("over TLS"), "{text}");
    let out = transcript(None).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("certificate"),
        "{stderr}"
    );
    ns.cleanup().await;
}
