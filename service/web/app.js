// The capwatch page: reads the service's JSON API and draws it. Relative URLs, so it works
// wherever the service is mounted. Sets body[data-ready] and data-* counts once drawn.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const GIB = 1024 ** 3;
  const REFRESH_MS = 3000;
  const state = { cluster: null, timer: null };

  // A service started with CAPWATCH_READS_NEED_TOKEN answers reads 401 without its token: the page asks for it
  // once (the token form), keeps it for this tab only (sessionStorage) and sends it as a bearer token.
  const TOKEN_KEY = "capwatch-token";
  class NeedsToken extends Error {}

  async function getJSON(path) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const response = await fetch(path, { headers });
    if (response.status === 401) throw new NeedsToken(path);
    if (!response.ok) {
      let detail = "";
      try { detail = JSON.stringify((await response.json()).detail); } catch (error) { /* not JSON */ }
      throw new Error(`${path}: HTTP ${response.status} ${detail}`);
    }
    return response.json();
  }
  const optional = (promise) => promise.catch((error) => ({ __error: String(error.message || error) }));

  const first = (object, names, fallback = undefined) => {
    for (const name of names) if (object && object[name] !== undefined && object[name] !== null) return object[name];
    return fallback;
  };
  const listOf = (raw, names) => (Array.isArray(raw) ? raw : first(raw, names, []));
  const gib = (bytes) => (bytes === undefined || bytes === null ? "–" : (bytes / GIB).toFixed(bytes < GIB ? 3 : 2) + " GiB");
  const signedGib = (bytes) => (bytes === undefined || bytes === null ? "–" : (bytes > 0 ? "+" : "") + gib(bytes));
  const percent = (value) => (value === undefined || value === null ? "–" : Charts.formatPercent(value));
  const tokens = (value) => (value === undefined || value === null ? "–" : Number(value).toLocaleString("en-US"));
  const numberOrNull = (value) => (value === undefined || value === null || !Number.isFinite(Number(value)) ? null : Number(value));

  function showMessage(text) {
    const message = $("message");
    message.hidden = !text;
    message.textContent = text || "";
  }

  // --- the history, whatever the grouping the service returns -----------------------------------
  function normalizeHistory(raw, cap) {
    const rows = [];
    const push = (row, rank) => {
      const t = Number(first(row, ["interval_end_unix_s", "end_unix_s", "t", "time", "timestamp"], NaN));
      const peak = Number(first(row, ["peak_runtime_tokens", "peak_r", "peak"], NaN));
      if (!Number.isFinite(t)) return;
      if (first(row, ["forward_steps"]) === 0) return;  // an idle interval has no R to plot
      const rowCap = Number(first(row, ["cap"], cap));
      let utilization = Number(first(row, ["utilization", "peak_utilization", "peak_utilization_ratio"], NaN));
      if (!Number.isFinite(utilization) && Number.isFinite(peak) && rowCap > 0) utilization = peak / rowCap;
      rows.push({
        rank: first(row, ["ep_rank", "rank"], rank),
        role: first(row, ["role", "dispatcher"], "target"),
        t, peak, utilization, cap: rowCap,
        // This rank's own largest local batch (not the group's R); null from ranks that do not report it.
        local: numberOrNull(first(row, ["max_local_tokens"])),
        overflows: Number(first(row, ["overflow_events", "overflows", "overflow_events_total"], 0)) || 0,
      });
    };
    const series = Array.isArray(raw) ? null : first(raw, ["ranks", "series"], null);
    if (Array.isArray(series) && series.length && first(series[0], ["points", "intervals", "samples"], null)) {
      for (const entry of series) {
        for (const row of first(entry, ["points", "intervals", "samples"], [])) push(row, first(entry, ["ep_rank", "rank"]));
      }
    } else {
      for (const row of listOf(raw, ["points", "intervals", "samples", "rows", "history"])) push(row, undefined);
    }
    rows.sort((a, b) => a.t - b.t);
    return rows;
  }

  function groupByInterval(rows) {
    // Group peak per reporting interval: rows of different ranks within the same second belong together.
    const buckets = new Map();
    for (const row of rows) {
      const key = Math.round(row.t * 2) / 2;
      const bucket = buckets.get(key) || { t: key, peak: 0, overflows: 0 };
      if (Number.isFinite(row.peak)) bucket.peak = Math.max(bucket.peak, row.peak);
      bucket.overflows += row.overflows;
      buckets.set(key, bucket);
    }
    return [...buckets.values()].sort((a, b) => a.t - b.t);
  }

  // --- renderers ---------------------------------------------------------------------------------
  // A critical finding (ranks on different caps, a rank missing) contradicts any cap advice: the card says so
  // first and offers no line to copy until it is fixed. The advice's own caveats (a cap it did not know, low
  // confidence) come first on the card too.
  const estimated = (exact) => (exact === false ? "≈ " : "");
  function renderAdvice(advice, critical) {
    const action = first(advice, ["action"], "insufficient_data");
    const badge = $("action");
    const capUnknown = advice.cap_known === false;
    const marks = [capUnknown ? "cap unknown" : "", advice.low_confidence ? "low confidence" : ""].filter(Boolean);
    badge.textContent = action.replace("_", " ") + (marks.length ? ` · ${marks.join(", ")}` : "");
    badge.className = `badge ${action}`;
    const blocked = $("advice-blocked");
    blocked.hidden = !critical.length;
    blocked.textContent = critical.length
      ? `Do not apply this advice: ${critical.length === 1 ? "a critical finding" : `${critical.length} critical findings`} ` +
        `(${critical.map((f) => first(f, ["kind"], "finding")).join(", ")}) above. ` +
        `${first(critical[0], ["message"], "")} The line to export is withheld until it is fixed.`
      : "";
    const caveat = $("advice-caveat");
    const caveats = [];
    if (capUnknown) caveats.push(`The cap in use is unknown: ${tokens(first(advice, ["current_cap"]))} is assumed, not seen.`);
    if (advice.low_confidence) caveats.push("Low confidence: too little history for a change; the range below is wide.");
    caveat.hidden = !caveats.length;
    caveat.textContent = caveats.join(" ");
    $("current-cap").textContent = (capUnknown ? "? " : "") + tokens(first(advice, ["current_cap"]));
    $("recommended-cap").textContent = tokens(first(advice, ["recommended_cap"]));
    const facts = [
      // whose cap: the backend and the variable that sets it (FlashInfer's, DeepEP's)
      ["cap variable", first(advice, ["cap_variable"], "–")],
      // who set the cap the ranks run: "applied by capwatch at start (revision N)", the operator, SGLang's default
      ["cap set by", first(advice, ["cap_origin"], "–")],
      ["bounds", advice.lower_bound !== undefined && advice.lower_bound !== null
        ? `${tokens(advice.lower_bound)} – ${tokens(advice.upper_bound)}` : "–"],
      ["confidence", percent(first(advice, ["confidence"]))],
      ["group peak R (all history)", tokens(first(advice, ["max_peak_runtime_tokens", "observed_peak_runtime_tokens"]))],
      ["overflow rate now", percent(first(advice, ["predicted_overflow_rate_current"]))],
      ["overflow rate after", percent(first(advice, ["predicted_overflow_rate_recommended"]))],
      // "≈" before a figure that is an estimate: a reported-bytes buffer (DeepEP v2, NIXL, Mooncake) is exact only
      // at the cap its ranks reported it for, priced in proportion elsewhere; "workspace priced" says from what
      ["workspace / rank now", estimated(advice.workspace_bytes_exact_current) + gib(first(advice, ["workspace_bytes_per_rank_current"]))],
      ["workspace / rank after", estimated(advice.workspace_bytes_exact_recommended) + gib(first(advice, ["workspace_bytes_per_rank_recommended"]))],
      ["change across group", estimated(advice.workspace_bytes_exact_current === false ? false : advice.workspace_bytes_exact_recommended)
        + signedGib(first(advice, ["workspace_bytes_group_delta"]))],
      ["workspace priced", first(advice, ["workspace_bytes_basis"], "–")],
      ["windows (overflowed)", advice.sample_count === undefined ? "–"
        : `${tokens(advice.sample_count)} (${tokens(advice.overflow_windows || 0)})`],
    ];
    const list = $("advice-facts");
    list.textContent = "";
    for (const [name, value] of facts) {
      const wrapper = document.createElement("div");
      const dt = document.createElement("dt"); dt.textContent = name;
      const dd = document.createElement("dd"); dd.textContent = value;
      wrapper.append(dt, dd); list.appendChild(wrapper);
    }
    const env = first(advice, ["env", "export"], "");
    $("env-line").textContent = env ? (env.startsWith("export ") ? env : `export ${env}`) : "no recommendation yet";
    $("env-line").dataset.env = env || "";
    $("export").hidden = critical.length > 0 || capUnknown;  // no Copy for a value the findings contradict
    const reasons = $("reasons");
    reasons.textContent = "";
    for (const reason of first(advice, ["reasons"], [])) {
      const item = document.createElement("li"); item.textContent = reason; reasons.appendChild(item);
    }
  }

  const hasLocal = (rows) => rows.some((row) => row.local !== null);
  const rankName = (row) => `rank ${row.rank}${row.role && row.role !== "target" ? " " + row.role : ""}`;

  // Each rank's own line is its largest local batch ÷ cap; R (shared by every rank in a step) is one
  // group line. Ranks that do not report their local batch fall back to their (shared) R.
  function renderUtilization(rows, groupPeaks, advice) {
    const perRank = hasLocal(rows);
    const byRank = new Map();
    for (const row of rows) {
      const value = perRank ? (row.local !== null && row.cap > 0 ? row.local / row.cap : NaN) : row.utilization;
      if (!Number.isFinite(value)) continue;
      const name = rankName(row);
      if (!byRank.has(name)) byRank.set(name, []);
      byRank.get(name).push([row.t, value]);
    }
    const series = [...byRank.entries()].sort((a, b) => a[0].localeCompare(b[0], "en", { numeric: true }))
      .map(([name, points]) => ({ name, points }));
    const cap = first(advice, ["current_cap"]);
    if (perRank && cap) {
      series.unshift({ name: "group R", color: "#6b7280",
        points: groupPeaks.filter((g) => Number.isFinite(g.peak)).map((g) => [g.t, g.peak / cap]) });
    }
    $("chart-utilization").dataset.lines = perRank ? "local" : "shared-r";
    const current = first(advice, ["current_cap"]), recommended = first(advice, ["recommended_cap"]);
    const holding = current && recommended && recommended === current;  // one line, one label: no overprint
    const references = [{ y: 1, label: holding ? "cap = recommended" : "cap", color: "#b91c1c" }];
    if (current && recommended && !holding) references.push({ y: recommended / current, label: "recommended", color: "#0f766e" });
    Charts.lines($("chart-utilization"), { series, lines: references, xFormat: Charts.formatClock,
      yFormat: Charts.formatPercent, emptyText: "no interval reports yet" });
    return series.filter((s) => s.name !== "group R").reduce((total, s) => total + s.points.length, 0);
  }

  // The hot rank: the one whose own local batch reached the highest, i.e. the one that sets the group's R.
  function localMaxByRank(rows) {
    const maxima = new Map();
    for (const row of rows) {
      if (row.local === null) continue;
      const name = rankName(row);
      const known = maxima.get(name);
      if (!known || row.local > known.local) maxima.set(name, { rank: row.rank, name, local: row.local });
    }
    return maxima;
  }

  function renderHotRank(rows, peak) {
    const line = $("hot-rank");
    const maxima = [...localMaxByRank(rows).values()];
    if (!maxima.length) {
      line.textContent = rows.length
        ? "Which rank drives the peak is unknown: these ranks do not report their own local batch (max_local_tokens)."
        : "";
      line.dataset.rank = "";
      return "";
    }
    const hot = maxima.reduce((best, entry) => (entry.local > best.local
      || (entry.local === best.local && Number(entry.rank) < Number(best.rank)) ? entry : best));
    line.textContent = `${hot.name} drives the group's peak: its largest local batch in the chart's span is ` +
      `${tokens(hot.local)} tokens` + (Number.isFinite(peak) ? ` (group peak R, all history: ${tokens(peak)})` : "") + ".";
    line.dataset.rank = String(hot.rank);
    return String(hot.rank);
  }

  function renderCaps(advice, peak) {
    const marks = [];
    const current = first(advice, ["current_cap"]), recommended = first(advice, ["recommended_cap"]);
    if (current) marks.push({ label: "current", value: current, color: "#b91c1c" });
    if (recommended) marks.push({ label: "recommended", value: recommended, color: "#0f766e" });
    if (peak) marks.push({ label: "peak R (all history)", value: peak, color: "#7c3aed" });
    const band = advice.lower_bound ? { low: advice.lower_bound, high: advice.upper_bound || advice.lower_bound } : null;
    const maxValue = Math.max(...marks.map((m) => m.value), band ? band.high : 0) * 1.1 || 1;
    Charts.ruler($("chart-caps"), { marks, band, maxValue });
    return marks.length;
  }

  function renderDistribution(groupPeaks, advice) {
    const peaks = groupPeaks.map((g) => g.peak).filter(Number.isFinite);
    if (!peaks.length) { Charts.empty($("chart-distribution"), "no interval peaks yet"); return 0; }
    const current = first(advice, ["current_cap"]), recommended = first(advice, ["recommended_cap"]);
    const high = Math.max(...peaks) + 1;
    const binCount = Math.min(30, Math.max(8, Math.ceil(Math.sqrt(peaks.length)) * 2));
    const width = Math.max(1, Math.ceil(high / binCount));
    const bins = Array.from({ length: Math.ceil(high / width) }, (_, i) => ({ x0: i * width, x1: (i + 1) * width, y: 0 }));
    for (const peak of peaks) bins[Math.min(bins.length - 1, Math.floor(peak / width))].y += 1;
    const markers = [];
    if (recommended) markers.push({ x: recommended, label: `recommended ${recommended}`, color: "#0f766e" });
    if (current && current <= high * 4) markers.push({ x: current, label: `current ${current}`, color: "#b91c1c" });
    Charts.bars($("chart-distribution"), { bars: bins, markers, name: "peak R per interval", yTitle: "intervals" });
    return peaks.length;
  }

  function renderOverflows(groupPeaks) {
    const events = groupPeaks.filter((g) => g.overflows > 0);
    if (!groupPeaks.length) { Charts.empty($("chart-overflows"), "no interval reports yet"); return 0; }
    const spacing = groupPeaks.length > 1 ? (groupPeaks[groupPeaks.length - 1].t - groupPeaks[0].t) / groupPeaks.length : 1;
    const items = groupPeaks.map((g) => ({ x0: g.t, x1: g.t + spacing, y: g.overflows, color: "#b91c1c" }));
    if (!events.length) {
      Charts.empty($("chart-overflows"), `no overflow in ${groupPeaks.length} intervals`);
      $("chart-overflows").dataset.intervals = groupPeaks.length;
      return 0;
    }
    Charts.bars($("chart-overflows"), { bars: items, name: "overflow events", xFormat: Charts.formatClock, yTitle: "events" });
    return events.reduce((total, g) => total + g.overflows, 0);
  }

  // The caps the what-if chart prices: within the one range the service states (1..max_cap_tokens, the
  // backend's largest; sizing/backends.py), so the page never asks for a cap the service refuses.
  function whatIfCaps(advice, peak) {
    const alignment = numberOrNull(advice.cap_alignment) || 128;
    const largest = numberOrNull(advice.max_cap_tokens) || 1048576;
    const anchor = Math.max(first(advice, ["current_cap"], 0), first(advice, ["recommended_cap"], 0), peak || 0, alignment);
    const top = Math.min(Math.ceil((anchor * 1.25) / alignment) * alignment, largest);
    const step = Math.max(alignment, Math.ceil(top / 16 / alignment) * alignment);
    const caps = new Set();
    for (let cap = step; cap <= top; cap += step) caps.add(cap);
    for (const extra of [advice.current_cap, advice.recommended_cap]) if (extra) caps.add(extra);
    if (peak) caps.add(Math.max(1, Math.floor(Math.min(peak, largest) * 0.8)));
    return [...caps].filter((cap) => Number.isInteger(cap) && cap >= 1 && cap <= largest).sort((a, b) => a - b);
  }

  function renderWhatIf(rows, advice) {
    const list = listOf(rows, ["caps", "points", "results", "whatif"]);
    // Overflowing windows per day (with its low-high range) when the service predicts it; else the rate.
    const perDay = list.some((row) => numberOrNull(row.predicted_overflow_windows_per_day) !== null);
    const overflow = perDay
      ? { name: "overflow windows / day", format: Charts.formatNumber, points: [], band: [] }
      : { name: "overflow rate", format: Charts.formatPercent, points: [] };
    // A reported-bytes buffer is exact only at its reported cap: its curve elsewhere is an estimate, and says so.
    const estimate = list.some((row) => row.workspace_bytes_exact === false) ? " (≈ estimated)" : "";
    const memory = { name: `GiB / rank${estimate}`, format: (v) => v.toFixed(v < 1 ? 2 : 1), points: [] };
    for (const row of list) {
      const cap = Number(first(row, ["cap"]));
      const bytes = Number(first(row, ["workspace_bytes_per_rank", "workspace_bytes"]));
      if (perDay) {
        const windows = numberOrNull(row.predicted_overflow_windows_per_day);
        if (Number.isFinite(cap) && windows !== null) {
          overflow.points.push([cap, windows]);
          const low = numberOrNull(row.predicted_overflow_windows_per_day_low);
          const high = numberOrNull(row.predicted_overflow_windows_per_day_high);
          if (low !== null && high !== null) overflow.band.push([cap, low, high]);
        }
      } else {
        const rate = Number(first(row, ["predicted_overflow_rate", "overflow_rate"]));
        if (Number.isFinite(cap) && Number.isFinite(rate)) overflow.points.push([cap, rate]);
      }
      if (Number.isFinite(cap) && Number.isFinite(bytes)) memory.points.push([cap, bytes / GIB]);
    }
    const markers = [];
    if (advice.current_cap) markers.push({ x: advice.current_cap, label: "current", color: "#b91c1c" });
    if (advice.recommended_cap) markers.push({ x: advice.recommended_cap, label: "recommended", color: "#0f766e" });
    Charts.dual($("chart-whatif"), { left: overflow, right: memory, markers, emptyText: "what-if unavailable" });
    return overflow.points.length;
  }

  function renderFindings(findings) {
    const list = $("findings");
    list.textContent = "";
    if (!findings.length) {
      const item = document.createElement("li"); item.className = "ok";
      item.textContent = "No findings: every rank agrees on the cap and ep_size, and all are reporting.";
      list.appendChild(item);
      return 0;
    }
    for (const finding of findings) {
      const item = document.createElement("li");
      item.className = first(finding, ["severity"], "warning");
      const kind = document.createElement("span"); kind.className = "kind";
      kind.textContent = first(finding, ["kind", "finding"], "finding");
      const ranks = first(finding, ["ranks"], []);
      item.append(kind, document.createTextNode(first(finding, ["message"], "") +
        (ranks.length ? ` (ranks ${ranks.join(", ")})` : "")));
      list.appendChild(item);
    }
    return findings.length;
  }

  function renderCritical(critical) {
    $("critical").hidden = !critical.length;
    const list = $("critical-findings");
    list.textContent = "";
    for (const finding of critical) {
      const item = document.createElement("li"); item.className = "critical";
      const kind = document.createElement("span"); kind.className = "kind"; kind.textContent = first(finding, ["kind"], "finding");
      const ranks = first(finding, ["ranks"], []);
      item.append(kind, document.createTextNode(first(finding, ["message"], "") + (ranks.length ? ` (ranks ${ranks.join(", ")})` : "")));
      list.appendChild(item);
    }
  }

  function renderRanks(ranks, rows) {
    const localMaxima = localMaxByRank(rows);
    const body = $("ranks").querySelector("tbody");
    body.textContent = "";
    for (const rank of ranks) {
      const row = document.createElement("tr");
      const overflow = first(rank, ["overflow_events_total", "overflow_events", "overflows"], 0);
      const overflowTotal = typeof overflow === "object" ? Object.values(overflow).reduce((a, b) => a + (b.count ?? b), 0) : overflow;
      const stateText = first(rank, ["state"], "");
      const cells = [
        first(rank, ["ep_rank", "rank"]), first(rank, ["role", "dispatcher"], "target"), stateText,
        // The last interval can be idle (0): the maximum since the rank started says how full the cap ran.
        tokens(first(rank, ["cap"])), tokens(first(rank, ["last_peak_runtime_tokens", "peak_runtime_tokens", "last_peak_r"])),
        tokens(first(rank, ["max_runtime_tokens"])),
        // This rank's own largest local batch: from the API when it has it, else from the history drawn.
        tokens(first(rank, ["max_local_tokens"], (localMaxima.get(rankName({
          rank: first(rank, ["ep_rank", "rank"]), role: first(rank, ["role", "dispatcher"], "target") })) || {}).local)),
        percent(first(rank, ["max_utilization"])), tokens(overflowTotal),
        gib(first(rank, ["workspace_bytes_per_rank", "workspace_bytes"])),
      ];
      cells.forEach((value, index) => {
        const cell = document.createElement("td");
        cell.textContent = value === undefined ? "–" : value;
        if (index === 2) cell.className = `state-${stateText}`;
        row.appendChild(cell);
      });
      body.appendChild(row);
    }
    return ranks.length;
  }

  // --- the chain ---------------------------------------------------------------------------------
  // What a cluster needs, most urgent first: the order of the list at / and of the picker.
  const NEEDS = [
    ["error", (s) => Boolean(s.error), "cannot be advised"],
    ["critical", (s) => Boolean(s.critical), "critical finding"],
    ["ranks", (s) => (s.ranks_missing || 0) + (s.ranks_stale || 0) > 0, "missing or stale ranks"],
    ["raise", (s) => s.action === "raise", "raise the cap"],
    ["lower", (s) => s.action === "lower", "lower the cap"],
    ["data", (s) => !s.action || s.action === "insufficient_data", "too little data yet"],
    ["hold", () => true, "nothing to do"],
  ];
  const needOf = (summary) => NEEDS.findIndex(([, test]) => test(summary));
  function byNeed(summaries) {
    return [...summaries].sort((a, b) => needOf(a) - needOf(b)
      || (b.overflow_events_total || 0) - (a.overflow_events_total || 0)
      || (b.group_utilization || 0) - (a.group_utilization || 0)
      || String(a.cluster).localeCompare(String(b.cluster)));
  }

  function renderClusters(summaries) {
    const body = $("clusters").querySelector("tbody");
    body.textContent = "";
    for (const summary of summaries) {
      const need = NEEDS[needOf(summary)];
      const row = document.createElement("tr");
      if (summary.cluster === state.cluster) row.className = "current";
      const link = document.createElement("a");
      link.href = `?cluster=${encodeURIComponent(summary.cluster)}`; link.textContent = summary.cluster;
      const cells = [link, need[2] + (summary.error ? `: ${summary.error}` : ""), (summary.action || "–").replace("_", " "),
        tokens(summary.cap), tokens(summary.recommended_cap),
        `${summary.ranks_reporting ?? "–"} reporting` + (summary.ranks_missing ? `, ${summary.ranks_missing} missing` : "")
          + (summary.ranks_stale ? `, ${summary.ranks_stale} stale` : ""),
        tokens(summary.group_peak_runtime_tokens), tokens(summary.overflow_events_total)];
      cells.forEach((value, index) => {
        const cell = document.createElement("td");
        if (value instanceof Node) cell.appendChild(value); else cell.textContent = value === undefined ? "–" : value;
        if (index === 1) cell.className = `need-${need[0]}`;
        row.appendChild(cell);
      });
      row.dataset.cluster = summary.cluster;
      row.dataset.need = need[0];
      body.appendChild(row);
    }
    $("clusters-card").hidden = summaries.length < 2;
  }

  async function loadClusters() {
    const raw = await getJSON("v1/clusters");
    const summaries = byNeed(listOf(raw, ["clusters", "items"])
      .map((c) => (typeof c === "string" ? { cluster: c } : { ...c, cluster: first(c, ["cluster", "name"]) })));
    const clusters = summaries.map((s) => s.cluster);
    const select = $("cluster");
    const wanted = new URLSearchParams(location.search).get("cluster") || state.cluster;
    select.textContent = "";
    for (const name of clusters) {
      const option = document.createElement("option"); option.value = option.textContent = name;
      select.appendChild(option);
    }
    // Without a cluster named, the one that needs action most.
    state.cluster = clusters.includes(wanted) ? wanted : clusters[0] || null;
    if (state.cluster) select.value = state.cluster;
    renderClusters(summaries);
    return clusters;
  }

  async function refresh() {
    try {
      const clusters = await loadClusters();
      if (!state.cluster) {
        showMessage("No cluster has reported yet. Start ranks with reporters pointed at this service (capwatch demo does).");
        document.body.dataset.ready = "1";
        document.body.dataset.clusters = "0";
        return;
      }
      const base = `v1/clusters/${encodeURIComponent(state.cluster)}`;
      const [detail, advice, history] = await Promise.all([
        optional(getJSON(base)), optional(getJSON(`${base}/advice`)), optional(getJSON(`${base}/history`)),
      ]);
      const errors = [detail, advice, history].filter((r) => r && r.__error).map((r) => r.__error);
      const adviceData = advice.__error ? {} : advice;
      const ranks = detail.__error ? [] : listOf(detail, ["ranks"]);
      const findings = detail.__error ? [] : listOf(detail, ["findings"]);
      const cap = first(adviceData, ["current_cap"], ranks.length ? first(ranks[0], ["cap"]) : undefined);
      const rows = history.__error ? [] : normalizeHistory(history, cap);
      // The service's own group samples (one peak per advisor window) when it sends them.
      const serviceGroup = history.__error ? [] : listOf(history.group, []);
      const groupPeaks = serviceGroup.length
        ? serviceGroup.map((g) => ({ t: Number(first(g, ["window_start_unix_s", "t"])), peak: Number(g.peak_runtime_tokens),
          overflows: Number(first(g, ["overflow_events"], 0)) || 0 }))
        : groupByInterval(rows);
      // One peak, everywhere on the page: the advice's, over all the history it holds (the chart's span is shorter).
      const spanPeak = groupPeaks.length ? Math.max(...groupPeaks.map((g) => g.peak).filter(Number.isFinite)) : undefined;
      const peak = numberOrNull(first(adviceData, ["max_peak_runtime_tokens"])) ?? spanPeak;
      const critical = findings.filter((finding) => first(finding, ["severity"]) === "critical");
      const whatif = await optional(getJSON(`${base}/whatif?` + whatIfCaps(adviceData, peak).map((c) => `cap=${c}`).join("&")));
      if (whatif.__error) errors.push(whatif.__error);

      renderCritical(critical);
      renderAdvice(adviceData, critical);
      const counts = {
        critical: critical.length,
        utilizationPoints: renderUtilization(rows, groupPeaks, adviceData),
        hotRank: renderHotRank(rows, peak),
        capMarks: renderCaps(adviceData, peak),
        distributionSamples: renderDistribution(groupPeaks, adviceData),
        overflowEvents: renderOverflows(groupPeaks),
        whatifPoints: whatif.__error ? 0 : renderWhatIf(whatif, adviceData),
        findings: renderFindings(findings),
        ranks: renderRanks(ranks, rows),
      };
      if (whatif.__error) Charts.empty($("chart-whatif"), "what-if unavailable");
      showMessage(errors.length ? `Some data could not be loaded: ${errors.join("; ")}` : "");
      Object.assign(document.body.dataset, counts, {
        clusters: String(clusters.length), cluster: state.cluster, action: first(adviceData, ["action"], ""),
        recommendedCap: String(first(adviceData, ["recommended_cap"], "")), ready: "1",
      });
      $("updated").textContent = `updated ${new Date().toTimeString().slice(0, 8)}`;
    } catch (error) {
      if (error instanceof NeedsToken) {
        const stored = sessionStorage.getItem(TOKEN_KEY);
        sessionStorage.removeItem(TOKEN_KEY);
        $("token-form").hidden = false;
        showMessage(stored ? "The service refused that token: enter the service's token (CAPWATCH_TOKEN)."
          : "This service needs its token to show its data (CAPWATCH_READS_NEED_TOKEN): enter it above.");
        document.body.dataset.ready = "token";
        return;
      }
      showMessage(`Cannot reach the capwatch API: ${error.message || error}`);
      document.body.dataset.ready = "error";
    }
  }

  function schedule() {
    clearInterval(state.timer);
    if ($("autorefresh").checked) state.timer = setInterval(refresh, REFRESH_MS);
  }

  $("cluster").addEventListener("change", (event) => {
    state.cluster = event.target.value;
    const url = new URL(location.href); url.searchParams.set("cluster", state.cluster);
    history.replaceState(null, "", url);
    refresh();
  });
  $("autorefresh").addEventListener("change", schedule);
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();  // no navigation: the token goes in headers, never in a URL
    const token = $("token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token").value = "";
    $("token-form").hidden = true;
    showMessage("");
    refresh();
  });
  $("copy-env").addEventListener("click", async () => {
    const text = $("env-line").textContent;
    try { await navigator.clipboard.writeText(text); $("copy-env").textContent = "Copied"; } catch (error) {
      const range = document.createRange(); range.selectNodeContents($("env-line"));
      const selection = getSelection(); selection.removeAllRanges(); selection.addRange(range);
      $("copy-env").textContent = "Selected";
    }
    setTimeout(() => { $("copy-env").textContent = "Copy"; }, 1500);
  });
  refresh().then(schedule);
})();
