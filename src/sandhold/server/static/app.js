// The sandhold page: the caller's runs, their live output, and terminals.
//
// Rules:
// - The token is pasted once and kept in sessionStorage (this tab only); it goes
//   only in an Authorization header, never in a URL. A WebSocket gets a
//   single-use ticket from the API instead.
// - A badge shows the backend the API answered with, never the one asked for;
//   `none` is shown plainly as NOT isolated.
// - Everything shown that came from the server goes in through textContent
//   (never innerHTML): a run's output is data, not markup.
// - A failure is shown in words on the page, with the server's error message.
"use strict";

const TOKEN_KEY = "sandhold.token";
const $ = (id) => document.getElementById(id);
const VENDOR_MISSING =
  "xterm.js is missing from this install (static/vendor/ is empty): the runs work, " +
  "terminals do not. Run scripts/setup with npm on the PATH to bundle it.";

const BADGES = {
  native: ["native", "native: bubblewrap sandbox"],
  none: ["none", "none: NOT isolated (runs on the host)"],
};

function badge(el, backend) {
  const [cls, text] = BADGES[backend] || ["other", `${backend}`];
  el.className = `badge ${cls}`;
  el.textContent = text;
  el.dataset.backend = backend;
  el.hidden = false;
  return el;
}

function notice(text, isError = true) {
  const el = $("notice");
  el.textContent = text;
  el.className = isError ? "error" : "";
  el.hidden = !text;
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const headers = { authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["content-type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const err = (data && data.error) || {};
    throw new ApiError(resp.status, err.code || "http_error", err.message || resp.statusText);
  }
  return data;
}

// -- the token ---------------------------------------------------------------------

function showTokenState() {
  const have = Boolean(token());
  $("token-forget").hidden = !have;
  $("token").placeholder = have
    ? "a token is set for this tab; paste another to replace it"
    : "paste the server's token (kept for this tab only)";
}

async function useToken(value) {
  sessionStorage.setItem(TOKEN_KEY, value.trim());
  $("token").value = "";
  showTokenState();
  try {
    await api("GET", "/v1/host");
  } catch (e) {
    notice(e.status === 401 ? "the server refused that token (401)" : `${e.message}`);
    return;
  }
  notice(vendorMissing() ? VENDOR_MISSING : "");
  await Promise.all([loadRuns(), loadBackends()]);
}

// -- runs ----------------------------------------------------------------------------

let follow = null; // the AbortController of the output stream being shown

async function loadRuns() {
  let items;
  try {
    items = (await api("GET", "/v1/runs")).items;
  } catch (e) {
    notice(`could not list runs: ${e.message}`);
    return;
  }
  const body = $("runs").querySelector("tbody");
  body.replaceChildren();
  for (const run of items) {
    const tr = document.createElement("tr");
    tr.dataset.run = run.id;
    const cells = [run.id, null, run.state, run.mode, run.network];
    for (const value of cells) {
      const td = document.createElement("td");
      if (value === null) td.append(badge(document.createElement("span"), run.backend));
      else td.textContent = value;
      tr.append(td);
    }
    tr.firstChild.className = "id";
    tr.addEventListener("click", () => showOutput(run.id, tr));
    body.append(tr);
  }
  $("runs-empty").hidden = items.length > 0;
}

async function showOutput(runId, row) {
  if (follow) follow.abort();
  follow = new AbortController();
  for (const tr of document.querySelectorAll("#runs tbody tr")) tr.classList.remove("chosen");
  row.classList.add("chosen");
  $("output-title").hidden = false;
  $("output-run").textContent = runId;
  const out = $("output");
  out.replaceChildren();
  const put = (text, cls) => {
    const span = document.createElement("span");
    if (cls) span.className = cls;
    span.textContent = text;
    out.append(span);
    out.scrollTop = out.scrollHeight;
  };
  let resp;
  try {
    // fetch, not EventSource: EventSource cannot send the Authorization header
    resp = await fetch(`/v1/runs/${encodeURIComponent(runId)}/events`, {
      headers: { authorization: `Bearer ${token()}` },
      signal: follow.signal,
    });
  } catch (e) {
    if (e.name !== "AbortError") put(`[could not follow: ${e.message}]\n`, "meta");
    return;
  }
  if (!resp.ok) {
    put(`[could not follow: ${resp.status}]\n`, "meta");
    return;
  }
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block
          .split("\n")
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trim())
          .join("\n");
        if (data) showEvent(JSON.parse(data), put);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") put(`[stream ended: ${e.message}]\n`, "meta");
  }
}

function showEvent(ev, put) {
  if (ev.type === "stdout" || ev.type === "stderr") put(ev.data, ev.type);
  else if (ev.type === "exit") put(`[exec ${ev.exec_id} exited ${ev.exit_code}]\n`, "meta");
  else if (ev.type === "violation") {
    const v = ev.violation || {};
    put(`[violation: ${v.action} ${v.target} (${v.rule})]\n`, "meta");
  } else put(`[${ev.type}]\n`, "meta");
}

// -- terminals -------------------------------------------------------------------------

const term = { xterm: null, fit: null, socket: null, id: null };

async function loadBackends() {
  const select = $("terminal-backend");
  let host;
  try {
    host = await api("GET", "/v1/host");
  } catch (e) {
    notice(`could not ask the host: ${e.message}`);
    return;
  }
  select.replaceChildren();
  const hints = [];
  for (const name of ["none", "native"]) {
    const b = host.backends[name];
    if (!b) continue;
    const opt = document.createElement("option");
    opt.value = name;
    opt.textContent = name === "none" ? "none (the host shell, NOT isolated)" : "native (sandboxed)";
    if (!b.available) {
      opt.disabled = true;
      opt.textContent += ": unavailable";
      hints.push(`native is unavailable: ${b.note}${b.hint ? ` (${b.hint})` : ""}`);
    }
    select.append(opt);
  }
  $("terminal-hint").textContent = hints.join("; ");
}

function vendorMissing() {
  return typeof window.Terminal !== "function" || typeof window.FitAddon !== "object";
}

async function openTerminal() {
  if (vendorMissing()) {
    notice(VENDOR_MISSING);
    return;
  }
  closeTerminal();
  const status = $("terminal-status");
  status.className = "";
  status.textContent = "opening…";
  const xterm = new window.Terminal({ cursorBlink: true, scrollback: 5000, fontSize: 14 });
  const fit = new window.FitAddon.FitAddon();
  xterm.loadAddon(fit);
  const el = $("terminal");
  el.replaceChildren();
  xterm.open(el);
  fit.fit();
  term.xterm = xterm;
  term.fit = fit;
  let made;
  try {
    made = await api("POST", "/v1/terminals", {
      backend: $("terminal-backend").value || "none",
      cols: xterm.cols,
      rows: xterm.rows,
    });
  } catch (e) {
    status.textContent = "";
    notice(`could not open a terminal: ${e.message}`);
    return;
  }
  term.id = made.id;
  // the badge is what the server says runs, never what was chosen
  badge($("terminal-badge"), made.backend);
  $("terminal-close").hidden = false;
  await attach(made.id);
}

async function attach(id) {
  const status = $("terminal-status");
  let ticket;
  try {
    ticket = (await api("POST", `/v1/terminals/${encodeURIComponent(id)}/ticket`)).ticket;
  } catch (e) {
    notice(`could not attach: ${e.message}`);
    return;
  }
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/v1/terminals/${encodeURIComponent(id)}/ws?ticket=${encodeURIComponent(ticket)}`;
  const socket = new WebSocket(url);
  socket.binaryType = "arraybuffer";
  term.socket = socket;
  const xterm = term.xterm;
  const encoder = new TextEncoder();
  socket.onopen = () => {
    status.textContent = `attached to ${id}`;
    socket.send(JSON.stringify({ type: "resize", cols: xterm.cols, rows: xterm.rows }));
    xterm.focus();
  };
  socket.onmessage = (msg) => {
    if (typeof msg.data !== "string") {
      xterm.write(new Uint8Array(msg.data));
      return;
    }
    const ctl = JSON.parse(msg.data);
    if (ctl.type === "exit") {
      status.className = "exited";
      status.textContent = `the shell exited with code ${ctl.exit_code}`;
      status.dataset.exitCode = String(ctl.exit_code);
    }
  };
  socket.onclose = (ev) => {
    if (term.socket !== socket) return;
    term.socket = null;
    if (status.className !== "exited") {
      status.textContent = `disconnected (${ev.code}${ev.reason ? `: ${ev.reason}` : ""})`;
    }
  };
  xterm.onData((d) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(d));
  });
  xterm.onBinary((d) => {
    if (socket.readyState !== WebSocket.OPEN) return;
    socket.send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff));
  });
  xterm.onResize(({ cols, rows }) => {
    if (socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "resize", cols, rows }));
    }
  });
}

function closeTerminal() {
  if (term.socket) {
    const s = term.socket;
    term.socket = null;
    s.close();
  }
  if (term.id) {
    api("DELETE", `/v1/terminals/${encodeURIComponent(term.id)}`).catch(() => {});
    term.id = null;
  }
  if (term.xterm) {
    term.xterm.dispose();
    term.xterm = null;
  }
  $("terminal-badge").hidden = true;
  $("terminal-close").hidden = true;
  $("terminal-status").textContent = "";
}

// -- start -----------------------------------------------------------------------------

window.addEventListener("resize", () => {
  if (term.fit) term.fit.fit();
});

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = $("token").value.trim();
  if (value) useToken(value);
});
$("token-forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  closeTerminal();
  $("runs").querySelector("tbody").replaceChildren();
  showTokenState();
  notice("the token is forgotten for this tab", false);
});
$("runs-refresh").addEventListener("click", () => loadRuns());
$("terminal-open").addEventListener("click", () => openTerminal());
$("terminal-close").addEventListener("click", () => closeTerminal());

showTokenState();
if (vendorMissing()) notice(VENDOR_MISSING);
if (token()) useToken(token());
