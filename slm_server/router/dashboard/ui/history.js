// The router's history (GET /v1/ui/history), kept in the page: asked for every POLL_MS
// with ?since=<the last sample's time>, so each answer brings only what is new; the
// samples are appended, aligned per model and per backend (null where one was absent),
// and those older than the router's own keep_seconds are dropped. Whoever drew the
// history is called again only when something changed.
"use strict";

const HistoryFeed = (() => {
  const POLL_MS = 2000;
  const MAX_SAMPLES = 4000; // whatever keep_seconds / interval_seconds would allow
  const MAX_EVENTS = 1000;
  const AHEAD_SECONDS = 60; // how far past the newest sample the time axes may reach
  const MACHINE = ["free_mb", "floor_mb", "budget_mb", "held_mb"];

  // What the page keeps: the sample times, and per sample the machine's figures, each
  // model's series and each backend's lane state; the lifecycle events; the budgets.
  const kept = {
    times: [],
    machine: Object.fromEntries(MACHINE.map((name) => [name, []])),
    models: new Map(), // model id -> {series: {name: [values]}}
    backends: new Map(), // role -> {role, model, states: [], budget}
    events: [],
    keepSeconds: 3600,
    intervalSeconds: 5,
    now: null,
  };
  const eventKeys = new Set();
  let timer = null;
  let draw = () => {};

  function last(values) {
    return values.length ? values[values.length - 1] : null;
  }

  // values[from..] as `count` entries (null where the answer had fewer), appended after
  // padding `into` with nulls up to `length`.
  function extend(into, values, from, count, length) {
    while (into.length < length) into.push(null);
    for (let i = 0; i < count; i++) {
      const value = Array.isArray(values) ? values[from + i] : undefined;
      into.push(value === undefined ? null : value);
    }
  }

  function padAll(arrays, length) {
    for (const values of arrays) while (values.length < length) values.push(null);
  }

  function appendModels(answer, from, count, length) {
    for (const item of answer.models || []) {
      const id = String(item.model);
      let model = kept.models.get(id);
      if (!model) kept.models.set(id, (model = { series: {} }));
      for (const [name, values] of Object.entries(item.series || {})) {
        if (!model.series[name]) model.series[name] = [];
        extend(model.series[name], values, from, count, length);
      }
    }
    for (const model of kept.models.values()) padAll(Object.values(model.series), length + count);
  }

  // Whether a backend's budget changed (it is redrawn even with no new sample).
  function appendBackends(answer, from, count, length) {
    let changed = false;
    for (const item of answer.backends || []) {
      const role = String(item.role);
      let backend = kept.backends.get(role);
      if (!backend) kept.backends.set(role, (backend = { role, model: null, states: [], budget: null }));
      backend.model = item.model === undefined ? backend.model : item.model;
      extend(backend.states, item.states, from, count, length);
      const budget = item.restart_budget || null;
      if (JSON.stringify(budget) !== JSON.stringify(backend.budget)) changed = true;
      backend.budget = budget;
    }
    padAll(Array.from(kept.backends.values(), (b) => b.states), length + count);
    return changed;
  }

  function appendEvents(events) {
    let added = 0;
    for (const event of events || []) {
      if (!event || typeof event.ts !== "number") continue;
      // An event later than the last sample comes again with the next answer.
      const key = event.ts + "|" + event.event + "|" + event.role;
      if (eventKeys.has(key)) continue;
      eventKeys.add(key);
      kept.events.push(event);
      added += 1;
    }
    if (added) kept.events.sort((a, b) => a.ts - b.ts);
    return added;
  }

  // Drops what the router no longer keeps either (and anything past the caps).
  function trim() {
    const newest = kept.now !== null ? kept.now : last(kept.times);
    const cutoff = newest - kept.keepSeconds;
    let drop = 0;
    while (drop < kept.times.length && kept.times[drop] < cutoff) drop++;
    drop = Math.max(drop, kept.times.length - MAX_SAMPLES);
    if (drop > 0) {
      kept.times.splice(0, drop);
      for (const values of Object.values(kept.machine)) values.splice(0, drop);
      for (const [id, model] of kept.models) {
        for (const values of Object.values(model.series)) values.splice(0, drop);
        const any = Object.values(model.series).some((v) => v.some((x) => x !== null));
        if (!any) kept.models.delete(id); // a model a reload removed, gone from the window
      }
      for (const [role, backend] of kept.backends) {
        backend.states.splice(0, drop);
        if (!backend.states.some((s) => s !== null)) kept.backends.delete(role);
      }
    }
    const first = kept.times.length ? kept.times[0] : cutoff;
    let old = 0;
    while (old < kept.events.length && kept.events[old].ts < first) old++;
    old = Math.max(old, kept.events.length - MAX_EVENTS);
    for (const event of kept.events.splice(0, old)) {
      eventKeys.delete(event.ts + "|" + event.event + "|" + event.role);
    }
  }

  // Takes one answer in; whether anything the page draws changed.
  function append(answer) {
    if (typeof answer.keep_seconds === "number") kept.keepSeconds = answer.keep_seconds;
    if (typeof answer.interval_seconds === "number") kept.intervalSeconds = answer.interval_seconds;
    if (typeof answer.now === "number") kept.now = answer.now;
    const times = Array.isArray(answer.times) ? answer.times : [];
    const newest = last(kept.times);
    let from = 0;
    while (from < times.length && newest !== null && !(times[from] > newest)) from++;
    const count = times.length - from;
    const length = kept.times.length;
    for (const name of MACHINE) {
      extend(kept.machine[name], (answer.machine || {})[name], from, count, length);
    }
    appendModels(answer, from, count, length);
    const budgets = appendBackends(answer, from, count, length);
    for (let i = from; i < times.length; i++) kept.times.push(times[i]);
    const events = appendEvents(answer.events);
    trim();
    return count > 0 || events > 0 || budgets;
  }

  let generation = 0;

  async function poll(mine) {
    const newest = last(kept.times);
    const query = newest === null ? "" : "?since=" + encodeURIComponent(String(newest));
    try {
      const response = await api("/v1/ui/history" + query);
      if (response.ok && append(await response.json())) draw(kept);
    } catch (error) {
      // 401 is said in #status by api(); anything else is tried again at the next poll.
    }
    if (mine === generation) timer = setTimeout(() => poll(mine), POLL_MS);
  }

  // Asks at once (a key was just entered), then every POLL_MS.
  function refresh() {
    clearTimeout(timer);
    generation += 1;
    poll(generation);
  }

  // Polls from now on; `drawer(kept)` is called after each change.
  function start(drawer) {
    draw = drawer;
    draw(kept);
    refresh();
  }

  // The time the charts and the lanes span: from the first sample (or a minute before
  // the last, while there is less than a minute of them: the newest stays at the right)
  // to `end`, the latest sample or event but never more than AHEAD_SECONDS after the
  // newest sample (an event stamped far ahead, forged or from a clock ahead, would
  // crush every sample into the left edge); null before the first sample.
  function span() {
    if (!kept.times.length) return null;
    const first = kept.times[0];
    const newest = last(kept.times);
    const lastEvent = kept.events.length ? kept.events[kept.events.length - 1].ts : first;
    const end = Math.min(Math.max(newest, lastEvent), newest + AHEAD_SECONDS);
    return { t0: Math.min(first, end - 60), t1: end, end };
  }

  return { start, refresh, span, kept };
})();
