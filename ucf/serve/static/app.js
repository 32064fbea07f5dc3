// The page of `ucf serve`. It keeps the state (statement, formats, schedule, target,
// examples) in the URL, sends it to the server as the user types, and shows what comes
// back. Everything is computed by the server; this file only edits and displays.
"use strict";

const $ = (id) => document.getElementById(id);
const KINDS = [["U", "dense"], ["C", "compressed"], ["S", "singleton"],
               ["Q", "unordered"], ["F", "fixed-width"]];
const VALUES = ["", "float64", "float32", "int64", "int32", "float16", "bfloat16",
                "int8", "uint8", "int4", "qint8", "quint8", "qint4"];

const state = {
  statement: "y(i) = A(i,j) * x(j)", formats: {A: "csr"}, commands: [], target: "llvm",
  dtype: "", examples: {}, size: 1000, density: 0.01, view: "c",
};
let tensors = [];        // what the server read of the statement, output first
let views = {};          // the last compile's code, by view
let sequence = 0;        // answers to older requests are dropped
let pending = null;      // the debounce timer
let inflight = null;     // AbortController of the request in flight

// ----------------------------------------------------------------- the URL

function encodeState() {
  const kept = {statement: state.statement, formats: state.formats, schedule: state.commands,
                target: state.target, dtype: state.dtype, examples: state.examples,
                size: state.size, density: state.density};
  const bytes = new TextEncoder().encode(JSON.stringify(kept));
  let text = "";
  bytes.forEach((b) => { text += String.fromCharCode(b); });
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decodeState(hash) {
  const text = atob(hash.replace(/-/g, "+").replace(/_/g, "/"));
  const bytes = Uint8Array.from(text, (c) => c.charCodeAt(0));
  const given = JSON.parse(new TextDecoder().decode(bytes));
  Object.assign(state, {
    statement: String(given.statement || ""), formats: given.formats || {},
    commands: Array.isArray(given.schedule) ? given.schedule.map(String) : [],
    target: given.target || "llvm", dtype: given.dtype || "", examples: given.examples || {},
    size: Number(given.size) || 1000, density: Number(given.density) || 0.01,
  });
}

function remember() {
  history.replaceState(null, "", "#s=" + encodeState());
}

// ----------------------------------------------------------------- requests

function request() {
  return {statement: state.statement, formats: state.formats,
          schedule: state.commands.filter((c) => c.trim()).join(";\n"),
          target: state.target, dtype: state.dtype};
}

async function post(path, body, signal) {
  const response = await fetch(path, {method: "POST", body: JSON.stringify(body), signal,
                                      headers: {"content-type": "application/json"}});
  const type = response.headers.get("content-type") || "";
  if (type.startsWith("application/json")) return {ok: response.ok, data: await response.json()};
  if (!response.ok) return {ok: false, data: {error: {kind: "Refused", message: await response.text()}}};
  return {ok: true, blob: await response.blob()};
}

function schedule(delay) {
  clearTimeout(pending);
  pending = setTimeout(update, delay);
}

async function update() {
  remember();
  const mine = ++sequence;
  if (inflight) inflight.abort();
  inflight = new AbortController();
  document.body.classList.add("busy");
  let answer;
  try {
    answer = await post("/api/compile", {...request(), examples: state.examples}, inflight.signal);
  } catch (e) {
    if (e.name === "AbortError") return;
    answer = {ok: false, data: {error: {kind: "Network", message: String(e)}}};
  }
  if (mine !== sequence) return;
  document.body.classList.remove("busy");
  const data = answer.data;
  if (data.tensors) showTensors(data.tensors);
  if (data.pictures) showPictures(data.pictures);
  showError(data.error);
  if (data.views) {
    views = data.views;
    $("cin").textContent = views.cin;
    showView();
  }
  document.body.dataset.state = data.error ? "error" : "ok";
}

// ----------------------------------------------------------------- errors

function showError(error) {
  for (const id of ["statement-error", "schedule-error", "format-error", "error"]) {
    $(id).hidden = true;
    $(id).textContent = "";
  }
  $("statement").classList.toggle("bad", false);
  $("schedule").classList.toggle("bad", false);
  if (!error) return;
  const where = error.where === "statement" ? "statement-error"
    : error.where === "schedule" ? "schedule-error"
    : error.kind === "FormatError" ? "format-error" : "error";
  const text = `${error.kind}: ${error.message}` + (error.caret ? "\n" + error.caret : "");
  $(where).textContent = text;
  $(where).hidden = false;
  if (error.where) $(error.where).classList.add("bad");
}

// ----------------------------------------------------------------- views

function showView() {
  for (const tab of document.querySelectorAll("#tabs [role=tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.view === state.view));
  }
  if (state.view === "asm") {
    $("code").textContent = views.asm || "(compiling to machine code ...)";
    if (!views.asm) loadAssembly();
    return;
  }
  const absent = {cuda: "(target cuda prints CUDA: choose it above)",
                  llvm: "(target llvm prints LLVM IR: choose it above)",
                  c: "(target cuda prints no C)"};
  $("code").textContent = views[state.view] || absent[state.view];
}

async function loadAssembly() {
  const mine = sequence;
  const answer = await post("/api/asm", request());
  if (mine !== sequence) return;
  views.asm = answer.ok ? answer.data.asm : `${answer.data.error.kind}: ${answer.data.error.message}`;
  if (state.view === "asm") $("code").textContent = views.asm;
}

// ----------------------------------------------------------------- formats

function formatText(name) {
  return state.formats[name] || "";
}

function showTensors(list) {
  const names = list.map((t) => `${t.name}/${t.order}`).join(",");
  const known = tensors.map((t) => `${t.name}/${t.order}`).join(",");
  tensors = list;
  for (const name of Object.keys(state.formats)) {
    if (!list.some((t) => t.name === name)) delete state.formats[name];
  }
  if (names !== known) {
    $("formats").replaceChildren(...list.map(formatRow));
    $("upload-tensor").replaceChildren(...list.filter((t) => !t.output && t.order === 2)
      .map((t) => new Option(t.name, t.name)));
  } else {
    for (const t of list) {
      const row = document.querySelector(`.format[data-tensor="${t.name}"]`);
      if (row && !row.contains(document.activeElement)) fillLevels(row, t);
    }
  }
}

function formatRow(t) {
  const row = document.createElement("div");
  row.className = "format";
  row.dataset.tensor = t.name;
  const label = document.createElement("span");
  label.className = "tensor";
  label.textContent = `${t.name}${t.output ? " (output)" : ""}`;
  const text = document.createElement("input");
  text.type = "text";
  text.className = "format-text";
  text.spellcheck = false;
  text.placeholder = "dense";
  text.value = formatText(t.name);
  text.setAttribute("aria-label", `format of ${t.name}`);
  text.addEventListener("input", () => { setFormat(t.name, text.value); schedule(250); });
  text.addEventListener("keydown", (e) => { if (e.key === "Enter") schedule(0); });
  const levels = document.createElement("span");
  levels.className = "levels";
  const add = button("+ level", () => { const l = readLevels(row); l.levels.push({kind: "U", stores: "0"}); fromLevels(row, l); });
  const drop = button("− level", () => { const l = readLevels(row); l.levels.pop(); fromLevels(row, l); });
  const values = document.createElement("select");
  values.className = "values";
  values.setAttribute("aria-label", `values of ${t.name}`);
  for (const v of VALUES) values.add(new Option(v || "values: default", v));
  values.addEventListener("change", () => fromLevels(row, readLevels(row)));
  row.append(label, text, levels, add, drop, values);
  fillLevels(row, t);
  return row;
}

function fillLevels(row, t) {
  row.querySelector(".format-text").value = formatText(t.name);
  row.querySelector(".values").value = t.values || "";
  row.querySelector(".levels").replaceChildren(...t.levels.map((level, k) => levelEditor(row, level, k)));
}

function levelEditor(row, level, k) {
  const span = document.createElement("span");
  span.className = "level";
  const kind = document.createElement("select");
  kind.className = "kind";
  kind.setAttribute("aria-label", `level ${k} of ${row.dataset.tensor}`);
  for (const [letter, name] of KINDS) kind.add(new Option(`${letter} ${name}`, letter));
  kind.value = level.kind[0];
  const width = document.createElement("input");
  width.type = "number";
  width.min = "1";
  width.className = "width";
  width.value = level.kind.slice(1) || "4";
  width.hidden = kind.value !== "F";
  const stores = document.createElement("input");
  stores.type = "text";
  stores.className = "stores";
  stores.value = level.stores;
  stores.size = 4;
  stores.setAttribute("aria-label", `mode stored by level ${k}`);
  const changed = () => { width.hidden = kind.value !== "F"; fromLevels(row, readLevels(row)); };
  kind.addEventListener("change", changed);
  width.addEventListener("input", changed);
  stores.addEventListener("input", changed);
  span.append(kind, width, stores);
  return span;
}

function readLevels(row) {
  const levels = [...row.querySelectorAll(".level")].map((span) => {
    const kind = span.querySelector(".kind").value;
    return {kind: kind === "F" ? "F" + span.querySelector(".width").value : kind,
            stores: span.querySelector(".stores").value.trim()};
  });
  return {levels, values: row.querySelector(".values").value};
}

function fromLevels(row, {levels, values}) {
  const letters = levels.map((l) => l.kind).join("");
  const stores = levels.map((l) => l.stores);
  const plain = stores.every((s, k) => s === String(k));
  let text = letters + (plain ? "" : ":" + stores.join(","));
  if (values) text += "@" + values;
  row.querySelector(".format-text").value = text;
  setFormat(row.dataset.tensor, text);
  row.querySelector(".levels").replaceChildren(...levels.map((l, k) => levelEditor(row, l, k)));
  schedule(0);
}

function setFormat(name, text) {
  if (text.trim()) state.formats[name] = text.trim();
  else delete state.formats[name];
}

function button(text, action) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  b.addEventListener("click", action);
  return b;
}

// ----------------------------------------------------------------- schedule

function showCommands() {
  $("commands").replaceChildren(...state.commands.map((command, k) => {
    const item = document.createElement("li");
    const text = document.createElement("input");
    text.type = "text";
    text.className = "command";
    text.spellcheck = false;
    text.value = command;
    text.setAttribute("aria-label", `schedule command ${k + 1}`);
    text.addEventListener("input", () => { state.commands[k] = text.value; syncSchedule(); schedule(250); });
    text.addEventListener("keydown", (e) => { if (e.key === "Enter") schedule(0); });
    const move = (by) => () => {
      const to = k + by;
      if (to < 0 || to >= state.commands.length) return;
      [state.commands[k], state.commands[to]] = [state.commands[to], state.commands[k]];
      showCommands(); schedule(0);
    };
    item.append(text, button("↑", move(-1)), button("↓", move(1)),
      button("remove", () => { state.commands.splice(k, 1); showCommands(); schedule(0); }));
    return item;
  }));
  syncSchedule();
}

function syncSchedule() {
  if (document.activeElement !== $("schedule")) $("schedule").value = state.commands.join(";\n");
}

function commandsOf(text) {
  const found = [];
  let depth = 0, start = 0;
  for (let k = 0; k <= text.length; k++) {
    const ch = k < text.length ? text[k] : ";";
    if (ch === "(") depth++;
    if (ch === ")") depth--;
    if (depth === 0 && (ch === ";" || ch === "\n")) {
      if (text.slice(start, k).trim()) found.push(text.slice(start, k).trim());
      start = k + 1;
    }
  }
  return found;
}

// ----------------------------------------------------------------- pictures

function showPictures(pictures) {
  const holder = $("pictures");
  for (const [name, picture] of Object.entries(pictures)) {
    let box = holder.querySelector(`.picture[data-tensor="${name}"]`);
    if (!box) {
      box = document.createElement("div");
      box.className = "picture";
      box.dataset.tensor = name;
      const drawing = document.createElement("div");
      drawing.className = "drawing";
      const example = document.createElement("textarea");
      example.className = "example";
      example.spellcheck = false;
      example.setAttribute("aria-label", `example of ${name}`);
      example.addEventListener("input", () => { state.examples[name] = example.value; schedule(400); });
      box.append(drawing, example);
      holder.append(box);
    }
    box.querySelector(".drawing").innerHTML = picture.svg;  // the server's own SVG
    const example = box.querySelector(".example");
    if (document.activeElement !== example) {
      example.value = picture.example;
      example.rows = Math.min(12, picture.example.split("\n").length + 1);
    }
  }
  for (const box of holder.querySelectorAll(".picture")) {
    if (!(box.dataset.tensor in pictures)) box.remove();
  }
}

// ----------------------------------------------------------------- run, download, share

async function run() {
  $("run-result").textContent = "running ...";
  $("run-result").className = "";
  const body = {...request(), size: Number($("size").value), density: Number($("density").value)};
  const file = $("upload").files[0];
  if (file) body.upload = {tensor: $("upload-tensor").value, text: await file.text()};
  const answer = await post("/api/run", body);
  const out = $("run-result");
  if (!answer.ok) {
    const e = answer.data.error;
    out.textContent = `${e.kind}: ${e.message}` + (e.caret ? "\n" + e.caret : "");
    out.className = "error";
    return;
  }
  const r = answer.data;
  const verdict = r.correct === null ? "not checked" : r.correct ? "correct" : "WRONG";
  const lines = [
    `${verdict}: ${r.target}, result ${r.shape.join("x") || "scalar"} with ${r.nnz} stored`,
    `ucf ${r.ucf_ms.toFixed(3)} ms (best of 5; the first call took ${r.first_ms.toFixed(1)} ms)`,
  ];
  if (r.reference_ms !== undefined) {
    const ratio = r.reference_ms / r.ucf_ms;
    lines.push(`${r.reference} ${r.reference_ms.toFixed(3)} ms: ucf is ${ratio.toFixed(2)}x as fast`);
    lines.push(`largest difference from numpy: ${r.max_error.toExponential(2)}`);
  } else {
    lines.push(`reference: ${r.reference}`);
  }
  out.textContent = lines.join("\n");
  out.className = r.correct === false ? "error" : "good";
}

async function download() {
  const name = $("name").value.trim() || "kernel";
  const answer = await post("/api/download", {...request(), name});
  if (!answer.ok) { showError(answer.data.error); return; }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(answer.blob);
  link.download = `${name}.zip`;
  document.body.append(link);
  link.click();
  link.remove();
}

async function share() {
  remember();
  try {
    await navigator.clipboard.writeText(location.href);
    $("share").textContent = "Link copied";
  } catch (e) {
    $("share").textContent = "Link in the address bar";
  }
  setTimeout(() => { $("share").textContent = "Copy link"; }, 2000);
}

// ----------------------------------------------------------------- start

function start() {
  if (location.hash.startsWith("#s=")) {
    try { decodeState(location.hash.slice(3)); } catch (e) { /* a damaged link: defaults */ }
  }
  $("statement").value = state.statement;
  $("target").value = state.target;
  $("dtype").value = state.dtype;
  $("size").value = state.size;
  $("density").value = state.density;
  showCommands();
  $("statement").addEventListener("input", () => { state.statement = $("statement").value; schedule(250); });
  $("statement").addEventListener("keydown", (e) => { if (e.key === "Enter") schedule(0); });
  $("target").addEventListener("change", () => {
    state.target = $("target").value;
    if (state.target === "cuda") state.view = "cuda";
    else if (state.view === "cuda") state.view = "c";
    $("download").textContent = state.target === "cuda" ? "Download .cu, .h and runtime headers" : "Download .c, .h and ucf.h";
    schedule(0);
  });
  $("dtype").addEventListener("change", () => { state.dtype = $("dtype").value; schedule(0); });
  $("size").addEventListener("input", () => { state.size = Number($("size").value); remember(); });
  $("density").addEventListener("input", () => { state.density = Number($("density").value); remember(); });
  $("add-command").addEventListener("click", () => { state.commands.push(""); showCommands(); $("commands").lastChild.querySelector("input").focus(); });
  $("schedule").addEventListener("input", () => { state.commands = commandsOf($("schedule").value); showCommands(); schedule(250); });
  for (const tab of document.querySelectorAll("#tabs [role=tab]")) {
    tab.addEventListener("click", () => { state.view = tab.dataset.view; showView(); });
  }
  $("run").addEventListener("click", run);
  $("download").addEventListener("click", download);
  $("share").addEventListener("click", share);
  fetch("/api/info").then((r) => r.json()).then((info) => { $("version").textContent = `version ${info.version}`; });
  update();
}

start();
