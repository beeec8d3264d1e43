// The playground: one message to any model or alias, in any of the three API shapes
// (shapes.js), always streamed. The answer is read with fetch and a ReadableStream and
// shown as it comes: its text, its thinking and its tool calls apart; the time to the
// first token (from send to the first delta), the tokens per second (the final usage's
// completion tokens over the time from the first delta to the last), the prompt
// tokens read from cache, and the exact bodies sent and received. Stop aborts the
// fetch, and the router then cancels the request upstream.
"use strict";

const Playground = (() => {
  const MAX_RAW_CHARS = 1000000;
  const NOT_CHAT = new Set(["embeddings", "rerank", "whisper", "image-generation", "image-edit"]);
  let running = null; // the run under way: {controller, ...}
  let offered = "";

  function setState(text) {
    const state = $("pg-state");
    state.textContent = text;
    state.dataset.state = text.startsWith("error") ? "error" : text;
  }

  function fresh() {
    return {
      controller: new AbortController(),
      sentAt: performance.now(),
      first: null,
      last: null,
      answer: "",
      thinking: "",
      tools: new Map(),
      usage: {},
      raw: "",
      error: null,
      scheduled: false,
    };
  }

  // What the shape's reader reports into, for one run.
  function sink(run) {
    const delta = () => {
      const now = performance.now();
      if (run.first === null) run.first = now;
      run.last = now;
      schedule(run);
    };
    return {
      text(piece) {
        if (!piece) return;
        run.answer += piece;
        delta();
      },
      thinking(piece) {
        if (!piece) return;
        run.thinking += piece;
        delta();
      },
      tool(key, name, piece) {
        const id = String(key === undefined || key === null ? run.tools.size : key);
        const call = run.tools.get(id) || { name: "", args: "" };
        if (name) call.name = String(name);
        if (piece) call.args += String(piece);
        run.tools.set(id, call);
        delta();
      },
      usage(figures) {
        for (const [name, value] of Object.entries(figures)) {
          if (typeof value === "number") run.usage[name] = value;
        }
      },
      error(message) {
        run.error = message;
      },
    };
  }

  function schedule(run) {
    if (run.scheduled) return;
    run.scheduled = true;
    requestAnimationFrame(() => show(run));
  }

  function setText(id, text) {
    const node = $(id);
    if (node.textContent !== text) node.textContent = text;
  }

  function tools(run) {
    const box = $("pg-tools");
    const calls = Array.from(run.tools.values());
    while (box.children.length > calls.length) box.lastElementChild.remove();
    calls.forEach((call, i) => {
      let item = box.children[i];
      if (!item) {
        item = el("div", null, "pg-call");
        item.appendChild(el("span", "", "pg-call-name"));
        item.appendChild(el("pre", "", "pg-call-args"));
        box.appendChild(item);
      }
      const name = call.name || "(a tool)";
      if (item.firstChild.textContent !== name) item.firstChild.textContent = name;
      if (item.lastChild.textContent !== call.args) item.lastChild.textContent = call.args;
    });
  }

  function figures(run, ended) {
    setText("pg-ttft", run.first === null ? "–" : String(Math.round(run.first - run.sentAt)));
    const output = run.usage.output;
    if (ended && typeof output === "number" && run.first !== null) {
      // A single delta: its time is the one from it to the end of the stream.
      const seconds = ((run.last > run.first ? run.last : performance.now()) - run.first) / 1000;
      setText("pg-tps", seconds > 0 ? (output / seconds).toFixed(1) : "–");
    }
    setText("pg-cached", typeof run.usage.cached === "number" ? String(run.usage.cached) : "–");
    const input = typeof run.usage.input === "number" ? run.usage.input : "–";
    setText("pg-usage", input + " / " + (typeof output === "number" ? output : "–"));
  }

  function show(run, ended) {
    run.scheduled = false;
    if (run !== running) return;
    setText("pg-answer", run.answer);
    setText("pg-thinking", run.thinking);
    $("pg-thinking-box").hidden = !run.thinking;
    tools(run);
    $("pg-tools-box").hidden = run.tools.size === 0;
    setText("pg-response", run.raw);
    figures(run, ended);
  }

  function received(run, text) {
    if (run.raw.length < MAX_RAW_CHARS) {
      run.raw += text;
      if (run.raw.length >= MAX_RAW_CHARS) run.raw = run.raw.slice(0, MAX_RAW_CHARS) + "\n… (cut here)";
    }
  }

  async function read(run, response, shape) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    const into = sink(run);
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      const text = done ? decoder.decode() : decoder.decode(value, { stream: true });
      received(run, text);
      buffer += text;
      const blocks = buffer.split(/\r?\n\r?\n/);
      buffer = done ? "" : blocks.pop();
      for (const block of blocks) {
        const parsed = Shapes.parseBlock(block);
        if (parsed) shape.read(parsed.event, parsed.data, into);
      }
      schedule(run);
      if (done) return;
    }
  }

  function controls(busy) {
    $("pg-send").disabled = busy;
    $("pg-stop").disabled = !busy;
  }

  async function send() {
    if (running) return;
    const model = $("pg-model").value;
    const shape = Shapes[$("pg-shape").value];
    const text = $("pg-input").value;
    const maxTokens = Math.max(1, Math.min(1000000, parseInt($("pg-max-tokens").value, 10) || 256));
    if (!model || !text.trim()) {
      setState("error: choose a model and type a message");
      return;
    }
    const body = JSON.stringify(shape.body(model, text, maxTokens), null, 2);
    const run = fresh();
    running = run;
    for (const id of ["pg-answer", "pg-thinking", "pg-response", "pg-tps", "pg-ttft", "pg-cached", "pg-usage"]) {
      setText(id, id === "pg-answer" || id === "pg-thinking" || id === "pg-response" ? "" : "–");
    }
    $("pg-tools").replaceChildren();
    $("pg-tools-box").hidden = true;
    $("pg-thinking-box").hidden = true;
    setText("pg-endpoint", "POST " + shape.path);
    setText("pg-request", body);
    setState("streaming");
    controls(true);
    const key = currentKey();
    let ending;
    try {
      const response = await fetch(shape.path, {
        method: "POST",
        headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
        body,
        signal: run.controller.signal,
      });
      if (!response.ok) {
        received(run, await response.text());
        if (response.status === 401) unauthorized(key);
        ending = "error: " + Shapes.errorMessage(run.raw, response.status);
      } else {
        await read(run, response, shape);
        ending = run.error !== null ? "error: " + run.error : "done";
      }
    } catch (error) {
      ending = run.controller.signal.aborted ? "stopped" : "error: " + error.message;
    }
    show(run, true);
    running = null;
    controls(false);
    setState(ending);
  }

  function stop() {
    if (running) running.controller.abort();
  }

  function option(value, text) {
    const made = el("option", text);
    made.value = value;
    return made;
  }

  // The models that answer chat, and their aliases (listed or not), into #pg-model;
  // the choice is kept when it is still offered.
  async function loadModels() {
    let listed;
    try {
      const response = await api("/v1/models");
      if (!response.ok) return;
      listed = (await response.json()).data || [];
    } catch (error) {
      return;
    }
    const models = [];
    const aliases = new Map();
    for (const item of listed) {
      if (NOT_CHAT.has(item.model_type)) continue;
      if (item.alias_of) aliases.set(String(item.id), String(item.alias_of));
      else {
        models.push(String(item.id));
        for (const name of item.aliases || []) aliases.set(String(name), String(item.id));
      }
    }
    const signature = JSON.stringify([models, Array.from(aliases)]);
    if (signature === offered) return;
    offered = signature;
    const select = $("pg-model");
    const chosen = select.value;
    const groups = [];
    const own = el("optgroup");
    own.label = "models";
    for (const id of models) own.appendChild(option(id, id));
    groups.push(own);
    if (aliases.size) {
      const named = el("optgroup");
      named.label = "aliases";
      for (const [name, id] of aliases) named.appendChild(option(name, name + " \u2192 " + id));
      groups.push(named);
    }
    select.replaceChildren(...groups);
    if (chosen && (models.includes(chosen) || aliases.has(chosen))) select.value = chosen;
  }

  function start() {
    $("pg-form").addEventListener("submit", (event) => {
      event.preventDefault();
      send();
    });
    $("pg-input").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        send();
      }
    });
    $("pg-stop").addEventListener("click", stop);
    $("pg-bodies").addEventListener("click", () => {
      const box = $("pg-bodies-box");
      box.hidden = !box.hidden;
      $("pg-bodies").textContent = box.hidden ? "show the bodies" : "hide the bodies";
    });
    document.addEventListener("slm:key", loadModels);
    document.addEventListener("slm:registry", loadModels);
    setState("idle");
    controls(false);
    loadModels();
  }

  return { start };
})();
