// One recent request in detail (#request-detail), opened from its row of #requests:
// where its time went as a stacked bar (queued for admission, waiting for its model to
// load, waiting for the first byte from upstream, streaming), and what the router knows
// of it: status and why, backend and replica, alias and preset layers, cached tokens.
"use strict";

const RequestDetail = (() => {
  const PARTS = [
    ["queued", "queued"], ["load", "load waited"], ["upstream", "to first byte"], ["streamed", "streamed"],
  ];
  const known = new Map(); // request id -> its row of /v1/ui/requests, the last poll's
  let chosen = null;
  let shown = "";

  const number = (value) => (typeof value === "number" && Number.isFinite(value) ? value : null);
  const secondsText = (value) => (number(value) === null ? "–" : number(value).toFixed(3) + " s");

  function firstByteOf(r) {
    return number(r.first_byte_seconds !== undefined ? r.first_byte_seconds : r.ttft_seconds);
  }

  // The time from the first chunk to the last; when the router has none (an answer in
  // one chunk), the time from the first byte to the end.
  function streamedOf(r) {
    const streamed = number(r.streamed_seconds);
    if (streamed !== null) return streamed;
    const firstByte = firstByteOf(r);
    const total = number(r.duration_seconds);
    return firstByte === null || total === null ? null : Math.max(0, total - firstByte);
  }

  // Where the time went, in seconds: first_byte_seconds runs from the arrival, so the
  // wait upstream is what is left of it after the queue and the load.
  function parts(r) {
    const queued = number(r.queue_seconds) || 0;
    const load = number(r.load_seconds) || 0;
    const total = number(r.duration_seconds) || 0;
    const streamed = streamedOf(r) || 0;
    const firstByte = firstByteOf(r);
    const reached = firstByte !== null ? firstByte : Math.max(0, total - streamed);
    return { queued, load, upstream: Math.max(0, reached - queued - load), streamed };
  }

  function bar(r) {
    const split = parts(r);
    const sum = PARTS.reduce((all, [name]) => all + split[name], 0);
    const box = $("rd-bar");
    box.replaceChildren(...PARTS.map(([name, label]) => {
      const part = el("span", null, "rd-part rd-" + name);
      part.style.width = (sum > 0 ? (100 * split[name]) / sum : 0).toFixed(2) + "%";
      part.title = label + ": " + split[name].toFixed(3) + " s";
      return part;
    }));
  }

  function set(name, text) {
    const field = document.querySelector(`#request-detail [data-field="${name}"]`);
    if (field.textContent !== text) field.textContent = text;
  }

  function render(r) {
    const signature = JSON.stringify(r);
    if (signature === shown) return;
    shown = signature;
    $("request-detail").hidden = false;
    const model = r.alias ? r.alias + " \u2192 " + r.model : String(r.model);
    $("rd-title").textContent = model + " · " + dash(r.endpoint) + " · " +
      new Date(r.time * 1000).toLocaleTimeString() + " · " + dash(r.request_id);
    bar(r);
    set("queued", secondsText(r.queue_seconds));
    set("load", secondsText(r.load_seconds));
    set("first_byte", secondsText(firstByteOf(r)));
    set("streamed", secondsText(streamedOf(r)));
    set("total", secondsText(r.duration_seconds));
    set("status", dash(r.status) + (r.error_type ? " " + r.error_type : ""));
    // Why: the router's own message when it has one, else how the request ended.
    set("why", dash(r.error_message || (r.outcome && r.outcome !== "ok" ? r.outcome : null)));
    set("backend", dash(r.backend));
    set("replica", dash(r.replica));
    set("alias", dash(r.alias));
    set("preset", Array.isArray(r.preset) && r.preset.length ? r.preset.join(", ") : "–");
    set("cached", dash(r.cached_tokens));
  }

  function mark() {
    for (const row of $("requests").tBodies[0].rows) {
      row.classList.toggle("chosen", row.dataset.requestId === chosen);
    }
  }

  // The rows of the last poll; the one chosen is shown again if it changed.
  function remember(list) {
    known.clear();
    for (const r of list) if (r.request_id) known.set(String(r.request_id), r);
    if (chosen !== null && known.has(chosen)) render(known.get(chosen));
    mark();
  }

  function open(id) {
    const r = known.get(id);
    if (!r) return;
    chosen = id;
    render(r);
    mark();
  }

  function close() {
    chosen = null;
    shown = "";
    $("request-detail").hidden = true;
    mark();
  }

  function start() {
    const body = $("requests").tBodies[0];
    const pick = (event) => {
      const row = event.target.closest("tr[data-request-id]");
      if (row) open(row.dataset.requestId);
    };
    body.addEventListener("click", pick);
    body.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        pick(event);
      }
    });
    $("rd-close").addEventListener("click", close);
  }

  return { start, remember };
})();
