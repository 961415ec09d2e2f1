//! The model providers against local servers speaking their APIs (no network). One test
//! binary (each file is a module): `anthropic` (the Messages API) and `openai` (Chat
//! Completions, its shared helpers and stream fixtures in `openai_support`), and both against
//! a server that misbehaves (`misbehaving`) and the LiteLLM proxy (`litellm_proxy`).

mod anthropic;
mod litellm;
mod misbehaving;
mod openai;
mod openai_support;

/// The tools as the worker offers them to the model.
fn offered(tools: Vec<baton::crd::v1alpha1::ToolSpec>) -> Vec<baton::worker::toolbox::ModelTool> {
    let spec = baton::crd::v1alpha1::AgentRun::builder("r")
        .tools(tools)
        .spec();
    baton::worker::toolbox::Toolbox::new(&spec, &Default::default())
        .offered()
        .to_vec()
}
