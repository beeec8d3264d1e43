// The slm_server dashboard: polls /v1/backends/health, /health (the registry in force,
// the machine's free memory) and /v1/ui/requests every POLL_MS, reads one stream of
// /v1/ui/events, and builds every node with textContent (never as markup): model ids,
// log lines and event fields are shown as text. The charts (charts.js), the watchdog's
// timeline (lanes.js) over the history (history.js), the playground (playground.js),
// a request's detail (request_detail.js) and adding a model (models.js) are wired here
// at the start.
"use strict";

const POLL_MS = 2000;
const RECONNECT_MS = 3000;
const MAX_EVENTS = 500;
const KEY_NAME = "slm_api_key";
const BAD_EVENTS = new Set([
  "backend_failure", "backend_exited", "backend_not_running", "restart_failed",
  "backend_abandoned", "process_unkillable", "load_failed", "restart_not_confirmed",
  "port_stray_killed", "state_write_failed", "backend_log_trim_failed",
  "evicted_for_pressure",
]);
const GOOD_EVENTS = new Set(["restart_succeeded", "restart_confirmed", "backend_loaded"]);

const $ = (id) => document.getElementById(id);
let streamAbort = null;
let filterModel = "";
const knownModels = new Set();

function currentKey() {
  return sessionStorage.getItem(KEY_NAME) || "";
}

function headers(extra) {
  const key = currentKey();
  const all = Object.assign({}, extra || {});
  if (key) all.Authorization = "Bearer " + key;
  return all;
}

function say(text, bad) {
  const status = $("status");
  status.textContent = text;
  status.classList.toggle("bad", !!bad);
}

// A 401 for a request sent with `key`: none was given, or the one given was refused
// (said only while it is still the key in use: an answer to an older key is stale).
function unauthorized(key) {
  if (key !== currentKey()) return;
  if (key) say("the API key was refused: enter another one above", true);
  else say("API key needed: enter one above", true);
  $("key-form").classList.toggle("refused", !!key);
}

async function api(path, options) {
  const opts = Object.assign({}, options || {});
  const key = currentKey();
  opts.headers = headers(opts.headers);
  const response = await fetch(path, opts);
  if (response.status === 401) {
    unauthorized(key);
    throw new Error("unauthorized");
  }
  return response;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function dash(value) {
  return value === undefined || value === null || value === "" ? "–" : String(value);
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

// -- models ---------------------------------------------------------------------------

const COLUMNS = ["model", "role", "state", "pid", "uptime", "port", "busy", "memory", "saved",
  "restarts", "left", "frees", "exit", "reason", "ttl", "actions"];

function modelRow(role) {
  const body = $("models").tBodies[0];
  for (const row of body.rows) if (row.dataset.role === role) return row;
  const row = document.createElement("tr");
  row.dataset.role = role;
  for (const name of COLUMNS) row.appendChild(el("td", null, name));
  body.appendChild(row);
  return row;
}

function cell(row, name) {
  return row.querySelector("td." + name);
}

function setCell(row, name, text) {
  const td = cell(row, name);
  const shown = dash(text);
  if (td.textContent !== shown) td.textContent = shown;
}

function memory(mb) {
  if (!mb) return "–";
  return [mb.estimate, mb.measured, mb.admitted_as, mb.budget].map(dash).join(" / ");
}

function actions(row, role, item) {
  const td = cell(row, "actions");
  const state = item.state;
  const wanted = [];
  if (item.load && item.load.startsWith("on_demand")) {
    if (state === "unloaded") wanted.push("load");
    else if (state === "ready" || state === "degraded") wanted.push("unload");
  }
  wanted.push("log");
  const have = Array.from(td.children).map((b) => b.dataset.action).join(",");
  if (have === wanted.join(",")) return;
  td.replaceChildren();
  for (const action of wanted) {
    const button = el("button", action, action);
    button.dataset.action = action;
    button.type = "button";
    button.addEventListener("click", () => act(action, role, item.model_id, button));
    td.appendChild(button);
  }
}

async function act(action, role, modelId, button) {
  if (action === "log") return showLog(role);
  button.disabled = true;
  say(action + "ing " + modelId + "…");
  try {
    const response = await api("/v1/models/" + action, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ model: modelId }),
    });
    const body = await response.json().catch(() => ({}));
    if (response.ok) say(modelId + ": " + dash(body.status && body.status.state));
    else say(modelId + ": " + dash(body.error && body.error.message), true);
  } catch (error) {
    say(action + " failed: " + error.message, true);
  } finally {
    button.disabled = false;
    pollModels();
  }
}

function renderModels(report) {
  const now = Date.now() / 1000;
  // A reload may have removed a model: its row goes with it.
  for (const row of Array.from($("models").tBodies[0].rows)) {
    if (!Object.hasOwn(report, row.dataset.role)) row.remove();
  }
  for (const [role, item] of Object.entries(report)) {
    const row = modelRow(role);
    const budget = item.restart_budget || null;
    const aliases = item.aliases && item.aliases.length ? " (" + item.aliases.join(", ") + ")" : "";
    setCell(row, "model", item.model_id + aliases);
    setCell(row, "role", role);
    setCell(row, "state", item.state);
    cell(row, "state").className = "state state-" + String(item.state || "none");
    setCell(row, "pid", item.pid);
    setCell(row, "uptime", item.pid ? duration(item.uptime_seconds) : null);
    setCell(row, "port", item.port === null && item.url ? item.url : item.port);
    setCell(row, "busy", item.in_flight === undefined ? null : item.in_flight + " / " + item.queued);
    setCell(row, "memory", memory(item.memory_mb));
    const slots = item.slot_cache || {};
    setCell(row, "saved", slots.tokens === null || slots.tokens === undefined ? null : slots.tokens);
    cell(row, "saved").title = slots.skip ? "not kept across unloads: " + slots.skip : "";
    setCell(row, "restarts", budget ? budget.used + " / " + budget.max_restarts : item.restarts);
    setCell(row, "left", budget ? budget.remaining : null);
    const ejected = item.ejected_until ? duration(Math.max(0, item.ejected_until - now)) : null;
    setCell(row, "frees", budget && budget.frees_at ? duration(budget.frees_at - now) : ejected);
    setCell(row, "exit", item.last_exit);
    setCell(row, "reason", item.reason || item.last_restart_reason || item.error);
    setCell(row, "ttl", item.idle_ttl_remaining === null ? null : duration(item.idle_ttl_remaining));
    actions(row, role, item);
    if (item.model_id && !knownModels.has(item.model_id)) {
      knownModels.add(item.model_id);
      const option = el("option", item.model_id);
      option.value = item.model_id;
      $("filter").appendChild(option);
    }
  }
}

// -- recent requests ------------------------------------------------------------------

// The newest first; a row opens its detail (request_detail.js). Rebuilt only when the
// list changed.
let requestsShown = "";

function renderRequests(list) {
  const signature = list.length + "|" + (list.length ? list[0].request_id + list[0].time : "");
  if (signature !== requestsShown) buildRequests(list);
  requestsShown = signature;
  RequestDetail.remember(list);
}

function buildRequests(list) {
  const body = $("requests").tBodies[0];
  const rows = list.map((r) => {
    const row = document.createElement("tr");
    const time = new Date(r.time * 1000).toLocaleTimeString();
    const tokens = dash(r.input_tokens) + " / " + dash(r.output_tokens);
    const named = r.alias ? r.alias + " \u2192 " + r.model : r.model;
    const replica = r.replica === null || r.replica === undefined ? "" : " (" + r.replica + ")";
    if (r.request_id) {
      row.dataset.requestId = String(r.request_id);
      row.tabIndex = 0;
      row.title = "show where its time went";
    }
    if (typeof r.status === "number" && r.status >= 400) row.className = "failed";
    for (const value of [time, named + replica, r.endpoint, r.status, r.queue_seconds,
      r.ttft_seconds, r.duration_seconds, tokens, r.tools]) {
      row.appendChild(el("td", dash(value)));
    }
    return row;
  });
  body.replaceChildren(...rows);
}

// Requests under way: where each waits (queued, loading, reading the prompt...) and how
// far it has come.
function stageProgress(r) {
  if (r.stage === "queued" && r.ahead !== undefined) return r.ahead + " ahead";
  if (r.prompt_tokens) return r.prompt_tokens_read + " / " + r.prompt_tokens + " tokens";
  return "";
}

function renderInFlight(list) {
  const body = $("in-flight").tBodies[0];
  const rows = list.map((r) => {
    const row = document.createElement("tr");
    row.dataset.stage = r.stage;
    for (const value of [r.model, r.endpoint, r.stream ? "yes" : "no", r.stage,
      stageProgress(r), r.stage_seconds, r.waited_seconds]) {
      row.appendChild(el("td", dash(value)));
    }
    return row;
  });
  body.replaceChildren(...rows);
}

// The registry the router routes by: its version and, once a reload or the supervisor
// applied it, its generation and when.
function renderRegistry(registry) {
  const shown = $("registry");
  if (!registry) return;
  let text = "registry " + dash(registry.version);
  if (registry.generation !== null && registry.generation !== undefined) {
    const applied = new Date(registry.loaded_at * 1000).toLocaleTimeString();
    text += " (generation " + registry.generation + ", applied " + applied + ")";
  }
  if (shown.textContent !== text) {
    if (shown.dataset.seen) document.dispatchEvent(new CustomEvent("slm:registry"));
    shown.dataset.seen = "yes";
    shown.textContent = text;
  }
  shown.title = "the registry the router routes by: " + dash(registry.path);
}

// The machine's free memory beside the budget and what the models hold; red while it is
// below the floor (loads refused, idle on-demand models unloaded).
function renderMemory(memory) {
  const shown = $("memory");
  if (!memory) return;
  let text = "free " + dash(memory.free_mb) + " MiB";
  if (memory.floor_mb) text += " (floor " + memory.floor_mb + ")";
  text += " · held " + dash(memory.held_mb) + " / budget " + dash(memory.budget_mb) + " MiB";
  if (memory.below_floor) text += " · below the floor";
  if (shown.textContent !== text) shown.textContent = text;
  shown.classList.toggle("bad", !!memory.below_floor);
  shown.title = "the machine's free memory (" + dash(memory.source) + ", floor " +
    dash(memory.floor_mb) + " MiB, loads resume at " + dash(memory.resume_mb) +
    " MiB) beside what the models hold and the memory budget";
}

// -- polling --------------------------------------------------------------------------

let pollTimer = null;
let pollGeneration = 0;

async function pollModels() {
  try {
    const response = await api("/v1/backends/health");
    if (!response.ok) throw new Error("HTTP " + response.status);
    renderModels(await response.json());
    const health = await api("/health");
    if (health.ok) {
      const body = await health.json();
      renderRegistry(body.registry);
      renderMemory(body.memory);
    }
    const requests = await api("/v1/ui/requests");
    if (requests.ok) {
      const listed = await requests.json();
      renderRequests(listed.data || []);
      renderInFlight(listed.in_flight || []);
    }
    say("updated " + new Date().toLocaleTimeString());
  } catch (error) {
    if (error.message !== "unauthorized") say("cannot reach the router: " + error.message, true);
  }
}

async function pollLoop(generation) {
  if (generation === undefined) generation = ++pollGeneration;
  clearTimeout(pollTimer);
  await pollModels();
  if (generation === pollGeneration) pollTimer = setTimeout(() => pollLoop(generation), POLL_MS);
}

// -- the watchdog timeline ------------------------------------------------------------

function eventModel(event) {
  return String(event.model_id || event.role || "");
}

function addEvent(event) {
  const timeline = $("timeline");
  const name = String(event.event || (event.unparsed !== undefined ? "unparsed" : "?"));
  const li = el("li", null, BAD_EVENTS.has(name) ? "bad" : GOOD_EVENTS.has(name) ? "good" : "");
  li.dataset.model = eventModel(event);
  li.dataset.event = name;
  li.appendChild(el("span", dash(event.ts), "ts"));
  li.appendChild(el("span", name, "name"));
  const details = [];
  for (const [key, value] of Object.entries(event)) {
    if (key === "ts" || key === "event") continue;
    details.push(key + "=" + (typeof value === "string" ? value : JSON.stringify(value)));
  }
  li.appendChild(el("span", details.join(" "), "details"));
  li.hidden = filterModel !== "" && li.dataset.model !== filterModel;
  timeline.prepend(li);
  while (timeline.children.length > MAX_EVENTS) timeline.lastElementChild.remove();
}

function applyFilter() {
  filterModel = $("filter").value;
  for (const li of $("timeline").children) {
    li.hidden = filterModel !== "" && li.dataset.model !== filterModel;
  }
}

function handleBlock(block) {
  const data = block.split("\n").filter((l) => l.startsWith("data:"))
    .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
  if (!data) return;
  try {
    addEvent(JSON.parse(data));
  } catch (error) {
    addEvent({ unparsed: data });
  }
}

async function streamEvents() {
  if (streamAbort) streamAbort.abort();
  const controller = new AbortController();
  streamAbort = controller;
  try {
    const response = await api("/v1/ui/events?recent=200", { signal: controller.signal });
    if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
    $("timeline").replaceChildren();
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        handleBlock(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (error) {
    if (controller.signal.aborted || error.message === "unauthorized") return;
  }
  if (streamAbort === controller) setTimeout(streamEvents, RECONNECT_MS);
}

// -- a model's log --------------------------------------------------------------------

async function showLog(role) {
  $("log-role").textContent = role;
  try {
    const response = await api("/v1/ui/logs/" + encodeURIComponent(role) + "?lines=200");
    const body = await response.json();
    if (!response.ok) throw new Error(dash(body.error && body.error.message));
    const lines = body.lines || [];
    $("log").textContent = lines.length ? lines.join("\n") : "(no log yet)";
  } catch (error) {
    $("log").textContent = "cannot read the log: " + error.message;
  }
}

// -- start ----------------------------------------------------------------------------

// Drawn when it changed, and only while the page is seen (else once it is again).
let historyUnseen = false;

function drawHistory(kept) {
  historyUnseen = document.hidden;
  if (historyUnseen) return;
  Charts.draw(kept);
  Lanes.draw(kept);
}

function start() {
  $("key").value = currentKey();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key").value.trim();
    if (key) sessionStorage.setItem(KEY_NAME, key);
    else sessionStorage.removeItem(KEY_NAME);
    $("key-form").classList.remove("refused");
    pollLoop();
    streamEvents();
    HistoryFeed.refresh();
    document.dispatchEvent(new CustomEvent("slm:key"));
  });
  $("filter").addEventListener("change", applyFilter);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && historyUnseen) drawHistory(HistoryFeed.kept);
  });
  Charts.build();
  Lanes.legend();
  RequestDetail.start();
  Playground.start();
  ModelAdmin.start();
  HistoryFeed.start(drawHistory);
  pollLoop();
  streamEvents();
}

document.addEventListener("DOMContentLoaded", start);
