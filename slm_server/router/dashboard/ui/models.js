// Adding a model: a pull from a hub (POST /v1/models/pull, its event stream read with
// fetch and shown as it comes: one bar per file with its bytes, rate, time left and
// where it resumed; the files already here; the model's path and, when added, the
// registry entry and the reload's outcome; or the error and its code), Cancel aborting
// the fetch (the router then cancels the pull), and the GGUF models found on this
// machine (GET /v1/models/local) with an Add for those no registry entry serves
// (POST /v1/models/add). A 403 `pull_disabled` turns the section into how to turn it
// on. Everything from the server is shown as text.
"use strict";

const ModelAdmin = (() => {
  const OFF = "pull_disabled";
  let running = null; // the pull under way: {controller}
  let listing = 0; // the newest ask of the local list: an older answer is stale
  let listed = ""; // the list shown, as it came: rebuilt only when it changed

  function setText(id, text) {
    const node = $(id);
    if (node.textContent !== text) node.textContent = text;
  }

  function setState(text, kind) {
    const state = $("am-state");
    state.textContent = text;
    state.dataset.state = kind || text;
  }

  function bytes(n) {
    if (typeof n !== "number" || !isFinite(n)) return "?";
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
    if (n < 1024 * 1024 * 1024) return (n / (1024 * 1024)).toFixed(1) + " MiB";
    return (n / (1024 * 1024 * 1024)).toFixed(2) + " GiB";
  }

  // The error of an answer's JSON body: {code, message} (either may be missing).
  function errorOf(body, status) {
    const error = body && typeof body === "object" ? body.error : null;
    if (error && typeof error === "object") {
      return { code: dash(error.code || error.type), message: dash(error.message) };
    }
    return { code: "HTTP " + status, message: typeof error === "string" ? error : "" };
  }

  async function bodyOf(response) {
    const text = await response.text();
    try {
      return JSON.parse(text);
    } catch (error) {
      return { error: text.trim().split("\n")[0].slice(0, 300) };
    }
  }

  // Model management is off on this router: say how to turn it on, hide the controls.
  function off(isOff) {
    $("am-off").hidden = !isOff;
    $("am-controls").hidden = isOff;
  }

  // -- the pull ----------------------------------------------------------------------

  function controls(busy) {
    $("am-pull").disabled = busy;
    $("am-cancel").disabled = !busy;
    $("am-reference").disabled = busy;
  }

  function clear() {
    $("am-files").replaceChildren();
    $("am-plan").hidden = true;
    $("am-error").hidden = true;
    $("am-result").hidden = true;
  }

  function showError(code, message) {
    const box = $("am-error");
    box.dataset.code = code;
    setText("am-error-code", code);
    setText("am-error-message", message);
    box.hidden = false;
  }

  function fileRow(name) {
    const box = $("am-files");
    for (const row of box.children) if (row.dataset.name === name) return row;
    const row = el("div", null, "am-file");
    row.dataset.name = name;
    row.dataset.state = "waiting";
    row.appendChild(el("span", name, "am-name"));
    const bar = el("progress", null, "am-bar");
    bar.setAttribute("aria-label", name);
    bar.max = 1;
    bar.value = 0;
    row.appendChild(bar);
    for (const part of ["am-bytes", "am-rate", "am-left", "am-resumed"]) {
      row.appendChild(el("span", "", part));
    }
    const path = el("span", "", "am-path");
    path.hidden = true;
    row.appendChild(path);
    box.appendChild(row);
    return row;
  }

  function part(row, name, text) {
    const node = row.querySelector("." + name);
    if (node.textContent !== text) node.textContent = text;
  }

  function fill(row, total, done) {
    const bar = row.querySelector("progress");
    if (typeof total === "number" && total > 0) {
      bar.max = total;
      bar.value = Math.min(done, total);
      row.dataset.percent = String(Math.floor((100 * Math.min(done, total)) / total));
    } else {
      bar.removeAttribute("value"); // indeterminate: the size is not known
      delete row.dataset.percent;
    }
  }

  function present(row, size) {
    row.dataset.state = "present";
    const bar = row.querySelector("progress");
    bar.max = 1;
    bar.value = 1;
    row.dataset.percent = "100";
    part(row, "am-bytes", bytes(size) + " · already here");
  }

  function planned(event) {
    const files = Array.isArray(event.files) ? event.files : [];
    for (const file of files) {
      const row = fileRow(String(file.name));
      row.dataset.size = String(file.size);
      if (file.present) present(row, file.size);
      else part(row, "am-bytes", "0 B / " + bytes(file.size));
    }
    const fetching = files.filter((f) => !f.present).length;
    const plan = $("am-plan");
    plan.textContent = dash(event.reference) + ": " + files.length + " file" +
      (files.length === 1 ? "" : "s") + ", " + fetching + " to fetch (" +
      bytes(event.to_fetch_bytes) + "; " + bytes(event.free_bytes) + " free)";
    plan.hidden = false;
    setState("fetching", "streaming");
  }

  function progress(event) {
    const row = fileRow(String(event.name));
    row.dataset.state = "fetching";
    const total = typeof event.total === "number" ? event.total : null;
    fill(row, total, event.done);
    const percent = row.dataset.percent ? " (" + row.dataset.percent + "%)" : "";
    part(row, "am-bytes", bytes(event.done) + " / " + (total === null ? "?" : bytes(total)) + percent);
    const rate = event.bytes_per_second;
    part(row, "am-rate", typeof rate === "number" ? bytes(Math.round(rate)) + "/s" : "");
    const left = event.seconds_left;
    part(row, "am-left", typeof left === "number" ? duration(left) + " left" : "");
    part(row, "am-resumed", event.resumed > 0 ? "resumed at " + bytes(event.resumed) : "");
  }

  function fileDone(event) {
    const row = fileRow(String(event.name));
    if (event.fetched) {
      row.dataset.state = "done";
      const size = Number(row.dataset.size);
      const bar = row.querySelector("progress");
      const total = size > 0 ? size : Number(bar.max) || 1;
      fill(row, total, total);
      part(row, "am-bytes", bytes(total) + " (100%)");
      part(row, "am-rate", "");
      part(row, "am-left", "");
    } else {
      present(row, Number(row.dataset.size));
    }
    const path = row.querySelector(".am-path");
    path.textContent = dash(event.path);
    path.hidden = false;
  }

  // A reload's outcome as one line: "version: 1a2b · added: x · unchanged: y, z".
  function outcome(value) {
    if (value === undefined || value === null) return "–";
    if (typeof value !== "object") return String(value);
    if (Array.isArray(value)) return value.length ? value.map(outcome).join(", ") : "-";
    return Object.entries(value).filter(([key]) => key !== "object").map(([key, item]) =>
      key + ": " + (item !== null && typeof item === "object" && !Array.isArray(item)
        ? JSON.stringify(item) : outcome(item))).join(" · ");
  }

  // The reload that followed an add: {reloaded: true, version, generation, added,
  // removed, replaced, unchanged} or {reloaded: false, reason}; anything else as it is.
  function reloadText(value) {
    if (!value || typeof value !== "object" || typeof value.reloaded !== "boolean") {
      return outcome(value);
    }
    if (!value.reloaded) return "not reloaded: " + dash(value.reason);
    const changes = ["added", "removed", "replaced", "unchanged"]
      .filter((what) => Array.isArray(value[what]) && value[what].length)
      .map((what) => " · " + what + ": " + outcome(value[what]));
    return "reloaded: registry " + dash(value.version) + " (generation " +
      dash(value.generation) + ")" + changes.join("");
  }

  // The entry's id (and role) and the reload's outcome, of a pull's `added` or an add's
  // answer.
  function addedText(added) {
    const role = added.role && added.role !== added.id ? " (role " + added.role + ")" : "";
    return dash(added.id) + role;
  }

  function reloadOf(added) {
    if (Object.hasOwn(added, "reload")) return added.reload;
    const rest = {};
    for (const [key, value] of Object.entries(added)) {
      if (!["id", "role", "entry"].includes(key)) rest[key] = value;
    }
    return rest;
  }

  function done(event) {
    setText("am-model-path", dash(event.model));
    const parts = Array.isArray(event.parts) ? event.parts.map(String) : [];
    setText("am-parts", parts.join("\n"));
    $("am-parts-box").hidden = parts.length < 2;
    setText("am-projector", dash(event.projector));
    $("am-projector-box").hidden = !event.projector;
    setText("am-fetched", bytes(event.fetched_bytes));
    $("am-fetched").parentNode.hidden = false;
    const added = event.added && typeof event.added === "object" ? event.added : null;
    setText("am-added-id", added ? addedText(added) : "");
    $("am-added-id").title = added && added.entry ? JSON.stringify(added.entry, null, 1) : "";
    $("am-added-box").hidden = !added;
    setText("am-reload", added ? reloadText(reloadOf(added)) : "");
    $("am-reload-box").hidden = !added;
    $("am-result").hidden = false;
  }

  // What a check found wrong with an entry, one per line after the message.
  function problems(list) {
    return Array.isArray(list) && list.length ? "\n" + list.map((p) => "  " + p).join("\n") : "";
  }

  // Pulled, but the add that followed failed: the model's path alone.
  function pulledOnly(model) {
    done({ model, parts: [], projector: null, fetched_bytes: null, added: null });
    $("am-fetched").parentNode.hidden = true;
  }

  // One event of the stream; true once the pull has ended (done or error).
  function take(event) {
    switch (event.type) {
      case "planned": planned(event); return false;
      case "progress": progress(event); return false;
      case "file": fileDone(event); return false;
      case "done": done(event); setState("done"); return true;
      case "error":
        showError(dash(event.code), dash(event.message) + problems(event.problems));
        if (event.model) pulledOnly(event.model);
        setState("error: " + dash(event.code), "error");
        return true;
      default: return false;
    }
  }

  async function read(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let ended = false;
    for (;;) {
      const { value, done: finished } = await reader.read();
      buffer += finished ? decoder.decode() : decoder.decode(value, { stream: true });
      const blocks = buffer.split(/\r?\n\r?\n/);
      buffer = finished ? "" : blocks.pop();
      for (const block of blocks) {
        const parsed = Shapes.parseBlock(block);
        if (parsed && take(parsed.data)) ended = true;
      }
      if (finished) return ended;
    }
  }

  async function pull() {
    if (running) return;
    const reference = $("am-reference").value.trim();
    if (!reference) {
      setState("error: enter a reference", "error");
      return;
    }
    const adding = $("am-add").checked;
    const id = $("am-id").value.trim();
    const body = {
      model: reference,
      add: adding,
      id: adding && id ? id : null,
      load: $("am-load").value,
    };
    const run = { controller: new AbortController() };
    running = run;
    clear();
    controls(true);
    setState("asking", "streaming");
    let ending = null;
    try {
      const response = await api("/v1/models/pull", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify(body),
        signal: run.controller.signal,
      });
      if (!response.ok) {
        const error = errorOf(await bodyOf(response), response.status);
        if (response.status === 403 && error.code === OFF) off(true);
        showError(error.code, error.message);
        ending = ["error: " + error.code, "error"];
      } else if (!(await read(response))) {
        showError("cut", "the stream ended before the pull did");
        ending = ["error: cut", "error"];
      }
    } catch (error) {
      if (run.controller.signal.aborted) ending = ["cancelled"];
      else if (error.message === "unauthorized") ending = ["error: the API key was not accepted", "error"];
      else ending = ["error: " + error.message, "error"];
    }
    running = null;
    controls(false);
    if (ending) setState(ending[0], ending[1]);
    refreshLocal();
  }

  function cancel() {
    if (running) running.controller.abort();
  }

  // -- the models on this machine ----------------------------------------------------

  const LOCAL_COLUMNS = ["name", "size", "quantization", "context_length", "type", "served_as", "path"];

  function localRow(item) {
    const row = document.createElement("tr");
    row.dataset.name = String(item.name);
    const served = Array.isArray(item.served_as) ? item.served_as.map(String) : [];
    row.dataset.served = served.join(",");
    for (const column of LOCAL_COLUMNS) {
      let value = item[column];
      if (column === "size") value = typeof value === "number" ? bytes(value) : null;
      if (column === "served_as") value = served.join(", ");
      row.appendChild(el("td", dash(value), column));
    }
    const action = el("td", null, "action");
    if (!served.length) {
      const button = el("button", "Add", "add");
      button.type = "button";
      button.dataset.action = "add";
      button.title = "add a registry entry for this file (load on demand) and reload";
      button.addEventListener("click", () => add(String(item.name), button));
      action.appendChild(button);
    }
    row.appendChild(action);
    return row;
  }

  async function refreshLocal() {
    const asked = ++listing;
    const state = $("am-local-state");
    let response;
    let body;
    try {
      response = await api("/v1/models/local");
      body = await bodyOf(response);
    } catch (error) {
      if (asked !== listing) return;
      state.textContent = error.message === "unauthorized"
        ? "(needs the API key)" : "(cannot list: " + error.message + ")";
      return;
    }
    if (asked !== listing) return;
    if (!response.ok) {
      const error = errorOf(body, response.status);
      off(response.status === 403 && error.code === OFF);
      state.textContent = "(cannot list: " + error.code + ": " + error.message + ")";
      return;
    }
    off(false);
    const list = Array.isArray(body) ? body : Array.isArray(body.data) ? body.data : [];
    state.textContent = "(" + list.length + " found)";
    state.dataset.count = String(list.length);
    const signature = JSON.stringify(list);
    if (signature === listed) return;
    listed = signature;
    const rows = list.map(localRow);
    if (!rows.length) {
      const none = el("tr", null, "none");
      const cell = el("td", "no GGUF models found", "mute");
      cell.colSpan = LOCAL_COLUMNS.length + 1;
      none.appendChild(cell);
      rows.push(none);
    }
    $("am-local").tBodies[0].replaceChildren(...rows);
  }

  function said(text, kind) {
    const box = $("am-add-outcome");
    box.textContent = text;
    box.dataset.state = kind;
    box.hidden = false;
  }

  async function add(name, button) {
    button.disabled = true;
    said("adding " + name + "…", "busy");
    try {
      const response = await api("/v1/models/add", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model: name, id: null, load: "on_demand" }),
      });
      const body = await bodyOf(response);
      if (response.ok) {
        said(name + " added as " + addedText(body) + "; " + reloadText(reloadOf(body)), "done");
      } else {
        const error = errorOf(body, response.status);
        if (response.status === 403 && error.code === OFF) off(true);
        const found = body && body.error ? problems(body.error.problems) : "";
        said(name + " not added: " + error.code + ": " + error.message + found, "error");
      }
    } catch (error) {
      said(name + " not added: " + error.message, "error");
    } finally {
      button.disabled = false;
      refreshLocal();
    }
  }

  function start() {
    $("am-form").addEventListener("submit", (event) => {
      event.preventDefault();
      pull();
    });
    $("am-cancel").addEventListener("click", cancel);
    $("am-add").addEventListener("change", () => {
      $("am-id").disabled = !$("am-add").checked;
      $("am-load").disabled = !$("am-add").checked;
    });
    document.addEventListener("slm:key", refreshLocal);
    document.addEventListener("slm:registry", refreshLocal);
    controls(false);
    setState("idle");
    refreshLocal();
  }

  return { start, refreshLocal };
})();
