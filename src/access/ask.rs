//! A right a user is asked for before baton acts on their behalf: by the webhook for what a
//! manifest borrows (`webhook::borrow`), by `baton server` for reading a run's ledger.

/// A permission the requesting user must hold, because a field of the manifest would make
/// baton use it on their behalf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// The field that needs it, as the user wrote it (`spec.worker.image`).
    pub field: String,
    pub verb: &'static str,
    /// The API group of `resource` (`""`: the core group).
    pub group: &'static str,
    pub resource: &'static str,
    /// The object, when the permission is on one object (a Secret); None: the namespace.
    pub name: Option<String>,
}

impl Ask {
    pub fn get_secret(field: String, name: &str) -> Ask {
        Ask {
            field,
            verb: "get",
            group: "",
            resource: "secrets",
            name: Some(name.to_string()),
        }
    }

    pub fn create(field: &str, group: &'static str, resource: &'static str) -> Ask {
        Ask {
            field: field.to_string(),
            verb: "create",
            group,
            resource,
            name: None,
        }
    }

    /// A turn's worker reads its thread's earlier turns' ledgers: its creator must be able
    /// to read them too.
    pub fn read_ledgers(field: &str) -> Ask {
        Ask {
            field: field.to_string(),
            verb: "list",
            group: crate::crd::GROUP,
            resource: "ledgersegments",
            name: None,
        }
    }
}
