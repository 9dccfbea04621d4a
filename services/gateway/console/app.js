// The agentstream console: a small page over the gateway's own API (nothing else is loaded).
// Views (by the URL's hash): #/ recent conversations, #/c/<trace id> a conversation's timeline
// with live tokens and a cancel button, #/explain/<trace id>/<turn id>/<step> one model call's
// request, #/dead the dead letters. Every text is set with textContent (never parsed as HTML).
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
  document.getElementById("who").textContent = `key ${me.key} · agents ${me.agents.map((a) => a.name).join(", ") || "none"}`;
  document.getElementById("forget").hidden = false;
}

// --- views ----------------------------------------------------------------------------------

function conversationsView(main) {
  const body = el("tbody");
  const error = el("p", { class: "error" });
  main.replaceChildren(el("h1", {}, "Recent conversations"), error,
    el("table", { "data-testid": "conversations" }, el("thead", {}, el("tr", {}, ["Conversation", "State", "Agent", "Newest turn", "Answer or reason", "Updated"].map((h) => el("th", {}, h)))), body));
  const refresh = async () => {
    try {
      const { conversations } = await api("/v1/conversations?limit=100");
      error.textContent = "";
      body.replaceChildren(...conversations.map((c) => el("tr", { "data-trace": c.trace_id },
        el("td", {}, el("a", { href: `#/c/${enc(c.trace_id)}`, "data-testid": "conversation-link" }, c.trace_id)),
        el("td", {}, stateBadge(c.state), c.pending_tools.length ? el("div", { class: "muted" }, c.pending_tools.join(", ")) : null),
        el("td", {}, c.agent),
        el("td", { class: "text" }, c.text, el("div", { class: "muted" }, `${c.turns} turn(s)`)),
        el("td", { class: "text" }, c.state === "ended" ? c.answer : c.reason ? `${c.code}: ${c.reason}` : ""),
        el("td", { class: "muted" }, when(c.updated_ms)))));
      if (!conversations.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No conversations yet.")));
    } catch (e) { if (e.message !== "401") error.textContent = e.message; }
  };
  refresh();
  const timer = setInterval(refresh, 2000);
  return () => clearInterval(timer);
}

function describe(traceId, event, children) {
  const e = event.event;
  const head = (...parts) => el("div", { class: "head" }, ...parts);
  switch (e.type) {
    case "turn_input":
    case "task_input":
      return [head(el("b", {}, e.type === "task_input" ? `task for ${e.agent}` : `turn for ${e.agent}`), el("span", { class: "muted" }, e.turn_id)), el("div", { class: "body" }, e.text)];
    case "model_output": {
      const usage = e.usage || {};
      const tokens = usage.prompt_tokens != null ? `${usage.prompt_tokens} → ${usage.completion_tokens} tokens` : "tokens not reported";
      return [head(el("b", {}, `model call ${e.step}`), el("span", { class: "muted" }, `${e.model || e.endpoint} · ${tokens} · ${Math.round(e.latency_ms)} ms · ${e.stop_reason}`),
        el("a", { href: `#/explain/${enc(traceId)}/${encodeURIComponent(e.turn_id)}/${e.step}`, "data-testid": "explain-link" }, "explain")),
        e.content ? el("div", { class: "body" }, e.content) : null,
        (e.tool_calls || []).map((call) => {
          const child = children.find((c) => c === `${traceId}/${call.id}`);
          return el("div", { class: "call" }, `→ ${call.name}(${call.arguments}) [${call.id}]`, child ? childTimeline(child) : null);
        })];
    }
    case "tool_result":
      return [head(el("b", {}, `tool result ${e.name}`), el("span", { class: "muted" }, `[${e.call_id}] ${Math.round(e.duration_ms || 0)} ms${e.late ? " · late (no model call saw it)" : ""}`)),
        el("div", { class: e.error ? "body error" : "body" }, e.error ? `${e.error}: ${e.text}` : e.text)];
    case "tool_started":
      return [head(el("b", {}, `tool started ${e.name}`), el("span", { class: "muted" }, `[${e.call_id}] on ${e.worker || "?"}`))];
    case "turn_ended":
      return [head(el("b", {}, "answer")), el("div", { class: "body" }, e.answer)];
    case "turn_failed":
      return [head(el("b", {}, `turn failed: ${e.code}`)), el("div", { class: "body" }, e.reason)];
    case "cancel_requested":
      return [head(el("b", {}, `cancel requested by ${e.by}`)), e.reason ? el("div", { class: "body" }, e.reason) : null];
    case "compaction":
      return [head(el("b", {}, `compaction: a summary replaces ${e.replaced_turns} turn(s)`), el("span", { class: "muted" }, `kept from turn ${e.kept_from_turn}`)), el("div", { class: "body" }, e.summary)];
    case "compaction_failed":
      return [head(el("b", {}, `compaction failed: ${e.code}`)), el("div", { class: "body" }, e.reason)];
    default:
      return [head(el("b", {}, e.type)), el("pre", {}, JSON.stringify(e, null, 2))];
  }
}

function childTimeline(childId) {
  const box = el("details", { class: "child", open: true }, el("summary", {}, `subagent run ${childId}`));
  const list = el("ol", { class: "timeline" });
  box.append(list);
  api(`/v1/traces/${enc(childId)}`).then((trace) => {
    list.replaceChildren(...trace.events.map((ev) => el("li", { class: ev.event.type }, describe(childId, ev, trace.children))));
  }).catch((e) => list.replaceChildren(el("li", { class: "error" }, e.message)));
  return box;
}

function conversationView(main, traceId) {
  const badge = el("span");
  const cancel = el("button", { class: "danger", type: "button", "data-testid": "cancel", disabled: true }, "Cancel the running turn");
  const note = el("span", { class: "muted", "data-testid": "note" });
  const list = el("ol", { class: "timeline", "data-testid": "timeline" });
  const live = el("li", { class: "live", hidden: true, "data-testid": "live" });
  main.replaceChildren(el("h1", {}, traceId), el("div", { class: "bar" }, badge, cancel, note), list);
  const controller = new AbortController();
  const events = [];
  let children = [];
  let partial = null; // {turn_id, step, attempt, text}
  let lastId = null;
  let stateTimer = null;

  const render = () => {
    list.replaceChildren(...events.map((ev) => el("li", { class: ev.event.type }, describe(traceId, ev, children))));
    if (partial) list.append(live);
  };
  const showState = (state) => {
    badge.replaceChildren(state ? stateBadge(state.state) : "");
    cancel.disabled = !state || !["running", "waiting_on_tools"].includes(state.state);
  };
  const refreshState = () => {
    clearTimeout(stateTimer);
    stateTimer = setTimeout(async () => {
      try { const t = await api(`/v1/traces/${enc(traceId)}?limit=1&after=${encodeURIComponent(lastTraceId())}`); children = t.children; showState(t.state); render(); } catch (e) { note.textContent = e.message; }
    }, 150);
  };
  const lastTraceId = () => (events.length ? events[events.length - 1].id : "0-0");
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
      if (data.kind === "start") partial = { turn_id: data.turn_id, step: data.step, attempt: data.attempt, text: "" };
      else if (!partial || data.attempt !== partial.attempt) return; // an older attempt's piece
      else if (data.kind === "text" || data.kind === "reasoning") partial.text += data.text || "";
      else if (data.kind === "abort") { note.textContent = `an attempt of model call ${data.step} ended without an answer (${data.reason || "aborted"}); its text is dropped`; partial = null; }
      if (partial) {
        live.replaceChildren(el("div", { class: "head" }, el("b", {}, `model call ${partial.step} writing…`), el("span", { class: "muted" }, `attempt ${partial.attempt}`)), el("div", { class: "body", "data-testid": "live-text" }, partial.text));
        live.hidden = false;
        if (!live.isConnected) list.append(live);
      } else live.remove();
    } else if (kind === "error") note.textContent = data.detail;
  };

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try { const r = await api(`/v1/traces/${enc(traceId)}/cancel`, { method: "POST", body: JSON.stringify({ reason: "cancelled from the console" }) }); note.textContent = `cancel of turn ${r.turn_id} sent`; } catch (e) { note.textContent = e.message; cancel.disabled = false; }
  });

  (async () => {
    try {
      const trace = await api(`/v1/traces/${enc(traceId)}?limit=5000`);
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
