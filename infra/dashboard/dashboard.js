// The skew alert dashboard: reads Prometheus (through the dashboard server's /api/prometheus) and the model
// registry (/api/models) every REFRESH_MS and draws what someone paged at night needs first: what is alerting,
// which feature moved and how far, whether online still equals the offline recompute, and which model serves.
"use strict";

const REFRESH_MS = 5000;
const HOUR_S = 3600;
const charts = {};

async function getJson(path) {
  const response = await fetch(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function instant(query) {
  const body = await getJson(`api/prometheus/query?query=${encodeURIComponent(query)}`);
  return body.data.result;
}

async function range(query) {
  const end = Math.floor(Date.now() / 1000);
  const params = new URLSearchParams({ query, start: end - HOUR_S, end, step: 15 });
  const body = await getJson(`api/prometheus/query_range?${params}`);
  return body.data.result;
}

function byLabels(results, ...names) {
  const found = new Map();
  for (const r of results) found.set(names.map((n) => r.metric[n] ?? "").join("|"), Number(r.value[1]));
  return found;
}

function format(value, digits = 3) {
  return value === undefined || Number.isNaN(value) ? "—" : value.toFixed(digits);
}

function percent(value) {
  return value === undefined || Number.isNaN(value) ? "—" : `${(100 * value).toFixed(1)} %`;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function renderAlerts(alerts) {
  const body = document.querySelector("#alerts tbody");
  body.replaceChildren();
  const loopline = alerts.filter((a) => a.labels.alertname.startsWith("Loopline"));
  for (const alert of loopline) {
    const row = body.insertRow();
    row.className = alert.state === "firing" ? "alerting" : "warning";
    row.dataset.alert = alert.labels.alertname;
    cell(row, alert.labels.alertname);
    cell(row, alert.state, "state");
    cell(row, alert.labels.severity ?? "");
    cell(row, alert.annotations.summary ?? "");
    cell(row, new Date(alert.activeAt).toLocaleTimeString());
  }
  if (!loopline.length) cell(body.insertRow(), "nothing firing or pending", "muted").colSpan = 5;
  return loopline;
}

// A feature alerts when its skew crosses its own alert threshold or a page-severity alert names it (firing or pending:
// the page shows the crossing as it happens, Prometheus holds the rule before it fires); warns on the warning levels.
function featureState(feature, version, values, alerts) {
  const names = (a) => a.labels.feature === feature && (!a.labels.model_version || a.labels.model_version === version);
  const alerted = alerts.some((a) => names(a) && a.labels.severity === "page");
  const key = `${feature}|${version}`;
  const limit = (measure) => values.threshold.get(`${feature}|${measure}`);
  const over = (series, measure) => values[series].has(key) && values[series].get(key) >= limit(measure);
  if (alerted || over("psi", "psi_alert") || over("js", "js_alert") || over("linf", "linf_alert")) return "alerting";
  if (over("psi", "psi_warn") || alerts.some(names) || (values.mismatch.get(feature) ?? 0) > 0.01) return "warning";
  return "ok";
}

function renderFeatures(values, alerts) {
  const body = document.querySelector("#features tbody");
  body.replaceChildren();
  const keys = [...values.rows.keys()].sort();
  for (const key of keys) {
    const [feature, version] = key.split("|");
    const row = body.insertRow();
    const state = featureState(feature, version, values, alerts);
    row.className = state;
    row.dataset.feature = feature;
    row.dataset.version = version;
    cell(row, feature);
    cell(row, `v${version}`);
    cell(row, state, "state");
    cell(row, format(values.psi.get(key)));
    cell(row, format(values.js.get(key)));
    cell(row, format(values.linf.get(key)));
    cell(row, percent(values.defaulted.get(key)));
    cell(row, percent(values.mismatch.get(feature)));
    cell(row, percent(values.lag.get(feature)));
    cell(row, String(values.rows.get(key)));
  }
  if (!keys.length) cell(body.insertRow(), "no feature log yet: is `loopline monitor` running?", "muted").colSpan = 10;
  return keys.some((key) => body.querySelector(`tr.alerting[data-feature="${key.split("|")[0]}"]`));
}

function renderModels(models) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren();
  for (const model of models.versions) {
    const row = body.insertRow();
    row.dataset.version = model.version;
    cell(row, `${models.name} v${model.version}`);
    cell(row, model.aliases.join(", ") || "—", model.aliases.length ? "state" : "muted");
    cell(row, model.snapshot_id ?? "—");
    cell(row, model.created ?? "");
  }
}

function renderTraces(answer) {
  const link = document.getElementById("jaeger");
  if (answer.jaeger) link.href = `${answer.jaeger}/api/services`;
  const body = document.querySelector("#traces tbody");
  body.replaceChildren();
  for (const trace of answer.traces) {
    const row = body.insertRow();
    row.dataset.trace = trace.trace_id;
    if (trace.error) row.className = "alerting";
    cell(row, new Date(trace.start_us / 1000).toLocaleTimeString());
    const request = row.insertCell();
    const open = document.createElement("a");
    open.href = `${answer.jaeger}/api/traces/${trace.trace_id}`;
    open.textContent = trace.request_id ?? trace.trace_id.slice(0, 16);
    open.title = `trace ${trace.trace_id}`;
    request.append(open);
    cell(row, trace.operation);
    cell(row, format(trace.duration_ms, 2));
    cell(row, trace.error ? `failed (${trace.error})` : "ok", "state");
    const waterfall = document.createElement("div");
    waterfall.className = "waterfall";
    for (const stage of trace.stages) {
      const line = document.createElement("div");
      line.dataset.stage = stage.name;
      if (stage.depth > 1) line.className = "part";
      const bar = document.createElement("span");
      const scale = trace.duration_ms > 0 ? 100 / trace.duration_ms : 0;
      bar.style.left = `${Math.min(100, stage.offset_ms * scale) * 0.6}%`;
      bar.style.width = `${Math.min(100, stage.duration_ms * scale) * 0.6}%`;
      const label = document.createElement("label");
      label.textContent = `${stage.name} ${format(stage.duration_ms, 2)} ms`;
      label.style.left = `calc(${Math.min(100, (stage.offset_ms + stage.duration_ms) * scale) * 0.6}% + 4px)`;
      line.append(bar, label);
      waterfall.append(line);
    }
    row.insertCell().append(waterfall);
  }
  if (!answer.traces.length) {
    const why = answer.error ? `Jaeger unreachable: ${answer.error}` : answer.jaeger ? "no trace kept in the last hour" : "no Jaeger configured";
    cell(body.insertRow(), why, "muted").colSpan = 6;
  }
}

function drawChart(id, results, label, scale = 1) {
  const element = document.getElementById(id);
  if (!results.length) {
    charts[id]?.destroy();
    delete charts[id];
    element.replaceChildren();
    element.className = "muted";
    element.textContent = "no data in the last hour";
    return;
  }
  element.className = "";
  const times = [...new Set(results.flatMap((r) => r.values.map((v) => v[0])))].sort((a, b) => a - b);
  const series = results.map((r) => {
    const points = new Map(r.values.map((v) => [v[0], Number(v[1]) * scale]));
    return times.map((t) => (points.has(t) && Number.isFinite(points.get(t)) ? points.get(t) : null));
  });
  const names = results.map(label);
  const options = {
    width: element.clientWidth || 560, height: 220,
    series: [{}, ...names.map((name, i) => ({ label: name, stroke: `hsl(${(i * 67) % 360} 65% 45%)`, width: 1.5 }))],
    axes: [{}, { size: 60 }],
  };
  charts[id]?.destroy();
  element.replaceChildren();
  charts[id] = new uPlot(options, [times, ...series], element);
}

async function refresh() {
  try {
    const [psi, js, linf, defaulted, rows, threshold, mismatch, lag, reference, alertsBody, models] = await Promise.all([
      instant("loopline_feature_psi"), instant("loopline_feature_js_divergence"), instant("loopline_feature_linf_distance"),
      instant("loopline_feature_defaulted_ratio"), instant("loopline_feature_window_rows"), instant("loopline_feature_skew_threshold"),
      instant("loopline_feature_consistency_mismatch_ratio"), instant("loopline_feature_consistency_lag_ratio"),
      instant("loopline_monitor_reference_info"), getJson("api/prometheus/alerts"),
      getJson("api/models").catch(() => ({ name: "registry unreachable", versions: [] })),
    ]);
    renderTraces(await getJson("api/traces").catch((err) => ({ jaeger: null, traces: [], error: err.message })));
    const values = {
      psi: byLabels(psi, "feature", "model_version"), js: byLabels(js, "feature", "model_version"),
      linf: byLabels(linf, "feature", "model_version"), defaulted: byLabels(defaulted, "feature", "model_version"),
      rows: byLabels(rows, "feature", "model_version"), threshold: byLabels(threshold, "feature", "measure"),
      mismatch: byLabels(mismatch, "feature"), lag: byLabels(lag, "feature"),
    };
    document.getElementById("reference").textContent = reference.map((r) => r.metric.snapshot_id).join(", ") || "—";
    const alerts = renderAlerts(alertsBody.data.alerts);
    const alerting = renderFeatures(values, alerts) || alerts.some((a) => a.state === "firing" && a.labels.severity === "page");
    const status = document.getElementById("status");
    status.className = alerting ? "alerting" : "ok";
    status.textContent = alerting ? "ALERTING" : "all quiet";
    renderModels(models);
    const [psiRange, mismatchRange, p99, fallback] = await Promise.all([
      range("loopline_feature_psi"), range("loopline_feature_consistency_mismatch_ratio"),
      range('histogram_quantile(0.99, sum by (le) (rate(loopline_scoring_stage_seconds_bucket{stage="total"}[1m])))'),
      range("sum(rate(loopline_scoring_defaulted_features_total[1m])) / sum(rate(loopline_scoring_features_total[1m]))"),
    ]);
    drawChart("psi-chart", psiRange, (r) => `${r.metric.feature} v${r.metric.model_version}`);
    drawChart("consistency-chart", mismatchRange, (r) => r.metric.feature, 100);
    const scaled = (results, name, factor) => results.map((r) => ({ name, values: r.values.map(([t, v]) => [t, Number(v) * factor]) }));
    drawChart("scorer-chart", [...scaled(p99, "p99 (ms)", 1000), ...scaled(fallback, "defaulted (%)", 100)], (r) => r.name);
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
    document.getElementById("error").textContent = "";
    document.body.dataset.loaded = "true";
  } catch (err) {
    document.getElementById("error").textContent = `cannot read: ${err.message}`;
    document.getElementById("status").className = "unknown";
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
