//! The console's pages rendered: what a model wrote is escaped, and a call not shown whole
//! offers no approval.

use super::*;

fn nav() -> Nav {
    Nav {
        namespace: "team-a".into(),
        csrf: "c".into(),
        waiting: 1,
    }
}

#[test]
fn what_a_model_wrote_is_escaped_on_the_page() {
    let page = ApprovalsPage {
        nav: nav(),
        calls: vec![WaitingCall {
            namespace: "team-a".into(),
            run: "r".into(),
            step: 1,
            tool: "sh\"><img src=x onerror=alert(1)>".into(),
            arguments: Some("<script>alert(1)</script>".into()),
            problem: String::new(),
        }],
        refused: vec![],
        more: false,
    };
    let body = page.render().unwrap();
    assert!(!body.contains("<script>alert"), "{body}");
    assert!(
        body.contains("&#60;script&#62;alert(1)&#60;/script&#62;"),
        "{body}"
    );
    assert!(!body.contains("<img src=x"), "{body}");
}

#[test]
fn a_call_that_cannot_be_shown_whole_offers_no_approve_button() {
    let page = ApprovalsPage {
        nav: nav(),
        calls: vec![WaitingCall {
            namespace: "team-a".into(),
            run: "r".into(),
            step: 1,
            tool: "sh".into(),
            arguments: None,
            problem: "not in the ledger".into(),
        }],
        refused: vec![],
        more: false,
    };
    let body = page.render().unwrap();
    assert!(!body.contains("value=\"Approve\""), "{body}");
    assert!(body.contains("value=\"Deny\""), "{body}");
}
