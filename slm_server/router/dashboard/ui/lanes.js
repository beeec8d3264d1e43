// The watchdog's timeline: per backend a lane of its states over the kept history,
// from the states sampled with each history sample, refined by the lifecycle events
// (each event with a lane starts a segment of that state at its exact time, its reason
// in the segment's <title>); beside it the restart budget as what is left of it.
"use strict";

const Lanes = (() => {
  const WIDTH = 1000; // the lane's own units; it is stretched to its box
  const MIN_WIDTH = 3; // a short restart stays visible in an hour
  const MAX_PIPS = 20;
  const LEGEND = [
    ["ready", "ready"], ["loading", "starting, loading"], ["suspected", "suspected, confirming"],
    ["restarting", "restarting"], ["abandoned", "abandoned, failed"],
    ["unloaded", "unloading, unloaded, retired, stopped"],
  ];

  function legend() {
    const box = $("lane-legend");
    for (const [state, text] of LEGEND) {
      const item = el("span", null, "legend-item");
      const chip = el("span", null, "chip");
      chip.dataset.state = state;
      item.appendChild(chip);
      item.appendChild(el("span", text));
      box.appendChild(item);
    }
  }

  // The lane's change points: sampled states and the events for this role, in time
  // order (an event before a sample taken at the same instant).
  function changes(backend, kept) {
    const points = [];
    kept.times.forEach((t, i) => points.push({ t, state: backend.states[i], sampled: true }));
    for (const event of kept.events) {
      if (event.lane && event.role === backend.role) {
        points.push({ t: event.ts, state: event.lane, event: event.event, reason: event.reason });
      }
    }
    return points.sort((a, b) => a.t - b.t || (a.sampled ? 1 : 0) - (b.sampled ? 1 : 0));
  }

  // Segments {state, start, end, event, reason}: a sample continues the segment of the
  // same state, an event always begins one, a null sample ends it (no lane there).
  function segments(backend, kept, span) {
    const made = [];
    let current = null;
    const close = (t) => {
      if (current) {
        current.end = t;
        made.push(current);
      }
      current = null;
    };
    for (const point of changes(backend, kept)) {
      if (point.state === null || point.state === undefined) {
        close(point.t);
      } else if (!point.sampled || !current || current.state !== point.state) {
        close(point.t);
        current = { state: String(point.state), start: point.t, event: point.event, reason: point.reason };
      }
    }
    close(span.end);
    return made.filter((s) => s.end > span.t0).map((s) => ({ ...s, start: Math.max(s.start, span.t0) }));
  }

  function about(segment) {
    const first = segment.state + " — " + (segment.reason || segment.event || "as sampled");
    const lasted = Math.max(0, segment.end - segment.start);
    const when = (segment.event ? segment.event + " at " : "from ") + Plot.clock(segment.start, true) +
      ", for " + Plot.seconds(lasted);
    return first + "\n" + when;
  }

  function bar(svg, list, span) {
    const x = Plot.scale(span.t0, span.t1, 0, WIDTH);
    let cursor = 0;
    const rects = list.map((segment) => {
      const start = Math.min(Math.max(x(segment.start), cursor), WIDTH - MIN_WIDTH);
      const width = Math.max(Math.min(x(segment.end), WIDTH) - start, MIN_WIDTH);
      cursor = start + width;
      const rect = Plot.node("rect", {
        class: "segment", "data-state": segment.state, x: start.toFixed(2), y: 0,
        width: width.toFixed(2), height: 20, "vector-effect": "non-scaling-stroke",
      });
      return Plot.titled(rect, about(segment));
    });
    svg.replaceChildren(...rects);
  }

  function budget(box, known, now) {
    if (!known || typeof known.limit !== "number") {
      box.removeAttribute("data-left");
      box.removeAttribute("data-limit");
      box.replaceChildren(el("span", "no restart budget", "mute"));
      return;
    }
    const left = Math.max(0, Number(known.left));
    box.dataset.left = String(left);
    box.dataset.limit = String(known.limit);
    box.title = known.used + " of " + known.limit + " restarts used in the window";
    const shown = [];
    if (known.limit <= MAX_PIPS) {
      const pips = el("span", null, "pips");
      for (let i = 0; i < known.limit; i++) pips.appendChild(el("span", null, i < left ? "pip left" : "pip used"));
      shown.push(pips);
    }
    let text = left + "/" + known.limit + " left";
    if (known.frees_in_seconds !== null && known.frees_in_seconds !== undefined && now !== null) {
      text += ", next at " + Plot.clock(now + known.frees_in_seconds, false);
      box.title += "; the oldest leaves it at " + Plot.clock(now + known.frees_in_seconds, true);
    }
    shown.push(el("span", text, "budget-text"));
    box.replaceChildren(...shown);
  }

  function lane(box, backend) {
    let row = Array.from(box.children).find((r) => r.classList.contains("lane") && r.dataset.role === backend.role);
    if (!row) {
      row = el("div", null, "lane");
      row.dataset.role = backend.role;
      const name = el("div", null, "lane-name");
      name.appendChild(el("strong", backend.role));
      name.appendChild(el("span", "", "mute"));
      row.appendChild(name);
      row.appendChild(Plot.node("svg", {
        class: "lane-bar", viewBox: `0 0 ${WIDTH} 20`, preserveAspectRatio: "none",
        role: "img", "aria-label": "the states of " + backend.role + " over time",
      }));
      row.appendChild(el("div", null, "budget"));
      box.insertBefore(row, $("lane-axis"));
    }
    row.dataset.model = backend.model || "";
    row.firstChild.title = backend.role + (backend.model ? " (" + backend.model + ")" : "");
    const model = row.querySelector(".lane-name .mute");
    const shown = backend.model && backend.model !== backend.role ? backend.model : "";
    if (model.textContent !== shown) model.textContent = shown;
    return row;
  }

  function axis(span) {
    const ticks = $("lane-axis").querySelector(".lane-ticks");
    const { values, step } = Plot.timeTicks(span.t0, span.t1, 8);
    const x = Plot.scale(span.t0, span.t1, 0, 100);
    ticks.replaceChildren(...values.map((t) => {
      const label = el("span", Plot.clock(t, step < 60), "lane-tick");
      label.style.left = x(t).toFixed(2) + "%";
      return label;
    }));
  }

  function draw(kept) {
    const box = $("lanes");
    const span = HistoryFeed.span();
    const empty = $("lanes-empty");
    empty.hidden = !!(span && kept.backends.size);
    $("lane-axis").hidden = !empty.hidden;
    if (!span) return;
    for (const row of Array.from(box.querySelectorAll(".lane"))) {
      if (!kept.backends.has(row.dataset.role)) row.remove();
    }
    for (const backend of kept.backends.values()) {
      const row = lane(box, backend);
      bar(row.querySelector("svg.lane-bar"), segments(backend, kept, span), span);
      budget(row.querySelector(".budget"), backend.budget, kept.now);
    }
    axis(span);
  }

  return { legend, draw };
})();
