//! One admission review: reads what the rules need (the run a segment or Lease names, the
//! requesting user's permissions) and answers. The rules themselves are in `rules.rs`.

use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;

use super::borrow::{self, Kind};
use super::rules;
use crate::access::{self, Ask, RunFacts, Writer, user_may};
use crate::crd::v1alpha1::{AgentRun, AgentRunSpec, AgentThread, LedgerSegment};

/// Why a request is not admitted.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// A rule refuses it; the message names the field.
    #[error("{0}")]
    Refused(String),
    /// The object is not what its kind says.
    #[error("{kind} does not parse: {error}")]
    Malformed {
        kind: &'static str,
        error: serde_json::Error,
    },
    /// The check itself could not be made (the API server did not answer): refused, as
    /// `failurePolicy: Fail` would.
    #[error("baton's webhook could not check this request: {0}")]
    Api(#[from] kube::Error),
}

/// Answers admission reviews for AgentRuns, LedgerSegments and run Leases.
#[derive(Clone)]
pub struct Reviewer {
    client: Client,
    /// The user names baton's controller authenticates as.
    controller_users: Vec<String>,
    /// The largest AgentRun spec admitted, in bytes of JSON.
    max_spec_bytes: usize,
    /// The runs as the controller's watch last showed them, when it runs beside the webhook.
    known: Option<Store<AgentRun>>,
}

impl Reviewer {
    pub fn new(client: Client, controller_users: Vec<String>, max_spec_bytes: usize) -> Self {
        Self {
            client,
            controller_users,
            max_spec_bytes,
            known: None,
        }
    }

    /// Admits a ledger append that the run as `known` last showed it admits, without reading
    /// the run: every worker's append used to wait on a read of its run, and 200 runs' appends
    /// were more than a busy API server answered within the webhook's timeout (the appends
    /// failed, and handoffs waited on them). Safe for the fence, which only grows: a fence the
    /// copy admits, the live run admits too. What the copy names besides (the run's UID and its
    /// worker's ServiceAccount) can lag a change by the watch's latency: an append by the
    /// worker of a run deleted (or re-pointed to another ServiceAccount) that moment ago. Its
    /// readers check the UID again and report such a segment, and a namesake claims past it
    /// only once it is gone (`leftovers`). Anything the copy refuses is decided on the run read
    /// afresh.
    pub fn with_known_runs(mut self, known: Option<Store<AgentRun>>) -> Self {
        self.known = known;
        self
    }

    /// The answer to `review`.
    pub async fn answer(
        &self,
        review: AdmissionReview<DynamicObject>,
    ) -> AdmissionReview<DynamicObject> {
        let request = match request_of(review) {
            Ok(request) => request,
            Err(invalid) => return invalid,
        };
        let response = AdmissionResponse::from(&request);
        match self.check(&request).await {
            Ok(()) => response.into_review(),
            Err(err) => {
                let user = request.user_info.username.as_deref().unwrap_or("?");
                tracing::info!(%user, resource = %request.resource.resource, name = %request.name, %err, "refused");
                forbidden(response, err).into_review()
            }
        }
    }

    async fn check(&self, request: &AdmissionRequest<DynamicObject>) -> Result<(), ReviewError> {
        let namespace = request.namespace.clone().unwrap_or_default();
        match (request.resource.resource.as_str(), &request.operation) {
            ("agentruns", Operation::Create | Operation::Update) => {
                self.check_agent_run(request, &namespace).await
            }
            ("agentthreads", Operation::Create | Operation::Update) => {
                self.check_thread(request, &namespace).await
            }
            ("ledgersegments", Operation::Create) => {
                let seg: LedgerSegment = typed(request.object.as_ref(), "LedgerSegment")?;
                let user = username(&request.user_info);
                let known = self.known_facts(&namespace, &seg.spec.run);
                if self.segment_refusal(&seg, user, known.as_ref()).is_none() {
                    return Ok(());
                }
                let run = self.run_facts(&namespace, &seg.spec.run).await?;
                refused(self.segment_refusal(&seg, user, run.as_ref()))
            }
            ("leases", Operation::Update) => {
                let new: Lease = typed(request.object.as_ref(), "Lease")?;
                let old: Lease = typed(request.old_object.as_ref(), "Lease")?;
                let name = new.name_any();
                let Some(run) = crate::fence::run_of_lease(&name) else {
                    return Ok(());
                };
                let user = username(&request.user_info);
                if access::lease_update_is_plain(
                    &old,
                    &new,
                    user,
                    &self.controller_users,
                    &namespace,
                    run,
                ) {
                    return Ok(());
                }
                let run = self.run_facts(&namespace, run).await?;
                let writer = Writer::of(user, &self.controller_users, run.as_ref());
                refused(access::lease_refusal(&old, &new, writer, user))
            }
            _ => Ok(()),
        }
    }

    async fn check_agent_run(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        namespace: &str,
    ) -> Result<(), ReviewError> {
        let (new, old): (AgentRun, _) = new_and_old(request, "AgentRun")?;
        let user = username(&request.user_info);
        let controller = self.controller_users.iter().any(|c| c == user);
        let old_meta = old.as_ref().map(|o| &o.metadata);
        if !controller {
            refused(rules::membership_refusal(old_meta, &new.metadata, user))?;
        }
        refused(rules::trace_refusal(old_meta, &new.metadata))?;
        let old = old.map(|r| r.spec);
        if controller && old.as_ref().is_some_and(|o| rules::is_join(o, &new.spec)) {
            return refused(rules::oversized_spec(&new.spec, self.max_spec_bytes));
        }
        if let Some(old) = &old {
            refused(rules::joined_turn_refusal(old, &new.spec))?;
        }
        refused(rules::oversized_spec(&new.spec, self.max_spec_bytes))?;
        let borrowing = self.as_joined(namespace, old.as_ref(), &new).await?;
        let asks = rules::run_asks(old.as_ref(), &borrowing);
        self.ask(&request.user_info, namespace, &asks, Kind::AgentRun)
            .await
    }

    /// A thread lends its agent and worker to every turn: its writer is asked for all it
    /// borrows, as a run's creator is (the one borrow rule), and it is bounded like a run.
    async fn check_thread(
        &self,
        request: &AdmissionRequest<DynamicObject>,
        namespace: &str,
    ) -> Result<(), ReviewError> {
        let (new, old): (AgentThread, _) = new_and_old(request, "AgentThread")?;
        refused(rules::oversized_spec(&new.spec, self.max_spec_bytes))?;
        let asks = rules::thread_asks(old.map(|t| t.spec).as_ref(), &new.spec);
        self.ask(&request.user_info, namespace, &asks, Kind::AgentThread)
            .await
    }

    /// Asks the API server whether `user` holds every one of `asks`; refuses naming each
    /// one they lack.
    async fn ask(
        &self,
        user: &UserInfo,
        namespace: &str,
        asks: &[Ask],
        kind: Kind,
    ) -> Result<(), ReviewError> {
        let answers =
            futures::future::try_join_all(asks.iter().map(|ask| self.may(user, namespace, ask)))
                .await?;
        let missing: Vec<String> = asks
            .iter()
            .zip(answers)
            .filter(|(_, allowed)| !allowed)
            .map(|(ask, _)| borrow::refusal(ask, username(user), namespace, kind))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ReviewError::Refused(missing.join("; ")))
        }
    }

    /// What a run borrows: for a turn being created, its thread's agent and worker (as if
    /// written in it), at the thread generation the mutating webhook stamped on it; for
    /// anything else, its own spec. A turn that has not joined stays in its thread (its stamp
    /// is of that thread). A thread that does not exist lends nothing (the controller fails
    /// the turn, naming it).
    async fn as_joined(
        &self,
        namespace: &str,
        old: Option<&AgentRunSpec>,
        new: &AgentRun,
    ) -> Result<AgentRunSpec, ReviewError> {
        let spec = &new.spec;
        let Some(thread) = borrowed_thread(spec) else {
            return Ok(spec.clone());
        };
        if let Some(old) = old {
            return match old.thread == spec.thread {
                true => Ok(spec.clone()),
                false => Err(ReviewError::Refused(format!(
                    "spec.thread: a turn stays in the thread it was created for ({:?}); \
                     create a turn of {thread:?} instead",
                    old.thread.as_deref().unwrap_or_default()
                ))),
            };
        }
        let Some(found) = self.thread_now(namespace, thread).await? else {
            return Ok(spec.clone());
        };
        let stamped = new
            .annotations()
            .get(crate::crd::THREAD_GENERATION_ANNOTATION);
        let generation = found.metadata.generation.unwrap_or_default();
        refused(rules::stamp_refusal(
            thread,
            stamped.map(String::as_str),
            generation,
        ))?;
        Ok(rules::turn_as_joined(spec, &found.spec))
    }

    /// The mutating webhook's answer: a turn being created is stamped with its thread's
    /// generation now (the one the validating webhook then asks its creator about).
    pub async fn stamp(
        &self,
        review: AdmissionReview<DynamicObject>,
    ) -> AdmissionReview<DynamicObject> {
        let request = match request_of(review) {
            Ok(request) => request,
            Err(invalid) => return invalid,
        };
        let response = AdmissionResponse::from(&request);
        match self.stamp_patch(&request).await {
            Ok(None) => response.into_review(),
            Ok(Some(patch)) => match response.clone().with_patch(patch) {
                Ok(patched) => patched.into_review(),
                Err(err) => {
                    forbidden(response, ReviewError::Refused(err.to_string())).into_review()
                }
            },
            Err(err) => forbidden(response, err).into_review(),
        }
    }

    async fn stamp_patch(
        &self,
        request: &AdmissionRequest<DynamicObject>,
    ) -> Result<Option<json_patch::Patch>, ReviewError> {
        if request.resource.resource != "agentruns" || request.operation != Operation::Create {
            return Ok(None);
        }
        let run: AgentRun = typed(request.object.as_ref(), "AgentRun")?;
        let Some(thread) = borrowed_thread(&run.spec) else {
            return Ok(None);
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let Some(found) = self.thread_now(&namespace, thread).await? else {
            return Ok(None);
        };
        let generation = found.metadata.generation.unwrap_or_default();
        Ok(Some(rules::stamp_patch(
            run.metadata.annotations.is_some(),
            generation,
        )))
    }

    /// Thread `name` as it is now (each half of the webhook reads it when it is asked: the
    /// validating half must see what the creator is asked about), None if there is none.
    async fn thread_now(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<AgentThread>, ReviewError> {
        let api = Api::<AgentThread>::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?)
    }

    /// Whether `user` holds `ask` themselves (a SubjectAccessReview on their behalf).
    async fn may(&self, user: &UserInfo, namespace: &str, ask: &Ask) -> Result<bool, ReviewError> {
        Ok(user_may(&self.client, user, namespace, ask).await?)
    }

    fn segment_refusal(
        &self,
        seg: &LedgerSegment,
        user: &str,
        run: Option<&RunFacts>,
    ) -> Option<String> {
        let writer = Writer::of(user, &self.controller_users, run);
        access::segment_refusal(seg, writer, user, run)
    }

    /// Run `name` of `namespace` as the controller's watch last showed it, if it did.
    fn known_facts(&self, namespace: &str, name: &str) -> Option<RunFacts> {
        let key = ObjectRef::new(name).within(namespace);
        let run = self.known.as_ref()?.get(&key)?;
        Some(RunFacts::of(&run))
    }

    /// The live run `name` of `namespace`, read from the API server (what decides when the
    /// watch's copy does not admit: a worker's first append may follow its claim by
    /// milliseconds, before the copy shows the claim).
    async fn run_facts(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<RunFacts>, ReviewError> {
        let api = Api::<AgentRun>::namespaced(self.client.clone(), namespace);
        let Some(run) = api.get_opt(name).await? else {
            return Ok(None);
        };
        Ok(Some(RunFacts::of(&run)))
    }
}

fn username(user: &UserInfo) -> &str {
    user.username.as_deref().unwrap_or("")
}

fn refused(refusal: Option<String>) -> Result<(), ReviewError> {
    refusal.map_or(Ok(()), |text| Err(ReviewError::Refused(text)))
}

/// The request a review carries, or the answer to a review that carries none.
#[allow(clippy::result_large_err)] // the Err is the answer itself, returned at once
fn request_of(
    review: AdmissionReview<DynamicObject>,
) -> Result<AdmissionRequest<DynamicObject>, AdmissionReview<DynamicObject>> {
    review
        .try_into()
        .map_err(|_| AdmissionResponse::invalid("no request in the review").into_review())
}

/// The request's object and, on an update, the object it replaces, as `kind`.
fn new_and_old<K: DeserializeOwned>(
    request: &AdmissionRequest<DynamicObject>,
    kind: &'static str,
) -> Result<(K, Option<K>), ReviewError> {
    let new = typed(request.object.as_ref(), kind)?;
    let old = request.old_object.as_ref();
    let old = old.map(|o| typed(Some(o), kind)).transpose()?;
    Ok((new, old))
}

fn typed<K: DeserializeOwned>(
    object: Option<&DynamicObject>,
    kind: &'static str,
) -> Result<K, ReviewError> {
    let value =
        serde_json::to_value(object).map_err(|error| ReviewError::Malformed { kind, error })?;
    serde_json::from_value(value).map_err(|error| ReviewError::Malformed { kind, error })
}

/// A refusal the API server reports as 403 Forbidden, with baton's message.
fn forbidden(response: AdmissionResponse, err: ReviewError) -> AdmissionResponse {
    let mut response = response.deny(err.to_string());
    response.result.code = 403;
    response.result.reason = "Forbidden".into();
    response
}

/// The thread a turn borrows its agent and worker from: `spec.thread`, when the run names no
/// agent of its own.
fn borrowed_thread(spec: &AgentRunSpec) -> Option<&str> {
    spec.thread.as_deref().filter(|_| spec.agent.is_none())
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
