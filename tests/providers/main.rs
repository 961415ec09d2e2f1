//! The model providers against local servers speaking their APIs (no network). One test
//! binary (each file is a module): `anthropic` (the Messages API) and `openai` (Chat
//! Completions).

#[path = "../providers_support/mod.rs"]
mod server;

mod anthropic;
mod openai;
