// Drawing by hand in SVG, shared by the charts and the watchdog's timeline: nodes made
// with createElementNS (any text set as text), a linear scale, round tick values, clock
// ticks, a path through values that breaks at each null, and one colour per model.
"use strict";

const Plot = (() => {
  const NS = "http://www.w3.org/2000/svg";
  // Distinct on white and for the common colour blindnesses (Tableau 10, reordered).
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
    "#e15759", "#9c755f", "#ff9da7", "#bab0ac"];
  const colours = new Map();
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
  const MAX_TICKS = 50;

  function node(tag, attrs, text) {
    const made = document.createElementNS(NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null) made.setAttribute(name, String(value));
    }
    if (text !== undefined && text !== null) made.textContent = String(text);
    return made;
  }

  function titled(made, text) {
    made.appendChild(node("title", null, text));
    return made;
  }

  // A model's colour, the same on every chart for as long as the page is open.
  function colourOf(model) {
    if (!colours.has(model)) colours.set(model, PALETTE[colours.size % PALETTE.length]);
    return colours.get(model);
  }

  function scale(from0, from1, to0, to1) {
    const span = from1 - from0 || 1;
    return (value) => to0 + ((value - from0) / span) * (to1 - to0);
  }

  // Round values from 0 up to at least max, about count steps of 1, 2, 2.5 or 5 × 10^n.
  function ticks(max, count) {
    if (!(max > 0)) return [0, 1];
    const raw = max / count;
    const size = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * size).find((s) => s >= raw * (1 - 1e-9));
    const steps = Math.max(1, Math.ceil(max / step - 1e-9));
    const values = [];
    for (let i = 0; i <= steps; i++) values.push(+(i * step).toPrecision(12));
    return values;
  }

  // Round clock times within [t0, t1], about count of them and never more than
  // MAX_TICKS, whatever the span: past the largest round step, a multiple of it.
  function timeTicks(t0, t1, count) {
    if (!Number.isFinite(t0) || !Number.isFinite(t1) || !(t1 >= t0)) return { values: [], step: 1 };
    const raw = (t1 - t0) / count;
    const largest = TIME_STEPS[TIME_STEPS.length - 1];
    const step = TIME_STEPS.find((s) => s >= raw) || Math.ceil(raw / largest) * largest;
    const values = [];
    let t = Math.ceil(t0 / step) * step;
    while (t <= t1 && values.length < MAX_TICKS) {
      values.push(t);
      if (t + step === t) break; // a step below the float's precision there: one tick
      t += step;
    }
    return { values, step };
  }

  function clock(seconds, withSeconds) {
    const d = new Date(seconds * 1000);
    const two = (n) => String(n).padStart(2, "0");
    const shown = two(d.getHours()) + ":" + two(d.getMinutes());
    return withSeconds ? shown + ":" + two(d.getSeconds()) : shown;
  }

  // A count shown short: 0.25, 12, 1.5k, 2.3M.
  function short(value) {
    if (value === null || value === undefined || !Number.isFinite(value)) return "–";
    const size = Math.abs(value);
    if (size >= 1e6) return +(value / 1e6).toFixed(1) + "M";
    if (size >= 1e4) return Math.round(value / 1e3) + "k";
    if (size >= 1e3) return +(value / 1e3).toFixed(1) + "k";
    if (size >= 100) return String(Math.round(value));
    return String(+value.toPrecision(2));
  }

  // Seconds shown short: 40 ms, 1.2 s.
  function seconds(value) {
    if (value === null || value === undefined || !Number.isFinite(value)) return "–";
    if (value === 0) return "0";
    if (Math.abs(value) < 1) return +(value * 1000).toPrecision(3) + " ms";
    return short(value) + " s";
  }

  // A path through (times[i], values[i]); a null value breaks the line, and so does a
  // pause of more than maxGap seconds between samples (the router was down). Each
  // vertex is one "M x y" or "L x y" (data-points counts them); a vertex alone between
  // two breaks draws no line, so it is also returned in `alone` to be drawn as a dot.
  function line(times, values, x, y, maxGap) {
    let d = "";
    let points = 0;
    let run = [];
    const alone = [];
    const close = () => {
      if (run.length === 1) alone.push(run[0]);
      run = [];
    };
    for (let i = 0; i < times.length; i++) {
      const value = values[i];
      if (i > 0 && times[i] - times[i - 1] > maxGap) close();
      if (value === null || value === undefined || !Number.isFinite(value)) {
        close();
        continue;
      }
      const px = x(times[i]).toFixed(1);
      const py = y(value).toFixed(1);
      d += (run.length ? "L" : "M") + px + " " + py;
      run.push([px, py]);
      points += 1;
    }
    close();
    return { d, points, alone };
  }

  return { node, titled, colourOf, scale, ticks, timeTicks, clock, short, seconds, line };
})();
