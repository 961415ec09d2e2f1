// baton console: a little script over the browser's own EventSource. Everything a model or a
// tool wrote is put on the page with textContent, never parsed as HTML.
"use strict";

const csrf = () => document.body.dataset.csrf;

// Control and bidirectional formatting characters (an override reorders what a reader sees,
// so a command reads other than it runs) are shown as visible \u{..} escapes, as the server's
// pages and the CLI show them: the twin of src/display/neutral.rs `reorders_or_controls`.
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function visible(text) {
  return String(text).replace(HIDDEN, (c) => "\\u{" + c.codePointAt(0).toString(16) + "}");
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = visible(text);
  return e;
}

async function postJson(url, body) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", "x-baton-csrf": csrf() },
    body: JSON.stringify(body),
    credentials: "same-origin",
  });
  let answer = null;
  try { answer = await r.json(); } catch (_) { /* no body */ }
  if (!r.ok) throw new Error((answer && answer.message) || r.statusText);
  return answer;
}

// The model's text in an agent container's recorded call (`gatewayCall`: a whole answer, or a
// stream's events in order), for each API the gateway speaks. The page's twin of the
// transcript's ModelApi::answer_text (src/ledger/model/model_api.rs), text only: the tool
// calls an answer asks for are shown as the steps the tool gateway records.
function gatewayAnswer(api, r) {
  const events = Array.isArray(r) ? r : null;
  const texts = (xs) => xs.filter((x) => typeof x === "string").join("");
  const outputText = (resp) => texts((resp.output || []).flatMap((i) => (i.content || []).map((c) => c.text)));
  if (!r) return "";
  switch (api) {
    case "chat.completions":
      if (events) return texts(events.map((e) => e.choices && e.choices[0] && e.choices[0].delta && e.choices[0].delta.content));
      return texts([r.choices && r.choices[0] && r.choices[0].message && r.choices[0].message.content]);
    case "responses": {
      if (!events) return outputText(r);
      const last = events.slice().reverse().find((e) => e.response && e.response.output);
      return last ? outputText(last.response) : "";
    }
    case "messages":
      if (events) return texts(events.map((e) => e.delta && e.delta.text));
      return texts((r.content || []).map((b) => b.text));
    default: return "";
  }
}

// One run's ledger drawn into a list, each segment once (by its id). The server sends
// chunked events already rebuilt (src/server/whole.rs): nothing here decodes a chunk.
class LedgerView {
  constructor(list, aside) {
    this.list = list;
    this.aside = aside || {};
    this.seen = new Set();
    this.streaming = null;
    this.lastAssistant = null;
  }

  segment(id, data) {
    if (this.seen.has(id)) return;
    this.seen.add(id);
    for (const event of data.events || []) this.event(event, data.seq);
  }

  add(cls, label, text, seq) {
    const li = el("li", cls);
    li.dataset.seq = seq;
    if (label) li.appendChild(el("span", "label", label));
    if (text !== undefined) li.appendChild(el("span", "text", text));
    this.list.appendChild(li);
    return li;
  }

  event(e, seq) {
    if (e.type === "modelDelta") {
      if (!this.streaming) this.streaming = this.add("msg role-assistant streaming", "assistant", "", seq);
      this.streaming.querySelector(".text").textContent += visible(e.text);
      return;
    }
    if (e.type === "message" && this.streaming) {
      this.streaming.remove();
      this.streaming = null;
    }
    const a = this.aside;
    switch (e.type) {
      case "message":
        this.add("msg role-" + e.role, e.role, e.content, seq);
        if (e.role === "assistant") this.lastAssistant = e.content;
        break;
      case "gatewayCall":
        this.lastAssistant = gatewayAnswer(e.api, e.response);
        this.add("msg role-assistant gateway", "model call " + e.call + " (" + e.api + ")", this.lastAssistant, seq);
        break;
      case "gatewayDiverged": this.add("note", "diverged", "model call " + e.call + " differed from its record at " + e.field + ": it and every later call went to the model", seq); break;
      case "input": this.add("msg role-user", "input", e.content, seq); break;
      case "waitingInput": this.add("note", "asks", e.question, seq); break;
      case "stepIntent": this.add("step", "step " + e.step + ": " + e.tool, e.input, seq); break;
      case "stepResult": this.add(e.isError ? "result error" : "result", "result " + e.step, e.output, seq); break;
      case "stepUnknown":
        this.add("unknown", "step " + e.step, "effect unknown (attempt " + e.attempt + " died during it)", seq);
        if (a.unknown) a.unknown.appendChild(el("li", "", "step " + e.step + " (attempt " + e.attempt + ")"));
        break;
      case "approvalRequested": this.add("note", "approval", "step " + e.step + " waits for a decision", seq); break;
      case "approvalDecided": this.add("note", "decision", "step " + e.step + ": " + e.outcome + (e.reason ? " (" + e.reason + ")" : ""), seq); break;
      case "claimed":
      case "attemptStarted":
        if (a.timeline) a.timeline.appendChild(el("li", "", (e.type === "claimed" ? "claimed, fence " : "started, fence ") + e.fence + ": " + e.pod));
        break;
      case "handoff": this.add("note", "handoff", "the worker handed the run off", seq); break;
      case "final":
        // The answer is the last assistant message already shown; say it only if it differs.
        if (e.output !== this.lastAssistant) this.add("final", "answer", e.output, seq);
        break;
      case "failed": this.add("error", "failed", e.reason + ": " + e.message, seq); break;
      case "stopped": this.add("note", "stopped", "", seq); break;
      case "closed":
        if (a.timeline) a.timeline.appendChild(el("li", "", "closed at fence " + e.fence + ": " + e.reason));
        break;
      case "historyDropped": this.add("note", "history", "left out the oldest turns: " + e.turns.join(", "), seq); break;
      default: break;
    }
  }
}

function follow(url, handlers) {
  const source = new EventSource(url, { withCredentials: true });
  source.addEventListener("status", (m) => handlers.status && handlers.status(JSON.parse(m.data)));
  source.addEventListener("segment", (m) => handlers.segment(m.lastEventId, JSON.parse(m.data)));
  source.addEventListener("end", (m) => {
    const data = JSON.parse(m.data);
    if (handlers.end && handlers.end(data) === "close") source.close();
  });
  source.addEventListener("error", (m) => {
    if (m.data && handlers.failed) { handlers.failed(JSON.parse(m.data)); source.close(); }
  });
  return source;
}

function runPage() {
  const list = document.getElementById("transcript");
  if (!list) return;
  const view = new LedgerView(list, {
    timeline: document.getElementById("timeline"),
    unknown: document.getElementById("unknown"),
  });
  const phase = document.getElementById("phase");
  const message = document.getElementById("status-message");
  follow(list.dataset.events, {
    status: (s) => {
      phase.textContent = s.phase;
      message.textContent = visible(s.message || "");
      document.getElementById("pending").hidden = !s.pendingApproval;
    },
    segment: (id, data) => view.segment(id, data),
    end: (s) => { phase.textContent = s.deleted ? "Deleted" : s.phase; phase.dataset.ended = "true"; return "close"; },
    failed: (f) => { message.textContent = visible(f.message); },
  });
}

function threadPage() {
  const list = document.getElementById("conversation");
  if (!list) return;
  const views = new Map();
  const viewOf = (run) => {
    if (!views.has(run)) {
      const li = el("li", "turn");
      li.dataset.turn = run;
      li.appendChild(el("h3", "", run));
      const inner = el("ol", "transcript");
      li.appendChild(inner);
      list.appendChild(li);
      views.set(run, new LedgerView(inner));
    }
    return views.get(run);
  };
  follow(list.dataset.events, {
    status: (s) => { viewOf(s.run); },
    segment: (id, data) => viewOf(data.run).segment(id, data),
    end: (s) => {
      const li = list.querySelector('li.turn[data-turn="' + CSS.escape(s.run) + '"]');
      if (li) { li.dataset.ended = s.deleted ? "Deleted" : s.phase; }
    },
  });
  const form = document.getElementById("say");
  const error = document.getElementById("say-error");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const box = document.getElementById("message");
    error.hidden = true;
    try {
      await postJson(form.dataset.turns, { input: box.value });
      box.value = "";
    } catch (e) {
      error.textContent = visible(e.message);
      error.hidden = false;
    }
  });
}

function inbox() {
  for (const form of document.querySelectorAll("form.decide")) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const problem = form.querySelector(".error");
      const reason = form.querySelector("input[name=reason]").value;
      const body = { decision: ev.submitter.value, step: Number(form.dataset.step) };
      if (reason) body.reason = reason;
      try {
        await postJson(form.dataset.approvals, body);
        location.reload();
      } catch (e) {
        problem.textContent = visible(e.message);
        problem.hidden = false;
      }
    });
  }
}

function liveIndex() {
  const table = document.getElementById("runs");
  if (!table) return;
  const ns = document.body.dataset.namespace;
  const draw = (runs) => {
    const body = table.querySelector("tbody");
    body.replaceChildren();
    for (const r of runs) {
      const st = r.status || {};
      const tr = el("tr");
      tr.dataset.run = r.metadata.name;
      const link = el("a", "", r.metadata.name);
      link.href = "/console/ns/" + encodeURIComponent(ns) + "/runs/" + encodeURIComponent(r.metadata.name);
      const name = el("td"); name.appendChild(link); tr.appendChild(name);
      tr.appendChild(el("td", "phase phase-" + (st.phase || "Pending"), st.phase || "Pending"));
      tr.appendChild(el("td", "", r.spec.thread || ""));
      tr.appendChild(el("td", "", (st.usage && st.usage.totalTokens) || 0));
      tr.appendChild(el("td", "", (st.unknownEffects || []).length));
      tr.appendChild(el("td", "", st.attempt || 0));
      tr.appendChild(el("td", "", r.metadata.creationTimestamp || ""));
      body.appendChild(tr);
    }
  };
  setInterval(async () => {
    const r = await fetch(table.dataset.liveRuns, { credentials: "same-origin" });
    if (r.ok) draw((await r.json()).items);
  }, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  runPage();
  threadPage();
  inbox();
  liveIndex();
});
