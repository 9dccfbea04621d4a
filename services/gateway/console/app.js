// The agentstream console: a small page over the gateway's own API (nothing else is loaded).
// Views (by the URL's hash): #/ conversations (found by agent, state, time and metadata, a page
// at a time), #/c/<trace id> a conversation: its events with absolute times and durations, each
// turn's metadata and waterfall (model calls and tool runs, subagent runs nested), the model's text
// and tool-call arguments as they stream, a form to publish a turn with its busy policy, cancel and
// fork, approve or deny a tool call that awaits a person; #/explain/<trace id>/<turn id>/<step> one model call's request, #/dead the dead letters.
// Every text is set with textContent (never parsed as HTML); bar positions are set through the
// CSSOM (element.style), which the page's CSP (style-src 'self') allows, never a style attribute.
"use strict";

const KEY_STORE = "agentstream.console.key";
let current = null; // the view's teardown (timers, open streams)

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "onclick") node.addEventListener("click", value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const key = () => sessionStorage.getItem(KEY_STORE);
// an id is one path segment, "/" included (%2F): no "." or ".." segment for the browser to normalise
const enc = (id) => encodeURIComponent(id);
const when = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "");
const pad = (n, width = 2) => String(n).padStart(width, "0");
// an absolute time, to the millisecond, in the browser's time zone
const stamp = (ms) => {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
};
const entryMs = (id) => Number(String(id).split("-")[0]); // a stream entry id's time (Unix ms)
const duration = (ms) => {
  if (ms == null || Number.isNaN(ms)) return "?";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
};
const newId = (prefix) => `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
let agentNames = []; // the key's agents (from whoami)

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { Authorization: `Bearer ${key()}`, "Content-Type": "application/json", ...(options.headers || {}) } });
  if (response.status === 401) { askKey("That key was refused (401)."); throw new Error("401"); }
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.detail ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : `HTTP ${response.status}`);
  return body;
}

// Server-sent events over fetch (EventSource cannot send the Authorization header).
async function follow(path, { onEvent, signal, lastEventId }) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (lastEventId) headers["Last-Event-ID"] = lastEventId;
  const response = await fetch(path, { headers, signal });
  if (!response.ok) throw new Error(`stream: HTTP ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let last = lastEventId;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return { last, ended: false };
    buffer += value.replace(/\r\n?/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const sse = { event: "message", data: "", id: null };
      for (const line of block.split("\n")) {
        const colon = line.indexOf(":");
        if (colon === 0) continue; // a keep-alive comment
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") sse.event = text;
        else if (field === "data") sse.data += (sse.data ? "\n" : "") + text;
        else if (field === "id") sse.id = text;
      }
      if (sse.id) last = sse.id;
      if (sse.data) onEvent(sse.event, JSON.parse(sse.data));
    }
  }
}

function stateBadge(state) {
  const label = { waiting_on_tools: "waiting on tools" }[state] || state;
  return el("span", { class: `state ${state}`, "data-testid": "state" }, label);
}

// --- the key ------------------------------------------------------------------------------

function askKey(message = "") {
  stop();
  const form = document.getElementById("key-form").content.firstElementChild.cloneNode(true);
  form.querySelector(".error").textContent = message;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORE, form.key.value.trim());
    try { await whoami(); route(); } catch (error) { if (error.message !== "401") form.querySelector(".error").textContent = error.message; }
  });
  document.getElementById("main").replaceChildren(form);
  document.getElementById("who").textContent = "";
  document.getElementById("forget").hidden = true;
}

async function whoami() {
  const me = await api("/v1/agents");
  agentNames = me.agents.map((a) => a.name);
  document.getElementById("who").textContent = `key ${me.key} · agents ${me.agents.map((a) => a.name).join(", ") || "none"}`;
  document.getElementById("forget").hidden = false;
}

// --- views ----------------------------------------------------------------------------------

const STATES = ["running", "waiting_on_tools", "ended", "failed", "cancelled"];

function agentSelect(name, { any = true, chosen = "" } = {}) {
  const names = agentNames.includes(chosen) || !chosen ? agentNames : [chosen, ...agentNames];
  return el("select", { name, "data-testid": `${name}-select` }, any ? el("option", { value: "" }, "any agent") : null,
    names.map((n) => el("option", { value: n, selected: n === chosen }, n)));
}

// a datetime-local input's value as Unix ms (the browser's time zone), or null
const localMs = (value) => (value ? new Date(value).getTime() : null);

function conversationsView(main) {
  const body = el("tbody");
  const error = el("p", { class: "error", "data-testid": "list-error" });
  const pageNote = el("span", { class: "muted", "data-testid": "page-note" });
  const form = el("form", { class: "filters", "data-testid": "filters" },
    el("label", {}, "Agent ", agentSelect("agent")),
    el("label", {}, "State ", el("select", { name: "state", "data-testid": "state-select" }, el("option", { value: "" }, "any state"), STATES.map((s) => el("option", { value: s }, s.replace(/_/g, " "))))),
    el("label", {}, "From ", el("input", { type: "datetime-local", name: "from", step: 1, "data-testid": "from-input" })),
    el("label", {}, "To ", el("input", { type: "datetime-local", name: "to", step: 1, "data-testid": "to-input" })),
    el("label", {}, "Metadata ", el("input", { name: "meta", placeholder: "key=value, key=value", size: 24, "data-testid": "meta-input" })),
    el("label", {}, "Per page ", el("select", { name: "limit", "data-testid": "limit-select" }, [10, 25, 50, 100].map((n) => el("option", { value: n, selected: n === 25 }, n)))),
    el("button", { type: "submit", "data-testid": "search" }, "Find"));
  const newer = el("button", { type: "button", "data-testid": "newer", disabled: true }, "← Newest");
  const older = el("button", { type: "button", "data-testid": "older", disabled: true }, "Older →");
  const start = startForm();
  main.replaceChildren(el("h1", {}, "Conversations"), form, error,
    el("table", { "data-testid": "conversations" }, el("thead", {}, el("tr", {}, ["Conversation", "State", "Agent", "Newest turn", "Answer or reason", "Updated"].map((h) => el("th", {}, h)))), body),
    el("div", { class: "bar pager" }, newer, older, pageNote), start);
  let cursor = null; // before_ms of the page shown (null: the newest)
  let pages = 0;
  const query = () => {
    const q = new URLSearchParams({ limit: form.limit.value });
    if (form.agent.value) q.set("agent", form.agent.value);
    if (form.state.value) q.set("state", form.state.value);
    const from = localMs(form.from.value); const to = localMs(form.to.value);
    if (from != null) q.set("after_ms", from);
    if (to != null) q.set("before_ms", to);
    for (const pair of form.meta.value.split(",").map((x) => x.trim()).filter(Boolean)) q.append("meta", pair);
    if (cursor != null) q.set("before_ms", cursor); // the page's own cursor (older than "To")
    return q;
  };
  const refresh = async () => {
    try {
      const { conversations, next_before_ms: next } = await api(`/v1/conversations?${query()}`);
      error.textContent = "";
      body.replaceChildren(...conversations.map((c) => el("tr", { "data-trace": c.trace_id },
        el("td", {}, el("a", { href: `#/c/${enc(c.trace_id)}`, "data-testid": "conversation-link" }, c.trace_id),
          Object.keys(c.metadata || {}).length ? el("div", { class: "muted", "data-testid": "row-metadata" }, Object.entries(c.metadata).map(([k, v]) => `${k}=${v}`).join(" · ")) : null),
        el("td", {}, stateBadge(c.state), c.pending_tools.length ? el("div", { class: "muted" }, c.pending_tools.join(", ")) : null),
        el("td", {}, c.agent),
        el("td", { class: "text" }, c.text, el("div", { class: "muted" }, `${c.turns} turn(s)`)),
        el("td", { class: "text" }, c.state === "ended" ? c.answer : c.reason ? `${c.code}: ${c.reason}` : ""),
        el("td", { class: "muted", title: c.updated_ms ? new Date(c.updated_ms).toISOString() : "" }, c.updated_ms ? stamp(c.updated_ms) : ""))));
      if (!conversations.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No conversations match.")));
      older.disabled = next == null;
      older.dataset.next = next ?? "";
      newer.disabled = cursor == null;
      pageNote.textContent = `page ${pages + 1} · ${conversations.length} shown`;
    } catch (e) { if (e.message !== "401") error.textContent = e.message; }
  };
  form.addEventListener("submit", (event) => { event.preventDefault(); cursor = null; pages = 0; refresh(); });
  older.addEventListener("click", () => { cursor = Number(older.dataset.next); pages += 1; refresh(); });
  newer.addEventListener("click", () => { cursor = null; pages = 0; refresh(); });
  refresh();
  const timer = setInterval(() => { if (cursor == null) refresh(); }, 2000); // the newest page stays live
  return () => clearInterval(timer);
}

// a form that publishes a turn: to traceId, or (without it) to a new conversation named in the form
function publishForm({ traceId = null, agent = "", onSent }) {
  const result = el("span", { class: "muted", "data-testid": "publish-result" });
  const form = el("form", { class: "publish", "data-testid": traceId ? "publish-form" : "start-form" },
    traceId ? null : el("label", {}, "Conversation ", el("input", { name: "trace", value: newId("console"), required: true, size: 28, "data-testid": "trace-input" })),
    el("label", {}, "Agent ", agentSelect("agent", { any: false, chosen: agent })),
    el("textarea", { name: "text", rows: 2, required: true, placeholder: "Message", "data-testid": "publish-text" }),
    traceId ? el("label", { title: "What this turn does when the conversation has a running turn" }, "If busy ",
      el("select", { name: "policy", "data-testid": "policy-select" },
        [["queue", "queue: wait behind it"], ["reject", "reject: fail at once"], ["interrupt", "interrupt: cancel it, keep its work"], ["rollback", "rollback: cancel it and leave it out"]]
          .map(([v, label]) => el("option", { value: v }, label)))) : null,
    el("label", {}, "Metadata ", el("input", { name: "meta", placeholder: "key=value, key=value", size: 20, "data-testid": "publish-meta" })),
    el("label", { title: "Every tool call of this turn waits for a person's approval" }, el("input", { type: "checkbox", name: "approval", "data-testid": "publish-approval" }), " approve each tool call"),
    el("button", { type: "submit", "data-testid": traceId ? "publish" : "start" }, traceId ? "Send" : "Start"), result);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const metadata = {};
    for (const pair of form.meta.value.split(",").map((x) => x.trim()).filter(Boolean)) {
      const cut = pair.indexOf("=");
      if (cut <= 0) { result.textContent = `metadata ${JSON.stringify(pair)} is not key=value`; return; }
      metadata[pair.slice(0, cut).trim()] = pair.slice(cut + 1).trim();
    }
    const turn = { trace_id: traceId || form.trace.value.trim(), turn_id: newId("turn"), agent: form.agent.value, text: form.text.value, metadata };
    if (traceId) turn.busy_policy = form.policy.value;
    if (form.approval.checked) turn.approval = ["*"];
    try {
      const r = await api("/v1/turns", { method: "POST", body: JSON.stringify(turn) });
      result.textContent = `turn ${r.turn_id} sent${turn.busy_policy ? ` (if busy: ${turn.busy_policy})` : ""}`;
      form.text.value = "";
      if (onSent) onSent(r);
    } catch (e) { if (e.message !== "401") result.textContent = e.message; }
  });
  return form;
}

function startForm() {
  return el("details", { class: "start" }, el("summary", { "data-testid": "start-open" }, "Start a conversation"),
    publishForm({ onSent: (r) => { location.hash = `#/c/${enc(r.trace_id)}`; } }));
}

// the events of each turn, with what a waterfall draws: [{turn, rows, start, end}]; a row is
// {kind: "model"|"tool"|"subagent", label, start, end, depth} in Unix ms. A model call ends when its
// output is stored and began latency_ms before; a tool run from its tool_started (or duration_ms
// before its result) to its result. A child trace (a subagent run) adds its rows one level deeper.
function turnSpans(events, childTrace = () => null, depth = 0) {
  const turns = [];
  const byTurn = new Map();
  const started = new Map(); // call id -> {at, turn, name}: tool runs without a result yet
  const delegated = new Set(); // call ids that opened a child trace
  for (const ev of events) {
    const e = ev.event; const at = entryMs(ev.id);
    if (e.type === "turn_input" || e.type === "task_input") {
      const turn = { turn: e.turn_id, agent: e.agent, start: at, end: null, rows: [] };
      turns.push(turn); byTurn.set(e.turn_id, turn);
      continue;
    }
    const turn = byTurn.get(e.turn_id);
    if (!turn) continue;
    if (e.type === "model_output") {
      turn.rows.push({ kind: "model", label: `model call ${e.step ?? 0}`, start: at - (e.latency_ms || 0), end: at, depth });
      for (const call of e.tool_calls || []) {
        const child = childTrace(call.id);
        if (!child) continue;
        delegated.add(call.id); // its result is the run's answer: the run's bar stands for it
        const head = { kind: "subagent", label: `subagent ${call.name}`, start: null, end: null, depth };
        turn.rows.push(head);
        for (const inner of turnSpans(child.events, () => null, depth + 1)) {
          head.start = head.start == null ? inner.start : Math.min(head.start, inner.start);
          head.end = inner.end == null ? null : Math.max(head.end ?? 0, inner.end);
          turn.rows.push(...inner.rows);
        }
      }
    } else if (e.type === "tool_started") started.set(e.call_id, { at, turn, name: e.name });
    else if (e.type === "tool_result") {
      const run = started.get(e.call_id);
      started.delete(e.call_id);
      if (!e.late && !delegated.has(e.call_id)) turn.rows.push({ kind: "tool", label: `tool ${e.name}`, start: run ? run.at : at - (e.duration_ms || 0), end: at, depth });
    } else if (e.type === "turn_ended" || e.type === "turn_failed") turn.end = at;
  }
  for (const run of started.values()) { // still running (or its turn ended without its result)
    if (run.turn.end == null) run.turn.rows.push({ kind: "tool", label: `tool ${run.name}`, start: run.at, end: null, depth });
  }
  for (const turn of turns) turn.rows = turn.rows.filter((r) => r.start != null);
  return turns;
}

function waterfall(turn) {
  const now = Date.now();
  const end = turn.end ?? Math.max(now, ...turn.rows.map((r) => r.end ?? now));
  const start = Math.min(turn.start, ...turn.rows.map((r) => r.start));
  const span = Math.max(end - start, 1);
  const rows = turn.rows.map((r) => {
    const rEnd = r.end ?? now;
    const bar = el("div", { class: `span ${r.kind}${r.end == null ? " open" : ""}`, title: `${stamp(r.start)} → ${r.end == null ? "running" : stamp(r.end)}` });
    bar.style.left = `${((r.start - start) / span) * 100}%`; // CSSOM, not a style attribute: allowed by the CSP
    bar.style.width = `max(2px, ${((rEnd - r.start) / span) * 100}%)`;
    const label = el("div", { class: "label" }, r.label);
    label.style.paddingLeft = `${r.depth * 1.2}rem`;
    return el("div", { class: `row ${r.kind}`, "data-testid": "waterfall-row", "data-kind": r.kind, "data-depth": r.depth }, label,
      el("div", { class: "track" }, bar), el("div", { class: "dur muted" }, r.end == null ? "running" : duration(rEnd - r.start)));
  });
  return el("details", { class: "waterfall", open: true, "data-testid": "waterfall" },
    el("summary", {}, `waterfall of turn ${turn.turn} · ${turn.end == null ? "running for" : "took"} ${duration(end - turn.start)} · from ${stamp(turn.start)}`),
    rows.length ? rows : el("div", { class: "muted" }, "no model call yet"));
}

function describe(ctx, ev) {
  const e = ev.event;
  const traceId = ctx.traceId;
  const head = (...parts) => el("div", { class: "head" }, ...parts);
  switch (e.type) {
    case "turn_input":
    case "task_input": {
      const meta = Object.entries(e.metadata || {});
      const ended = ctx.ended.has(e.turn_id);
      return [head(el("b", {}, e.type === "task_input" ? `task for ${e.agent}` : `turn for ${e.agent}`), el("span", { class: "muted" }, e.turn_id),
        e.model ? el("span", { class: "muted" }, `model ${e.model}`) : null,
        e.rolls_back ? el("span", { class: "muted" }, `rolls back ${e.rolls_back}`) : null,
        (e.approval || []).length ? el("span", { class: "muted" }, `approval asked for ${e.approval.join(", ")}`) : null,
        ctx.fork && e.type === "turn_input" ? forkControls(ctx, e, ended) : null),
      meta.length ? el("div", { class: "meta", "data-testid": "turn-metadata" }, meta.map(([k, v]) => el("span", { class: "chip" }, `${k}=${v}`))) : null,
      el("div", { class: "body" }, e.text ?? JSON.stringify(e.input))];
    }
    case "model_output": {
      const usage = e.usage || {};
      const tokens = usage.prompt_tokens != null ? `${usage.prompt_tokens} → ${usage.completion_tokens} tokens` : "tokens not reported";
      return [head(el("b", {}, `model call ${e.step}`), el("span", { class: "muted" }, `${e.model || e.endpoint} · ${tokens} · ${Math.round(e.latency_ms)} ms · ${e.stop_reason}`),
        el("a", { href: `#/explain/${enc(traceId)}/${encodeURIComponent(e.turn_id)}/${e.step}`, "data-testid": "explain-link" }, "explain"),
        ctx.fork ? el("button", { type: "button", class: "small", "data-testid": "fork-step", title: "A new conversation that makes this model call again", onclick: () => ctx.fork({ turn_id: e.turn_id, step: e.step ?? 0 }) }, "fork before this call") : null),
      e.content ? el("div", { class: "body" }, e.content) : null,
      (e.tool_calls || []).map((call) => {
        const child = ctx.children.find((c) => c === `${traceId}/${call.id}`);
        return el("div", { class: "call" }, `→ ${call.name}(${call.arguments}) [${call.id}]`, child ? childTimeline(ctx, child) : null);
      })];
    }
    case "tool_result":
      return [head(el("b", {}, `tool result ${e.name}`), el("span", { class: "muted" }, `[${e.call_id}] ran ${duration(e.duration_ms || 0)}${e.late ? " · late (no model call saw it)" : ""}`)),
        el("div", { class: e.error ? "body error" : "body" }, e.error ? `${e.error}: ${e.text}` : e.text)];
    case "tool_started":
      return [head(el("b", {}, `tool started ${e.name}`), el("span", { class: "muted" }, `[${e.call_id}] on ${e.worker || "?"}`))];
    case "turn_ended":
    case "turn_failed": {
      const took = ctx.turnStart.has(e.turn_id) ? ` · the turn took ${duration(entryMs(ev.id) - ctx.turnStart.get(e.turn_id))}` : "";
      return e.type === "turn_ended"
        ? [head(el("b", {}, "answer"), el("span", { class: "muted", "data-testid": "turn-took" }, took.slice(3))), el("div", { class: "body" }, e.answer)]
        : [head(el("b", {}, `turn failed: ${e.code}`), el("span", { class: "muted", "data-testid": "turn-took" }, took.slice(3))), el("div", { class: "body" }, e.reason)];
    }
    case "cancel_requested":
      return [head(el("b", {}, `cancel requested by ${e.by}`)), e.reason ? el("div", { class: "body" }, e.reason) : null];
    case "approval_awaited": {
      const decided = ctx.decided.get(e.call_id);
      return [head(el("b", {}, `${e.name} awaits approval`), el("span", { class: "muted" }, `[${e.call_id}]${e.due_ms ? ` · denied at ${stamp(e.due_ms)} if nobody decides` : ""}`)),
        e.why ? el("div", { class: "muted" }, e.why) : null,
        decided ? null : ctx.ended.has(e.turn_id) || ctx.failed.has(e.turn_id) ? el("div", { class: "muted" }, "its turn ended: nothing to decide")
          : ctx.approve ? approvalControls(ctx, e) : null];
    }
    case "approval_decided":
      return [head(el("b", { "data-testid": "approval-decision" }, `${e.name} ${e.approved ? "approved" : "denied"}${e.timed_out ? " (timed out)" : ""} by ${e.by}`), el("span", { class: "muted" }, `[${e.call_id}]`)),
        e.reason ? el("div", { class: "body" }, e.reason) : null,
        e.arguments ? el("div", { class: "call" }, `runs with ${e.arguments}`) : null];
    case "forked_from":
      return [head(el("b", {}, "forked from "), el("a", { href: `#/c/${enc(e.source_trace_id)}`, "data-testid": "fork-source" }, e.source_trace_id),
        el("span", { class: "muted" }, `at turn ${e.turn_id}${e.step != null ? ` before model call ${e.step}` : ""}${e.replaced ? ", its input replaced" : ""} · ${e.copied} event(s) copied (their times are the copy's) · by ${e.by}`))];
    case "compaction":
      return [head(el("b", {}, `compaction: a summary replaces ${e.replaced_turns} turn(s)`), el("span", { class: "muted" }, `kept from turn ${e.kept_from_turn}`)), el("div", { class: "body" }, e.summary)];
    case "compaction_failed":
      return [head(el("b", {}, `compaction failed: ${e.code}`)), el("div", { class: "body" }, e.reason)];
    default:
      return [head(el("b", {}, e.type)), el("pre", {}, JSON.stringify(e, null, 2))];
  }
}

// approve or deny a call awaiting approval, with a reason (and edited arguments where the tool allows)
function approvalControls(ctx, e) {
  const draft = ctx.drafts.get(`approval:${e.call_id}`) || { reason: "", args: ctx.callArgs.get(e.call_id) ?? "" };
  ctx.drafts.set(`approval:${e.call_id}`, draft);
  const reason = el("input", { name: "reason", placeholder: "reason (the model sees a denial's)", size: 34, "data-testid": "approval-reason" });
  reason.value = draft.reason;
  reason.addEventListener("input", () => { draft.reason = reason.value; });
  const args = e.editable ? el("textarea", { name: "arguments", rows: 2, cols: 60, "data-testid": "approval-arguments" }) : null;
  if (args) { args.value = draft.args; args.addEventListener("input", () => { draft.args = args.value; }); }
  const decide = (approved) => {
    const body = { call_id: e.call_id, approved, reason: reason.value };
    if (approved && args && args.value.trim() !== (ctx.callArgs.get(e.call_id) ?? "").trim()) {
      try { body.arguments = JSON.parse(args.value); } catch (error) { ctx.say(`the arguments are not JSON: ${error.message}`); return; }
    }
    ctx.approve(body);
  };
  return el("div", { class: "bar approval", "data-testid": "approval" }, args, reason,
    el("button", { type: "button", class: "ok", "data-testid": "approve", onclick: () => decide(true) }, args ? "Approve (with these arguments)" : "Approve"),
    el("button", { type: "button", class: "danger", "data-testid": "deny", onclick: () => decide(false) }, "Deny"));
}

function forkControls(ctx, e, ended) {
  // the view re-renders on every event: what was typed, and whether it is open, is kept per turn
  const draft = ctx.drafts.get(e.turn_id) || { open: false, text: "" };
  ctx.drafts.set(e.turn_id, draft);
  const text = el("input", { name: "text", placeholder: "this turn's input, replaced", size: 30, "data-testid": "fork-text" });
  text.value = draft.text;
  text.addEventListener("input", () => { draft.text = text.value; });
  const box = el("details", { class: "fork", open: draft.open });
  box.addEventListener("toggle", () => { draft.open = box.open; });
  box.append(...forkBody(ctx, e, ended, box, text));
  return box;
}

function forkBody(ctx, e, ended, box, text) {
  return [el("summary", { "data-testid": "fork-open" }, "fork…"),
    el("div", { class: "bar" },
      el("button", { type: "button", "data-testid": "fork-after", disabled: !ended, title: ended ? "A new conversation with the turns up to this one" : "the turn has not ended" , onclick: () => ctx.fork({ turn_id: e.turn_id }) }, "fork after this turn"),
      text, el("button", { type: "button", "data-testid": "fork-replace", onclick: () => (text.value.trim() ? ctx.fork({ turn_id: e.turn_id, text: text.value }) : text.focus()) }, "fork with this input"))];
}

function childTimeline(ctx, childId) {
  const box = el("details", { class: "child", open: true }, el("summary", {}, `subagent run ${childId}`));
  const list = el("ol", { class: "timeline" });
  box.append(list);
  const trace = ctx.child(childId);
  if (!trace) list.append(el("li", { class: "muted" }, "loading…"));
  else {
    const inner = { ...ctx, traceId: childId, children: trace.children, fork: null, approve: null, turnStart: new Map(), ended: new Set(), failed: new Set(), decided: new Map() };
    list.append(...trace.events.map((ev) => eventItem(inner, ev)));
  }
  return box;
}

function eventItem(ctx, ev) {
  const at = entryMs(ev.id);
  const copied = ctx.copied && ctx.copied.has(ev.id);
  return el("li", { class: `${ev.event.type}${copied ? " copied" : ""}` },
    el("time", { class: "at muted", datetime: new Date(at).toISOString(), title: new Date(at).toISOString(), "data-testid": "event-time" }, `${stamp(at)}${copied ? " (copied)" : ""}`),
    describe(ctx, ev));
}

function conversationView(main, traceId) {
  const badge = el("span");
  const cancel = el("button", { class: "danger", type: "button", "data-testid": "cancel", disabled: true }, "Cancel the running turn");
  const note = el("span", { class: "muted", "data-testid": "note" });
  const list = el("ol", { class: "timeline", "data-testid": "timeline" });
  const live = el("li", { class: "live", hidden: true, "data-testid": "live" });
  const publishSlot = el("div");
  main.replaceChildren(el("h1", {}, traceId), el("div", { class: "bar" }, badge, cancel, note), list, publishSlot);
  const controller = new AbortController();
  const events = [];
  let children = [];
  let partial = null; // {turn_id, step, attempt, text, calls: {index: {name, call_id, args}}}
  let lastId = null;
  let stateTimer = null;
  const childCache = new Map(); // child trace id -> {trace, at, final, loading}
  const drafts = new Map(); // turn id -> the fork controls' {open, text}

  const child = (id) => { // a child trace, fetched once and again every 1.5 s while it runs
    const c = childCache.get(id);
    if (c && (c.final || c.loading || Date.now() - c.at < 1500)) return c.trace;
    childCache.set(id, { trace: c?.trace ?? null, at: Date.now(), final: false, loading: true });
    api(`/v1/traces/${enc(id)}?limit=5000`).then((trace) => {
      const final = !!trace.state && !["running", "waiting_on_tools"].includes(trace.state.state);
      childCache.set(id, { trace, at: Date.now(), final, loading: false });
      render();
    }).catch(() => childCache.set(id, { trace: c?.trace ?? null, at: Date.now(), final: true, loading: false }));
    return c?.trace ?? null;
  };
  const approve = async (body) => {
    try {
      const r = await api(`/v1/traces/${enc(traceId)}/approvals`, { method: "POST", body: JSON.stringify(body) });
      note.textContent = `${body.approved ? "approval" : "denial"} of ${r.call_id} sent`;
    } catch (e) { if (e.message !== "401") note.textContent = `approval: ${e.message}`; }
  };
  const fork = async (body) => {
    note.textContent = "forking…";
    try {
      const r = await api(`/v1/traces/${enc(traceId)}/forks`, { method: "POST", body: JSON.stringify(body) });
      location.hash = `#/c/${enc(r.trace_id)}`;
    } catch (e) { if (e.message !== "401") note.textContent = `fork: ${e.message}`; }
  };

  const render = () => {
    const turnStart = new Map(); const ended = new Set(); const copied = new Set();
    const forked = events.find((ev) => ev.event.type === "forked_from");
    if (forked) events.slice(1, 1 + forked.event.copied).forEach((ev) => copied.add(ev.id));
    for (const ev of events) {
      if (ev.event.type === "turn_input") turnStart.set(ev.event.turn_id, entryMs(ev.id));
      if (ev.event.type === "turn_ended") ended.add(ev.event.turn_id);
    }
    const failed = new Set(); const decided = new Map(); const callArgs = new Map();
    for (const ev of events) {
      const e = ev.event;
      if (e.type === "turn_failed") failed.add(e.turn_id);
      if (e.type === "approval_decided") decided.set(e.call_id, e);
      if (e.type === "model_output") for (const c of e.tool_calls || []) callArgs.set(c.id, c.arguments);
    }
    const ctx = { traceId, children, child, fork, turnStart, ended, copied, drafts, failed, decided, callArgs, approve, say: (t) => { note.textContent = t; } };
    const spans = new Map(turnSpans(events, (callId) => (children.includes(`${traceId}/${callId}`) ? child(`${traceId}/${callId}`) : null)).map((t) => [t.turn, t]));
    const items = [];
    for (const ev of events) {
      items.push(eventItem(ctx, ev));
      const t = ev.event.type === "turn_input" && !copied.has(ev.id) ? spans.get(ev.event.turn_id) : null;
      if (t) items.push(el("li", { class: "waterfall-item" }, waterfall(t)));
    }
    list.replaceChildren(...items);
    if (partial) list.append(live);
  };
  const showState = (state) => {
    badge.replaceChildren(state ? stateBadge(state.state) : "");
    cancel.disabled = !state || !["running", "waiting_on_tools"].includes(state.state);
    if (!publishSlot.firstChild) publishSlot.append(el("h2", {}, "Send a turn"), publishForm({ traceId, agent: state ? state.agent : "" }));
  };
  const refreshState = () => {
    clearTimeout(stateTimer);
    stateTimer = setTimeout(async () => {
      try { const t = await api(`/v1/traces/${enc(traceId)}?limit=1&after=${encodeURIComponent(lastTraceId())}`); children = t.children; showState(t.state); render(); } catch (e) { note.textContent = e.message; }
    }, 150);
  };
  const lastTraceId = () => (events.length ? events[events.length - 1].id : "0-0");
  const showLive = () => {
    const calls = Object.entries(partial.calls).sort((a, b) => a[0] - b[0]).map(([, c]) =>
      el("div", { class: "call", "data-testid": "live-call" }, `→ ${c.name || "?"}(${c.args}`, el("span", { class: "cursor" }, "…"), c.call_id ? ` [${c.call_id}]` : ""));
    const doing = calls.length ? (partial.text ? "writing and calling tools…" : "calling tools…") : "writing…";
    live.replaceChildren(el("div", { class: "head" }, el("b", { "data-testid": "live-head" }, `model call ${partial.step} ${doing}`), el("span", { class: "muted" }, `attempt ${partial.attempt} · since ${stamp(partial.since)}`)),
      el("div", { class: "body", "data-testid": "live-text" }, partial.text), ...calls);
    live.hidden = false;
    if (!live.isConnected) list.append(live);
  };
  const onEvent = (kind, data) => {
    if (kind === "trace") {
      events.push(data);
      if (partial && data.event.type === "model_output" && data.event.turn_id === partial.turn_id && (data.event.step ?? 0) === partial.step) partial = null;
      render();
      refreshState();
    } else if (kind === "delta") {
      data.step = data.step ?? 0;
      const made = events.some((ev) => ev.event.type === "model_output" && ev.event.turn_id === data.turn_id && (ev.event.step ?? 0) === data.step);
      if (made) return; // its output is in the trace: the deltas were only a preview of it
      if (data.kind === "start") partial = { turn_id: data.turn_id, step: data.step, attempt: data.attempt, text: "", calls: {}, since: data.id ? entryMs(data.id) : Date.now() };
      else if (!partial || data.attempt !== partial.attempt) return; // an older attempt's piece
      else if (data.kind === "text" || data.kind === "reasoning") partial.text += data.text || "";
      else if (data.kind === "tool_call") {
        const call = partial.calls[data.index ?? 0] ||= { name: "", call_id: "", args: "" };
        call.name = call.name || data.name || "";
        call.call_id = call.call_id || data.call_id || "";
        call.args += data.text || "";
      } else if (data.kind === "abort") { note.textContent = `an attempt of model call ${data.step} ended without an answer (${data.reason || "aborted"}); its text is dropped`; partial = null; }
      if (partial) showLive(); else live.remove();
    } else if (kind === "error") note.textContent = data.detail;
  };

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try { const r = await api(`/v1/traces/${enc(traceId)}/cancel`, { method: "POST", body: JSON.stringify({ reason: "cancelled from the console" }) }); note.textContent = `cancel of turn ${r.turn_id} sent`; } catch (e) { note.textContent = e.message; cancel.disabled = false; }
  });

  (async () => {
    try {
      let trace = null;
      for (let tries = 0; !trace; tries++) { // a turn just published may not be in its trace yet
        try { trace = await api(`/v1/traces/${enc(traceId)}?limit=5000`); }
        catch (e) {
          if (tries >= 20 || !e.message.startsWith("no trace") || controller.signal.aborted) throw e;
          note.textContent = "waiting for the conversation's first event…";
          await new Promise((r) => setTimeout(r, 500));
        }
      }
      note.textContent = "";
      events.push(...trace.events);
      children = trace.children;
      showState(trace.state);
      render();
      lastId = `${lastTraceId()},0-0`;
      for (;;) { // follow; a dropped connection resumes after the last event it delivered
        try { lastId = (await follow(`/v1/traces/${enc(traceId)}/stream`, { onEvent, signal: controller.signal, lastEventId: lastId })).last || lastId; }
        catch (e) { if (controller.signal.aborted) return; note.textContent = `reconnecting (${e.message})`; }
        await new Promise((r) => setTimeout(r, 1000));
      }
    } catch (e) { if (!controller.signal.aborted && e.message !== "401") note.textContent = e.message; }
  })();
  return () => { controller.abort(); clearTimeout(stateTimer); };
}

function explainView(main, traceId, turnId, step) {
  main.replaceChildren(el("h1", {}, `Model call ${step} of turn ${turnId}`), el("p", { class: "muted" }, "loading…"));
  api(`/v1/traces/${enc(traceId)}/explain?step=${step}&turn_id=${encodeURIComponent(turnId)}`).then((x) => {
    const verdict = x.matches === null ? "not made yet (the next call)" : x.matches ? "the rebuilt request matches the recorded fingerprint" : "the rebuilt request does NOT match the recorded fingerprint";
    main.replaceChildren(
      el("h1", {}, `Model call ${x.step} of turn ${x.turn_id}`),
      el("p", {}, el("a", { href: `#/c/${enc(traceId)}` }, `← ${traceId}`)),
      el("p", { "data-testid": "explain-verdict", class: x.matches === false ? "error" : "" }, verdict),
      el("p", { class: "muted" }, `call ${x.call} of the trace · ${x.size_tokens ?? "?"} of a ${x.window_tokens ?? "?"}-token window · sha256 ${x.rebuilt_sha256.slice(0, 16)}…`),
      x.endpoint ? el("p", { class: "muted" }, x.endpoint) : null,
      el("h2", {}, "Shortened results"),
      x.shrunk.length ? el("ul", {}, x.shrunk.map((s) => el("li", {}, s))) : el("p", { class: "muted" }, "none: every result is shown as recorded"),
      el("h2", {}, "Messages sent"),
      el("div", { "data-testid": "explain-messages" }, (x.body.messages || []).map((m) => el("div", { class: "msg" }, el("div", { class: "role" }, m.role + (m.tool_call_id ? ` · ${m.tool_call_id}` : "")),
        el("div", { class: "body" }, typeof m.content === "string" ? m.content : JSON.stringify(m.content)),
        (m.tool_calls || []).map((c) => el("div", { class: "call" }, `→ ${c.function.name}(${c.function.arguments})`))))),
      el("h2", {}, "Request body"),
      el("pre", { "data-testid": "explain-body" }, JSON.stringify(x.body, null, 2)));
  }).catch((e) => main.replaceChildren(el("h1", {}, "Explain"), el("p", { class: "error" }, e.message)));
}

function deadView(main) {
  main.replaceChildren(el("h1", {}, "Dead letters"), el("p", { class: "muted" }, "loading…"));
  api("/v1/dead-letters?limit=100").then(({ dead_letters: letters }) => {
    const rows = letters.map((d) => el("tr", {},
      el("td", { class: "muted" }, when(Number(d.entry_id.split("-")[0]))),
      el("td", {}, d.source_stream, el("div", { class: "muted" }, `${d.source_id} · group ${d.group}`)),
      el("td", {}, d.trace_id ? el("a", { href: `#/c/${enc(d.trace_id)}` }, d.trace_id) : ""),
      el("td", {}, String(d.deliveries)),
      el("td", { class: "text" }, d.error),
      el("td", { class: "text" }, el("pre", {}, JSON.stringify(d.payload, null, 2)))));
    main.replaceChildren(el("h1", {}, "Dead letters"),
      el("table", { "data-testid": "dead-letters" }, el("thead", {}, el("tr", {}, ["When", "From", "Trace", "Deliveries", "Last error", "Payload"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No dead letters.")))));
  }).catch((e) => main.replaceChildren(el("h1", {}, "Dead letters"), el("p", { class: "error" }, e.message)));
}

// --- routing --------------------------------------------------------------------------------

function stop() { if (current) current(); current = null; }

function route() {
  stop();
  if (!key()) return askKey();
  const main = document.getElementById("main");
  const hash = location.hash.replace(/^#\/?/, "");
  const parts = hash.split("/").map(decodeURIComponent);
  if (parts[0] === "c" && parts.length > 1) current = conversationView(main, parts.slice(1).join("/"));
  else if (parts[0] === "explain" && parts.length >= 4) explainView(main, parts.slice(1, -2).join("/"), parts[parts.length - 2], Number(parts[parts.length - 1]));
  else if (parts[0] === "dead") deadView(main);
  else current = conversationsView(main);
}

document.getElementById("forget").addEventListener("click", () => { sessionStorage.removeItem(KEY_STORE); askKey(); });
window.addEventListener("hashchange", route);
if (key()) whoami().then(route, () => {}); else askKey();
