//! The controller's one writer: every API write the controller makes goes through
//! [`Context::write`] (a plain request) or [`Context::write_fenced`] (a write of the ledger or
//! Lease clients, which classify their own refusals). Each checks that this replica leads
//! right before the request goes out, counts the write by kind, and, for a plain request,
//! reads the API server's refusal once: so "every controller write checks leadership" holds
//! by construction, and no action matches HTTP statuses by hand.
//!
//! (The election's own writes are the one exception: they are how leadership is decided.)

use std::time::Instant;

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::Error;
use super::context::Context;
use crate::crd::v1alpha1::{AgentRun, AgentRunStatus};
use crate::kube_util::{is_already_exists, is_conflict, is_not_found};

/// What a controller write came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wrote<T> {
    /// The API server took it.
    Written(T),
    /// 409 on a stale resourceVersion or a failed precondition: the object changed since it
    /// was read; re-read and re-decide.
    Conflict,
    /// 404: the object (or its namespace) is gone.
    Gone,
    /// 409 AlreadyExists on a create: someone (perhaps an earlier pass) created it.
    Exists,
}

impl<T> Wrote<T> {
    /// The API server's answer, with the refusals a controller decides on read out of it.
    fn classify(answer: Result<T, kube::Error>) -> Result<Self, kube::Error> {
        match answer {
            Ok(obj) => Ok(Wrote::Written(obj)),
            Err(err) if is_already_exists(&err) => Ok(Wrote::Exists),
            Err(err) if is_conflict(&err) => Ok(Wrote::Conflict),
            Err(err) if is_not_found(&err) => Ok(Wrote::Gone),
            Err(err) => Err(err),
        }
    }

    /// The object written, if it was.
    pub fn written(self) -> Option<T> {
        match self {
            Wrote::Written(obj) => Some(obj),
            _ => None,
        }
    }
}

/// What applying an action came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Nothing to do, or done: look again when something changes (or at the decided time).
    Done,
    /// The caches were behind the API server: look again soon.
    Requeue,
    /// The run changed under a CAS: re-read it and re-decide.
    Conflict,
}

impl Context {
    /// Refuses when this replica does not lead: called right before every write, here only.
    fn check_leader(&self) -> Result<(), Error> {
        if self.leadership().is_leader(Instant::now()) {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    /// A controller write of `kind` (seal, status, lease, pod, ...): refused with
    /// [`Error::NotLeader`] before `request` is sent when this replica does not lead.
    /// (`request` is a future: nothing goes out until it is awaited here.)
    pub async fn write<T>(
        &self,
        kind: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Wrote<T>, Error> {
        self.check_leader()?;
        let wrote = Wrote::classify(request.await)?;
        if let Wrote::Written(_) = wrote {
            self.metrics().api_write(kind);
        }
        Ok(wrote)
    }

    /// A write through a fenced client (the segment store's append, the Lease client's move):
    /// the leadership check and the count, with the client's own verdict returned as it is
    /// (the caller tells a lost run from an error).
    pub async fn write_fenced<T, E>(
        &self,
        kind: &'static str,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<Result<T, E>, Error> {
        self.check_leader()?;
        let answer = request.await;
        if answer.is_ok() {
            self.metrics().api_write(kind);
        }
        Ok(answer)
    }

    /// The controller's status write: one CAS on the run as read. None: the run changed since
    /// it was read (re-read and re-decide). On success the version it replaced is remembered:
    /// until the watch cache moves past it, the cache is behind.
    pub async fn write_status(
        &self,
        run: &AgentRun,
        status: AgentRunStatus,
    ) -> Result<Option<AgentRun>, Error> {
        let mut desired = run.clone();
        let mut status = status;
        // The first status write records where the run's ledger is kept; every later one
        // carries it over (statuses start from the run's own), so it never changes.
        status
            .ledger_backend
            .get_or_insert(self.ledgers().for_new_runs());
        desired.status = Some(status);
        let api = self.runs_api(run);
        let (name, params) = (run.name_any(), PostParams::default());
        let request = api.replace_status(&name, &params, &desired);
        let Some(updated) = self.write("status", request).await?.written() else {
            return Ok(None);
        };
        let replaced = run.resource_version();
        self.remember(run, |m| m.replaced_version = replaced);
        Ok(Some(updated))
    }

    /// Reads object `name` and deletes it, by its UID (never a namesake made since), when
    /// `ours` says it is the controller's to delete. Gone already, or replaced meanwhile (the
    /// precondition's Conflict): nothing to do.
    pub async fn delete_if<K>(
        &self,
        kind: &'static str,
        api: &Api<K>,
        name: &str,
        ours: impl FnOnce(&K) -> bool,
    ) -> Result<(), Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        match api.get_opt(name).await?.filter(ours) {
            Some(obj) => self.delete_of_uid(kind, api, &obj).await,
            None => Ok(()),
        }
    }

    /// Deletes `obj`, read before, only if it is still that very object (its UID). Gone
    /// already, or Conflict (not that object any more): either is fine.
    pub async fn delete_of_uid<K>(
        &self,
        kind: &'static str,
        api: &Api<K>,
        obj: &K,
    ) -> Result<(), Error>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: obj.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.write(kind, api.delete(&obj.name_any(), &params))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn refused(code: u16, reason: &str) -> Result<(), kube::Error> {
        Err(kube::Error::Api(Box::new(
            Status::failure("refused", reason).with_code(code),
        )))
    }

    #[test]
    fn a_refusal_is_read_once_into_what_the_controller_decides_on() {
        assert_eq!(Wrote::classify(Ok(7)).unwrap(), Wrote::Written(7));
        assert_eq!(
            Wrote::classify(refused(409, "AlreadyExists")).unwrap(),
            Wrote::Exists
        );
        assert_eq!(
            Wrote::classify(refused(409, "Conflict")).unwrap(),
            Wrote::Conflict
        );
        assert_eq!(
            Wrote::classify(refused(404, "NotFound")).unwrap(),
            Wrote::Gone
        );
        assert!(Wrote::classify(refused(500, "InternalError")).is_err());
    }
}
