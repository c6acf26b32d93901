// Small SVG charts for the capwatch page: no libraries, no network. Every drawn series carries
// data-series and data-points attributes, so a test (or a person with devtools) can see what was drawn.
"use strict";

const Charts = (() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#db2777", "#0891b2", "#65a30d"];
  const MARGIN = { top: 26, right: 64, bottom: 26, left: 54 };

  function el(name, attributes = {}, parent = null) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    if (parent) parent.appendChild(node);
    return node;
  }

  function frame(container) {
    container.textContent = "";
    const width = Math.max(container.clientWidth || 0, 320);
    const height = Math.max(container.clientHeight || 0, 120);
    const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, role: "img" }, container);
    return { svg, width, height, inner: {
      x0: MARGIN.left, x1: width - MARGIN.right, y0: height - MARGIN.bottom, y1: MARGIN.top } };
  }

  function empty(container, text) {
    const { svg, width, height } = frame(container);
    svg.setAttribute("data-empty", "1");
    el("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty" }, svg).textContent = text;
  }

  function niceTicks(low, high, count = 5, integer = false) {
    if (!(high > low)) high = low + 1;
    const raw = Math.max((high - low) / count, integer ? 1 : 0);
    const power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
    // From the first step at or below low to the first at or above high: the data always fits.
    const ticks = [];
    const last = Math.ceil(high / step - 1e-9) * step;
    for (let value = Math.floor(low / step + 1e-9) * step; value <= last + step * 1e-9; value += step) {
      ticks.push(+value.toFixed(10));
    }
    return ticks;
  }

  const scale = (d0, d1, r0, r1) => (v) => (d1 === d0 ? (r0 + r1) / 2 : r0 + ((v - d0) / (d1 - d0)) * (r1 - r0));

  function formatNumber(value) {
    if (Math.abs(value) >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (Math.abs(value) >= 1e4) return (value / 1e3).toFixed(0) + "k";
    if (Number.isInteger(value)) return String(value);
    return value.toPrecision(3);
  }
  const formatPercent = (value) => (value * 100).toFixed(value < 0.1 && value > 0 ? 1 : 0) + "%";
  function formatClock(seconds) {
    const date = new Date(seconds * 1000);
    return date.toTimeString().slice(0, 8);
  }

  function yAxis(svg, inner, y, ticks, format, side = "left", title = "") {
    const group = el("g", { class: "axis" }, svg);
    const grid = el("g", { class: "grid" }, svg);
    const x = side === "left" ? inner.x0 : inner.x1;
    for (const tick of ticks) {
      if (side === "left") el("line", { x1: inner.x0, x2: inner.x1, y1: y(tick), y2: y(tick) }, grid);
      el("text", { x: side === "left" ? x - 6 : x + 6, y: y(tick) + 4,
        "text-anchor": side === "left" ? "end" : "start" }, group).textContent = format(tick);
    }
    if (title) {
      const tx = side === "left" ? 12 : inner.x1 + 48;
      el("text", { x: tx, y: (inner.y0 + inner.y1) / 2, transform: `rotate(-90 ${tx} ${(inner.y0 + inner.y1) / 2})`,
        "text-anchor": "middle" }, group).textContent = title;
    }
  }

  function xAxis(svg, inner, x, ticks, format) {
    const group = el("g", { class: "axis" }, svg);
    el("line", { x1: inner.x0, x2: inner.x1, y1: inner.y0, y2: inner.y0 }, group);
    for (const tick of ticks) {
      el("text", { x: x(tick), y: inner.y0 + 16, "text-anchor": "middle" }, group).textContent = format(tick);
    }
  }

  function legend(svg, inner, entries) {
    const group = el("g", { class: "legend" }, svg);
    let offset = inner.x0 + 4;
    for (const entry of entries) {
      el("rect", { x: offset, y: inner.y1 - 18, width: 10, height: 3, fill: entry.color }, group);
      const text = el("text", { x: offset + 14, y: inner.y1 - 13 }, group);
      text.textContent = entry.name;
      offset += 22 + entry.name.length * 6.2;
    }
  }

  // A vertical marker's label, on the side of the line that has room.
  function markerLabel(svg, inner, at, y, marker) {
    const right = at > (inner.x0 + inner.x1) / 2;
    el("text", { x: right ? at - 4 : at + 4, y, fill: marker.color, "font-size": 11,
      "text-anchor": right ? "end" : "start" }, svg).textContent = marker.label;
  }

  function extent(values) {
    let low = Infinity, high = -Infinity;
    for (const value of values) { if (value < low) low = value; if (value > high) high = value; }
    return [low, high];
  }

  // A reference line far above the data would squash it flat (ranks at 6 % of the cap on a 0 - 125 % axis):
  // the axis then spans the data, and each reference above it is named at the top edge instead of drawn.
  const ZOOM_BELOW = 0.5;  // zoom when the data's top is below this share of the lowest reference above it

  // series: [{name, points: [[x, y], ...]}]; lines: [{y, label, color}] horizontal references.
  function lines(container, { series, lines: references = [], xFormat = formatNumber, yFormat = formatNumber,
    yMin = 0, xLabel = "", yTitle = "", emptyText = "no data yet" }) {
    const drawn = series.filter((s) => s.points.length > 0);
    if (!drawn.length) return empty(container, emptyText);
    const { svg, inner } = frame(container);
    const xs = drawn.flatMap((s) => s.points.map((p) => p[0]));
    const dataYs = drawn.flatMap((s) => s.points.map((p) => p[1]));
    const [xLow, xHigh] = extent(xs);
    const [, dataHigh] = extent(dataYs);
    const lowestReference = Math.min(...references.map((r) => r.y).filter((v) => v > dataHigh));
    const zoomed = Number.isFinite(lowestReference) && dataHigh > 0 && dataHigh < lowestReference * ZOOM_BELOW;
    const shown = zoomed ? references.filter((r) => r.y <= dataHigh * 1.15) : references;
    const above = zoomed ? references.filter((r) => r.y > dataHigh * 1.15) : [];
    const ys = dataYs.concat(shown.map((r) => r.y));
    const [, yHigh] = extent(ys);
    const yTicks = niceTicks(Math.min(yMin, ...ys), yHigh * (zoomed ? 1.15 : 1.05));
    const x = scale(xLow, xHigh, inner.x0, inner.x1);
    const y = scale(yTicks[0], yTicks[yTicks.length - 1], inner.y0, inner.y1);
    svg.setAttribute("data-y-top", yTicks[yTicks.length - 1]);
    svg.setAttribute("data-zoomed", zoomed ? "1" : "0");
    yAxis(svg, inner, y, yTicks, yFormat, "left", yTitle);
    xAxis(svg, inner, x, niceTicks(xLow, xHigh, 6).filter((t) => t >= xLow && t <= xHigh), xFormat);
    // Labels inside the plot, right-aligned above their line: never past the chart's right edge.
    for (const reference of shown) {
      el("line", { x1: inner.x0, x2: inner.x1, y1: y(reference.y), y2: y(reference.y), stroke: reference.color,
        "stroke-dasharray": "5 4", "stroke-width": 1.5, "data-reference": reference.label }, svg);
      el("text", { x: inner.x1 - 4, y: y(reference.y) - 4, fill: reference.color, "font-size": 11, "text-anchor": "end",
        "data-reference-label": reference.label }, svg).textContent = reference.label;
    }
    above.forEach((reference, index) => {
      el("text", { x: inner.x1 - 4, y: inner.y1 - 6 - index * 13, fill: reference.color, "font-size": 11,
        "text-anchor": "end", "data-reference-label": reference.label, "data-above": "1" }, svg)
        .textContent = `\u2191 ${reference.label} at ${yFormat(reference.y)}, above this chart`;
    });
    drawn.forEach((s, index) => {
      const color = s.color || PALETTE[index % PALETTE.length];
      s.color = color;
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
      // Earlier series are drawn wider, so lines that coincide (ranks share R) stay visible as bands.
      const width = 1.6 + Math.min(6, (drawn.length - 1 - index) * 1.5);
      el("path", { d, fill: "none", stroke: color, "stroke-width": width, "stroke-opacity": 0.9,
        "stroke-linejoin": "round", "data-series": s.name,
        "data-points": s.points.length }, svg);
      if (s.points.length === 1) {
        el("circle", { cx: x(s.points[0][0]), cy: y(s.points[0][1]), r: 3, fill: color }, svg);
      }
    });
    legend(svg, inner, drawn.map((s) => ({ name: s.name, color: s.color })));
    if (xLabel) el("text", { x: inner.x1, y: inner.y0 - 4, "text-anchor": "end", class: "empty" }, svg).textContent = xLabel;
    return svg;
  }

  // bars: [{x0, x1, y}] over a numeric x axis (histograms, events over time); markers: [{x, label, color}].
  function bars(container, { bars: items, markers = [], xFormat = formatNumber, yFormat = formatNumber,
    color = PALETTE[0], name = "bars", emptyText = "no data yet", yTitle = "", integer = true }) {
    if (!items.length) return empty(container, emptyText);
    const { svg, inner } = frame(container);
    const [xLow] = extent(items.map((b) => b.x0).concat(markers.map((m) => m.x)));
    const [, xHigh] = extent(items.map((b) => b.x1).concat(markers.map((m) => m.x)));
    const [, yHigh] = extent(items.map((b) => b.y));
    const yTicks = niceTicks(0, Math.max(yHigh, 1) * 1.08, 5, integer);
    const x = scale(xLow, xHigh, inner.x0, inner.x1);
    const y = scale(0, yTicks[yTicks.length - 1], inner.y0, inner.y1);
    yAxis(svg, inner, y, yTicks, yFormat, "left", yTitle);
    xAxis(svg, inner, x, niceTicks(xLow, xHigh, 6).filter((t) => t >= xLow && t <= xHigh), xFormat);
    const group = el("g", { "data-series": name, "data-points": items.filter((b) => b.y > 0).length }, svg);
    for (const item of items) {
      if (item.y <= 0) continue;
      const left = x(item.x0), width = Math.max(1.5, x(item.x1) - left - 1);
      el("rect", { x: left, y: y(item.y), width, height: inner.y0 - y(item.y), fill: item.color || color,
        "data-x": item.x0, "data-y": item.y }, group);
    }
    markers.forEach((marker, index) => {
      el("line", { x1: x(marker.x), x2: x(marker.x), y1: inner.y0, y2: inner.y1, stroke: marker.color,
        "stroke-width": 2, "stroke-dasharray": "5 3", "data-reference": marker.label }, svg);
      markerLabel(svg, inner, x(marker.x), inner.y1 + 10 + index * 13, marker);
    });
    return svg;
  }

  // Two series on one x axis with separate y axes (the what-if curve: overflow rate and GiB).
  function dual(container, { left, right, markers = [], xFormat = formatNumber, emptyText = "no data yet" }) {
    if (!left.points.length && !right.points.length) return empty(container, emptyText);
    const { svg, inner } = frame(container);
    const xs = left.points.concat(right.points).map((p) => p[0]);
    const [xLow, xHigh] = extent(xs);
    const x = scale(xLow, xHigh, inner.x0, inner.x1);
    const band = left.band || [];  // [[x, low, high]]: the left series' uncertainty, drawn as an area
    const leftTicks = niceTicks(0, Math.max(...left.points.map((p) => p[1]), ...band.map((b) => b[2]), 0.01) * 1.05);
    const rightTicks = niceTicks(0, Math.max(...right.points.map((p) => p[1]), 0.01) * 1.05);
    const yLeft = scale(0, leftTicks[leftTicks.length - 1], inner.y0, inner.y1);
    const yRight = scale(0, rightTicks[rightTicks.length - 1], inner.y0, inner.y1);
    yAxis(svg, inner, yLeft, leftTicks, left.format || formatNumber, "left", left.name);
    yAxis(svg, inner, yRight, rightTicks, right.format || formatNumber, "right", right.name);
    xAxis(svg, inner, x, niceTicks(xLow, xHigh, 6).filter((t) => t >= xLow && t <= xHigh), xFormat);
    if (band.length) {
      const upper = band.map((b) => `${x(b[0]).toFixed(1)},${yLeft(b[2]).toFixed(1)}`);
      const lower = band.map((b) => `${x(b[0]).toFixed(1)},${yLeft(b[1]).toFixed(1)}`).reverse();
      el("path", { d: `M${upper.join("L")}L${lower.join("L")}Z`, fill: PALETTE[1], "fill-opacity": 0.15, stroke: "none",
        "data-series": `${left.name} range`, "data-points": band.length }, svg);
    }
    for (const [s, y, color] of [[left, yLeft, PALETTE[1]], [right, yRight, PALETTE[0]]]) {
      const d = s.points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
      el("path", { d, fill: "none", stroke: color, "stroke-width": 2, "data-series": s.name,
        "data-points": s.points.length }, svg);
      for (const p of s.points) el("circle", { cx: x(p[0]), cy: y(p[1]), r: 2.5, fill: color }, svg);
    }
    markers.forEach((marker, index) => {
      el("line", { x1: x(marker.x), x2: x(marker.x), y1: inner.y0, y2: inner.y1, stroke: marker.color,
        "stroke-width": 1.5, "stroke-dasharray": "5 3", "data-reference": marker.label }, svg);
      markerLabel(svg, inner, x(marker.x), inner.y1 + 10 + index * 13, marker);
    });
    legend(svg, { ...inner, x0: inner.x0 + 40 }, [{ name: left.name, color: PALETTE[1] }, { name: right.name, color: PALETTE[0] }]);
    return svg;
  }

  // A horizontal ruler: bands and ticks at token positions (current vs recommended cap).
  function ruler(container, { marks, band = null, maxValue }) {
    if (!marks.length) return empty(container, "no advice yet");
    const { svg, inner } = frame(container);
    const x = scale(0, maxValue, inner.x0, inner.x1);
    const mid = (inner.y0 + inner.y1) / 2 + 6;
    xAxis(svg, { ...inner, y0: mid + 14 }, x, niceTicks(0, maxValue, 6).filter((t) => t <= maxValue), formatNumber);
    el("rect", { x: inner.x0, y: mid - 6, width: inner.x1 - inner.x0, height: 12, fill: "#eef0f3", rx: 6 }, svg);
    if (band) {
      el("rect", { x: x(band.low), y: mid - 6, width: Math.max(2, x(band.high) - x(band.low)), height: 12,
        fill: "#bfdbfe", rx: 6, "data-series": "bounds", "data-points": 2 }, svg);
    }
    const group = el("g", { "data-series": "caps", "data-points": marks.length }, svg);
    // Labels take turns above and below the bar, stacking further out where they would overlap.
    const levels = [-20, 44, -34, 58];
    const lastRight = levels.map(() => -Infinity);
    [...marks].sort((a, b) => a.value - b.value).forEach((mark) => {
      const text = `${mark.label} ${formatNumber(mark.value)}`;
      const half = text.length * 3.6;
      const at = x(mark.value);
      let level = levels.findIndex((_, i) => lastRight[i] < at - half - 6);
      if (level < 0) level = 0;
      lastRight[level] = at + half;
      el("line", { x1: at, x2: at, y1: mid - 14, y2: mid + 14, stroke: mark.color,
        "stroke-width": 3, "data-mark": mark.label, "data-value": mark.value }, group);
      el("text", { x: at, y: mid + levels[level], fill: mark.color, "text-anchor": "middle",
        "font-size": 12, "font-weight": 600 }, group).textContent = text;
    });
    return svg;
  }

  return { lines, bars, dual, ruler, empty, formatNumber, formatPercent, formatClock, PALETTE };
})();
