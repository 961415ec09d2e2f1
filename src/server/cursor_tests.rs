use super::*;

#[test]
fn an_event_id_is_the_run_uid_and_the_position() {
    let id = EventId::parse("7c1e-uid:12", "Last-Event-ID").unwrap();
    assert_eq!(id.uid, "7c1e-uid");
    assert_eq!(id.seq, 12);
    assert_eq!(id.to_string(), "7c1e-uid:12");
}

#[test]
fn malformed_ids_are_refused_naming_where_they_came_from() {
    for bad in ["12", "uid:", ":3", "uid:-1", "uid:x", "uid:1.5"] {
        let err = EventId::parse(bad, "Last-Event-ID").unwrap_err();
        assert!(err.to_string().starts_with("Last-Event-ID: "), "{err}");
    }
}

#[test]
fn the_header_wins_over_the_query() {
    let resume = Resume::from_request(Some("u:4"), Some("9")).unwrap();
    assert_eq!(resume.position_in("u"), 4);
}

#[test]
fn after_takes_a_position_or_an_id() {
    assert_eq!(
        Resume::from_request(None, Some("3"))
            .unwrap()
            .position_in("u"),
        3
    );
    assert_eq!(
        Resume::from_request(None, Some("u:5"))
            .unwrap()
            .position_in("u"),
        5
    );
    assert_eq!(
        Resume::from_request(None, Some("-2")).unwrap_err(),
        CursorError::BadAfter("-2".into())
    );
    assert_eq!(Resume::from_request(None, None).unwrap(), Resume::Start);
}

#[test]
fn an_id_of_another_run_starts_this_one_from_its_beginning() {
    let resume = Resume::from_request(Some("old-uid:40"), None).unwrap();
    assert_eq!(resume.position_in("new-uid"), 0);
}
