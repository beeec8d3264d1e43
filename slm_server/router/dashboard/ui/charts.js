// The six charts over time, drawn by hand in SVG from the kept history (history.js):
// one colour per model, one line style per series, a null value breaks the line, and
// the lifecycle events (restarts, loads, unloads, evictions, reloads) as marks on every
// chart's time axis. Each series is a <path class="series" data-series data-model
// data-points> whose d holds one "M x y" or "L x y" per value drawn.
"use strict";

const Charts = (() => {
  const W = 460;
  const H = 190;
  const TOP = 10;
  const BOTTOM = 22;
  const LEFT = 46;
  const RIGHT = 12;
  const RIGHT_AXIS = 46;
  const STYLES = {
    solid: { dash: null, width: 1.8 },
    dashed: { dash: "6 4", width: 1.5 },
    dotted: { dash: "1.5 3", width: 2 },
    dashdot: { dash: "8 3 2 3", width: 1.5 },
  };
  const MARKS = ["restart", "load", "unload", "eviction", "reload"];
  // More samples than this (a short interval) are drawn a bucket of samples per vertex.
  const MAX_VERTICES = 720;
  const CHARTS = [
    {
      name: "requests", title: "Requests per second", what: "by model and outcome",
      format: Plot.short,
      // Drawn in this order, so that the ok line lies on top of the others.
      series: [
        { key: "requests_cut", label: "cut", style: "dashdot" },
        { key: "requests_backend_error", label: "backend error", style: "dotted" },
        { key: "requests_client_error", label: "client error", style: "dashed" },
        { key: "requests_ok", label: "ok", style: "solid" },
      ],
    },
    {
      name: "ttft", title: "Time to first token", what: "streamed requests, p50 and p95",
      format: Plot.seconds,
      series: [
        { key: "ttft_p95", label: "p95", style: "dashed" },
        { key: "ttft_p50", label: "p50", style: "solid" },
      ],
    },
    {
      name: "tokens_per_second", title: "Tokens per second", what: "p50 and p95",
      format: Plot.short,
      series: [
        { key: "tokens_per_second_p95", label: "p95", style: "dashed" },
        { key: "tokens_per_second_p50", label: "p50", style: "solid" },
      ],
    },
    {
      name: "queue", title: "Admission", what: "requests in flight and queued; waits (right axis)",
      format: Plot.short,
      series: [
        { key: "queued", label: "queued", style: "dashed" },
        { key: "in_flight", label: "in flight", style: "solid" },
      ],
      right: {
        format: Plot.seconds,
        series: [
          { key: "admission_wait_p50", label: "wait p50", style: "dotted" },
          { key: "admission_wait_p95", label: "wait p95", style: "dashdot" },
        ],
      },
    },
    {
      name: "memory", title: "Memory, MiB", what: "each model, the budget, the machine's free memory",
      format: Plot.short,
      series: [{ key: "memory_mb", label: "model", style: "solid" }],
      machine: [
        { key: "budget_mb", label: "budget", style: "dashed", className: "budget-line" },
        { key: "free_mb", label: "free", style: "solid", className: "free" },
        { key: "floor_mb", label: "pressure floor", style: "solid", className: "floor" },
      ],
    },
    {
      name: "prompt_cache", title: "Prompt tokens", what: "read from cache against computed",
      format: Plot.short,
      series: [
        { key: "prompt_tokens_computed", label: "computed", style: "dashed" },
        { key: "prompt_tokens_cached", label: "from cache", style: "solid" },
      ],
    },
  ];
  const shownModels = [];

  function swatch(style, colour, className) {
    const svg = Plot.node("svg", { width: 26, height: 10, viewBox: "0 0 26 10", class: "swatch" });
    const { dash, width } = STYLES[style];
    svg.appendChild(Plot.node("line", {
      x1: 1, y1: 5, x2: 25, y2: 5, stroke: colour, "stroke-width": width + 0.4,
      "stroke-dasharray": dash, class: className,
    }));
    return svg;
  }

  function legendItem(svg, text) {
    const item = el("span", null, "legend-item");
    item.appendChild(svg);
    item.appendChild(el("span", text));
    return item;
  }

  // Each chart's box, caption and legend of line styles, once.
  function build() {
    const grid = $("chart-grid");
    for (const chart of CHARTS) {
      const figure = el("figure", null, "chart-box");
      const caption = el("figcaption");
      caption.appendChild(el("strong", chart.title));
      caption.appendChild(el("span", " " + chart.what, "mute"));
      figure.appendChild(caption);
      figure.appendChild(Plot.node("svg", {
        class: "chart", "data-chart": chart.name, viewBox: `0 0 ${W} ${H}`,
        role: "img", "aria-label": chart.title + ", " + chart.what,
      }));
      const legend = el("div", null, "legend");
      const styles = chart.series.concat(chart.right ? chart.right.series : []).slice().reverse();
      for (const s of styles) legend.appendChild(legendItem(swatch(s.style, "#555"), s.label));
      for (const s of chart.machine || []) {
        legend.appendChild(legendItem(swatch(s.style, null, s.className), s.label));
      }
      figure.appendChild(legend);
      grid.appendChild(figure);
    }
    const marks = $("chart-marks");
    for (const mark of MARKS) {
      const svg = Plot.node("svg", { width: 10, height: 12, viewBox: "0 0 10 12", class: "swatch" });
      svg.appendChild(Plot.node("line", { x1: 5, y1: 0, x2: 5, y2: 12, class: "mark", "data-mark": mark }));
      marks.appendChild(legendItem(svg, mark));
    }
  }

  function modelsLegend(models) {
    if (models.join("\n") === shownModels.join("\n")) return;
    shownModels.splice(0, shownModels.length, ...models);
    const legend = $("chart-models");
    legend.replaceChildren(...models.map((id) => {
      const dot = el("span", null, "dot");
      dot.style.background = Plot.colourOf(id);
      const item = el("span", null, "legend-item");
      item.appendChild(dot);
      item.appendChild(el("span", id));
      return item;
    }));
  }

  function largest(lines) {
    let most = 0;
    for (const { values } of lines) {
      for (const v of values) if (v !== null && Number.isFinite(v) && v > most) most = v;
    }
    return most;
  }

  function latest(values) {
    for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
    return null;
  }

  // The y axis: grid lines and labels on the left (or the right); its scale.
  function yAxis(nodes, lines, format, side, x0, x1) {
    const values = Plot.ticks(largest(lines), 4);
    const y = Plot.scale(0, values[values.length - 1], H - BOTTOM, TOP);
    for (const value of values) {
      const at = y(value).toFixed(1);
      if (side === "left") nodes.push(Plot.node("line", { x1: x0, x2: x1, y1: at, y2: at, class: "grid" }));
      const x = side === "left" ? x0 - 5 : x1 + 5;
      const anchor = side === "left" ? "end" : "start";
      nodes.push(Plot.node("text", { x, y: at, dy: "0.32em", "text-anchor": anchor, class: "tick" }, format(value)));
    }
    return y;
  }

  function xAxis(nodes, span, x) {
    const { values, step } = Plot.timeTicks(span.t0, span.t1, 5);
    for (const t of values) {
      const at = x(t).toFixed(1);
      nodes.push(Plot.node("line", { x1: at, x2: at, y1: H - BOTTOM, y2: H - BOTTOM + 4, class: "axis" }));
      nodes.push(Plot.node("text", { x: at, y: H - 6, "text-anchor": "middle", class: "tick" }, Plot.clock(t, step < 60)));
    }
    nodes.push(Plot.node("line", { x1: x(span.t0), x2: x(span.t1), y1: H - BOTTOM, y2: H - BOTTOM, class: "axis" }));
  }

  function marks(nodes, events, span, x) {
    for (const event of events) {
      if (!event.mark || event.ts < span.t0 || event.ts > span.t1) continue;
      const at = x(event.ts).toFixed(1);
      const line = Plot.node("line", {
        x1: at, x2: at, y1: TOP, y2: H - BOTTOM, class: "mark",
        "data-mark": event.mark, "data-model": event.model || "",
      });
      const about = [event.mark + ": " + (event.model || "the registry"), String(event.event) +
        " at " + Plot.clock(event.ts, true)];
      if (event.reason) about.push(String(event.reason));
      nodes.push(Plot.titled(line, about.join("\n")));
    }
  }

  function series(nodes, times, line, x, y, format, maxGap) {
    const { d, points, alone } = Plot.line(times, line.values, x, y, maxGap);
    if (!points) return;
    const style = STYLES[line.style];
    const attrs = {
      class: "series" + (line.className ? " " + line.className : ""), d,
      "data-series": line.key, "data-model": line.model, "data-points": points,
      stroke: line.colour, "stroke-width": style.width, "stroke-dasharray": style.dash,
    };
    const label = (line.model ? line.model + " " : "") + line.label + ": latest " + format(latest(line.values));
    nodes.push(Plot.titled(Plot.node("path", attrs), label));
    // A dot for a value alone: filled for a solid line, hollow for the others.
    const solid = line.style === "solid";
    for (const [cx, cy] of alone) {
      nodes.push(Plot.node("circle", {
        cx, cy, r: 2.4, fill: solid ? line.colour : "#fff", stroke: solid ? null : line.colour,
        "stroke-width": solid ? null : 1.3, class: "alone" + (line.className ? " " + line.className : ""),
      }));
    }
  }

  // The samples in buckets of equal time (aligned on the clock, so that they do not
  // shift as old samples leave), when there are more than MAX_VERTICES; else null.
  function buckets(kept) {
    const times = kept.times;
    if (times.length <= MAX_VERTICES) return null;
    const width = Math.ceil(times.length / MAX_VERTICES) * kept.intervalSeconds;
    const groups = [];
    let start = 0;
    for (let i = 1; i <= times.length; i++) {
      if (i === times.length || Math.floor(times[i] / width) !== Math.floor(times[start] / width)) {
        groups.push([start, i]);
        start = i;
      }
    }
    return groups;
  }

  // A bucket's value is the highest of its samples (a peak stays visible).
  function thinned(values, groups) {
    if (!groups) return values;
    return groups.map(([start, end]) => {
      let most = null;
      for (let i = start; i < end; i++) {
        const v = values[i];
        if (v !== null && v !== undefined && (most === null || v > most)) most = v;
      }
      return most;
    });
  }

  function linesOf(defs, kept, groups) {
    const lines = [];
    for (const [model, data] of kept.models) {
      for (const def of defs) {
        const values = data.series[def.key];
        if (values) lines.push({ ...def, values: thinned(values, groups), model, colour: Plot.colourOf(model) });
      }
    }
    return lines;
  }

  function drawChart(chart, kept, span, groups, times) {
    const svg = document.querySelector(`svg.chart[data-chart="${chart.name}"]`);
    const nodes = [];
    if (!span) {
      nodes.push(Plot.node("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "waiting for the router's history…"));
      svg.replaceChildren(...nodes);
      return;
    }
    const x1 = W - (chart.right ? RIGHT_AXIS : RIGHT);
    const x = Plot.scale(span.t0, span.t1, LEFT, x1);
    const left = linesOf(chart.series, kept, groups);
    for (const def of chart.machine || []) {
      let values = thinned(kept.machine[def.key] || [], groups);
      if (def.key === "floor_mb") values = values.map((v) => (v > 0 ? v : null)); // 0: no floor
      left.push({ ...def, values, model: null, colour: null });
    }
    const right = chart.right ? linesOf(chart.right.series, kept, groups) : [];
    const y = yAxis(nodes, left, chart.format, "left", LEFT, x1);
    const yRight = chart.right ? yAxis(nodes, right, chart.right.format, "right", LEFT, x1) : null;
    xAxis(nodes, span, x);
    marks(nodes, kept.events, span, x);
    const maxGap = 3 * (groups ? (kept.times.length / groups.length) : 1) * kept.intervalSeconds;
    for (const line of right) series(nodes, times, line, x, yRight, chart.right.format, maxGap);
    for (const line of left) series(nodes, times, line, x, y, chart.format, maxGap);
    if (!nodes.some((n) => n.tagName === "path")) {
      nodes.push(Plot.node("text", { x: (LEFT + x1) / 2, y: (TOP + H - BOTTOM) / 2, "text-anchor": "middle", class: "empty" }, "nothing yet"));
    }
    svg.replaceChildren(...nodes);
  }

  function draw(kept) {
    const span = HistoryFeed.span();
    modelsLegend(Array.from(kept.models.keys()));
    const groups = buckets(kept);
    const times = groups ? groups.map(([, end]) => kept.times[end - 1]) : kept.times;
    for (const chart of CHARTS) drawChart(chart, kept, span, groups, times);
    let text = "";
    if (span) {
      text = "from " + Plot.clock(span.t0, true) + " to " + Plot.clock(span.end, true) +
        ", a sample every " + Plot.seconds(kept.intervalSeconds);
      if (groups) text += " (each point the highest of " + Math.round(kept.times.length / groups.length) + ")";
    }
    $("chart-span").textContent = text;
  }

  return { build, draw };
})();
