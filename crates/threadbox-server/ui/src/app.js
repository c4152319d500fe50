// The threadbox dashboard: a few views over the daemon's REST API (ADR 0096).
// Everything a sandbox produces (names, files, logs, terminal output) is untrusted: it is
// put in the page as text (textContent), never as HTML, and files are only downloaded.
import { Terminal } from "@xterm/xterm";
import { FitAddon } from "@xterm/addon-fit";

const meta = (n) => document.querySelector(`meta[name="${n}"]`)?.content ?? "";
const CSRF = meta("tb-csrf");
const view = () => document.getElementById("view");

// ---- the API (the session cookie rides along; the CSRF header proves it is this page)

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(method, path, body) {
  const init = { method, headers: { "X-Threadbox-CSRF": CSRF }, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  if (r.status === 401) {
    // The session ended (expiry, logout elsewhere, revoked key): back to the login page.
    location.assign("/ui/");
    throw new ApiError(401, "unauthenticated", "session ended");
  }
  if (!r.ok) {
    let code = "error";
    let message = `${r.status}`;
    try {
      const e = await r.json();
      code = e.error?.code ?? code;
      message = e.error?.message ?? message;
    } catch {}
    throw new ApiError(r.status, code, message);
  }
  if (r.status === 204) return null;
  const ct = r.headers.get("content-type") ?? "";
  return ct.includes("json") ? r.json() : r.blob();
}

const enc = encodeURIComponent;

// ---- small DOM helpers (text only)

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function table(headers, rows, attrs = {}) {
  return el(
    "table",
    attrs,
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

function errorBox(e) {
  return el("p", { class: "error", role: "alert" }, `${e.code ?? "error"}: ${e.message}`);
}

// ---- views

let timer = null;
let closeView = () => {};

function setView(title, ...children) {
  const v = view();
  v.replaceChildren(el("h2", {}, title), ...children);
}

const cpuSeen = new Map(); // sandbox id -> [cpu seconds, time] for a CPU % between polls

async function sandboxesView() {
  const body = el("tbody", { id: "sandboxes" });
  const status = el("p", { class: "muted" }, "loading…");
  setView(
    "Sandboxes",
    status,
    el(
      "table",
      { class: "list" },
      el(
        "thead",
        {},
        el(
          "tr",
          {},
          ["Name", "Id", "State", "Tier", "Image", "Age", "CPU", "Memory (peak)", "Disk", ""].map((h) => el("th", {}, h)),
        ),
      ),
      body,
    ),
  );
  const refresh = async () => {
    try {
      const list = await api("GET", "/v1/sandboxes");
      // Usage needs `usage:read`; without it the figures show as —.
      let usage = new Map();
      try {
        const u = await api("GET", "/v1/usage");
        for (const t of u.tenants) for (const s of t.sandboxes) usage.set(s.id, s);
      } catch {}
      const now = Date.now();
      body.replaceChildren(
        ...list.sandboxes.map((s) => {
          const u = usage.get(s.id);
          let cpu = "—";
          if (u) {
            const prev = cpuSeen.get(s.id);
            if (prev && now > prev[1]) cpu = `${(((u.cpu_seconds - prev[0]) * 1000) / (now - prev[1]) * 100).toFixed(0)}%`;
            cpuSeen.set(s.id, [u.cpu_seconds, now]);
          }
          return el(
            "tr",
            { "data-id": s.id },
            el("td", {}, el("a", { href: `#/sb/${enc(s.id)}` }, s.name ?? "(unnamed)")),
            el("td", {}, el("code", {}, s.id)),
            el("td", {}, el("span", { class: `state ${s.state}` }, s.state)),
            el("td", {}, s.tier),
            el("td", {}, s.image),
            el("td", {}, age(s.created_at)),
            el("td", {}, cpu),
            el("td", {}, u ? bytes(u.peak_memory_bytes) : "—"),
            el("td", {}, u ? bytes(u.disk_bytes) : "—"),
            el("td", {}, el("a", { href: `#/sb/${enc(s.id)}/terminal`, class: "button" }, "Terminal")),
          );
        }),
      );
      status.textContent = `${list.sandboxes.length} sandbox(es) · refreshed ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  };
  const mine = generation;
  await refresh();
  // The person may have moved on while the first refresh was under way.
  if (mine === generation) timer = setInterval(refresh, 3000);
}

async function download(id, path) {
  const blob = await api("GET", `/v1/sandboxes/${enc(id)}/files?path=${enc(path)}`);
  // Always a download of opaque bytes: a sandbox's HTML or SVG never renders here.
  const url = URL.createObjectURL(new Blob([blob], { type: "application/octet-stream" }));
  const a = el("a", { href: url, download: path.split("/").pop() || "file" });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function filesPane(id, dir) {
  const pane = el("div", { class: "pane" }, el("p", { class: "muted" }, "loading…"));
  try {
    const list = await api("GET", `/v1/sandboxes/${enc(id)}/files/list?path=${enc(dir)}`);
    const up = dir.replace(/\/[^/]+\/?$/, "") || "/";
    const rows = list.entries.map((f) => {
      const name =
        f.kind === "dir"
          ? el("a", { href: "#", on: { click: (ev) => (ev.preventDefault(), showFiles(id, f.path)) } }, `${f.name}/`)
          : el("span", {}, f.name);
      const act =
        f.kind === "file"
          ? el("button", { type: "button", on: { click: () => download(id, f.path).catch((e) => pane.append(errorBox(e))) } }, "Download")
          : "";
      return el("tr", {}, el("td", {}, name), el("td", {}, f.kind), el("td", {}, bytes(f.size)), el("td", {}, f.modified_at), el("td", {}, act));
    });
    pane.replaceChildren(
      el("p", {}, "Directory ", el("code", {}, dir), " ", el("a", { href: "#", on: { click: (ev) => (ev.preventDefault(), showFiles(id, up)) } }, "(up)")),
      table(["Name", "Kind", "Size", "Modified", ""], rows, { class: "list" }),
    );
  } catch (e) {
    pane.replaceChildren(errorBox(e));
  }
  return pane;
}

let showFiles = () => {};
let logsPid; // the process whose logs the Logs tab shows

async function processesPane(id, logsOf) {
  const pane = el("div", { class: "pane" });
  try {
    const list = await api("GET", `/v1/sandboxes/${enc(id)}/processes`);
    const rows = list.processes.map((p) =>
      el(
        "tr",
        {},
        el("td", {}, String(p.id)),
        el("td", {}, String(p.pid)),
        el("td", {}, el("code", {}, p.command.join(" "))),
        el("td", {}, p.running ? "running" : `exited ${p.exit_code ?? ""}${p.signal ? ` (signal ${p.signal})` : ""}`),
        el("td", {}, p.started_at),
        el("td", {}, el("button", { type: "button", on: { click: () => logsOf(p.id) } }, "Logs")),
      ),
    );
    pane.append(
      list.processes.length ? table(["Id", "Pid", "Command", "Status", "Started", ""], rows, { class: "list" }) : el("p", { class: "muted" }, "No background processes."),
    );
  } catch (e) {
    pane.append(errorBox(e));
  }
  return pane;
}

async function logsPane(id, pid) {
  const pane = el("div", { class: "pane" });
  if (pid === undefined) {
    pane.append(el("p", { class: "muted" }, "Pick a process (Processes tab) to see its logs."));
    return pane;
  }
  try {
    const l = await api("GET", `/v1/sandboxes/${enc(id)}/processes/${enc(pid)}/logs`);
    const text = (s) => (l.encoding === "base64" ? atob(s) : s);
    pane.append(
      el("h3", {}, `Process ${pid}: stdout`),
      el("pre", { class: "log" }, text(l.stdout)),
      el("h3", {}, "stderr"),
      el("pre", { class: "log" }, text(l.stderr)),
    );
  } catch (e) {
    pane.append(errorBox(e));
  }
  return pane;
}

function terminalPane(id) {
  const pane = el("div", { class: "pane terminal-pane" });
  const status = el("p", { class: "muted", id: "term-status" }, "connecting…");
  const box = el("div", { id: "terminal" });
  pane.append(status, box);
  const term = new Terminal({ cursorBlink: true, convertEol: false, fontSize: 14, scrollback: 5000 });
  // No clipboard writes from the sandbox: swallow OSC 52 (no clipboard addon is loaded
  // either), and no links are made clickable.
  term.parser.registerOscHandler(52, () => true);
  const fit = new FitAddon();
  term.loadAddon(fit);
  let ws = null;
  let closed = false;
  const start = async () => {
    term.open(box);
    fit.fit();
    let session;
    try {
      const r = await api("POST", `/v1/sandboxes/${enc(id)}/pty`, { cols: term.cols, rows: term.rows });
      session = r.session;
    } catch (e) {
      status.replaceChildren(errorBox(e));
      return;
    }
    const url = new URL(`/v1/sandboxes/${enc(id)}/pty/${enc(session)}/ws`, location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    // Browsers cannot set headers on a WebSocket: the CSRF token is offered as a subprotocol.
    ws = new WebSocket(url, [`tb-csrf.${CSRF}`]);
    ws.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    ws.onopen = () => {
      status.textContent = `connected · ${term.cols}x${term.rows}`;
      term.focus();
    };
    ws.onmessage = (m) => {
      if (typeof m.data === "string") {
        let msg;
        try {
          msg = JSON.parse(m.data);
        } catch {
          return;
        }
        if (msg.type === "exit") status.textContent = `exited with ${msg.code}`;
        else if (msg.type === "error") status.replaceChildren(errorBox({ code: "error", message: msg.message }));
      } else {
        term.write(new Uint8Array(m.data));
      }
    };
    ws.onclose = () => {
      if (!closed && !/exited/.test(status.textContent)) status.textContent = "disconnected";
    };
    term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(encoder.encode(d)));
    term.onBinary((d) => ws.readyState === WebSocket.OPEN && ws.send(Uint8Array.from(d, (c) => c.charCodeAt(0))));
    term.onResize(({ cols, rows }) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "resize", cols, rows }));
      status.textContent = `connected · ${cols}x${rows}`;
    });
  };
  const onWinResize = () => fit.fit();
  window.addEventListener("resize", onWinResize);
  const stop = () => {
    closed = true;
    window.removeEventListener("resize", onWinResize);
    ws?.close();
    term.dispose();
  };
  return { pane, start, stop };
}

async function sandboxView(id, tab) {
  let info;
  try {
    info = await api("GET", `/v1/sandboxes/${enc(id)}`);
  } catch (e) {
    setView("Sandbox", errorBox(e));
    return;
  }
  const tabs = ["processes", "files", "logs", "terminal"];
  tab = tabs.includes(tab) ? tab : "processes";
  const content = el("div", { id: "tab" });
  const nav = el(
    "nav",
    { class: "tabs" },
    tabs.map((t) => el("a", { href: `#/sb/${enc(id)}/${t}`, class: t === tab ? "active" : "" }, t)),
  );
  setView(
    info.name ?? info.id,
    el(
      "dl",
      { class: "facts" },
      ["id", info.id, "state", info.state, "tier", info.tier, "image", info.image, "age", age(info.created_at),
       "cpus", info.limits?.cpus ?? "—", "memory", bytes(info.limits?.memory_bytes), "disk", bytes(info.limits?.disk_bytes)].map(
        (v, i) => el(i % 2 ? "dd" : "dt", {}, String(v)),
      ),
    ),
    nav,
    content,
  );
  const render = async (t, arg) => {
    closeView();
    closeView = () => {};
    if (t === "processes") content.replaceChildren(await processesPane(id, (pid) => ((logsPid = pid), (location.hash = `#/sb/${enc(id)}/logs`))));
    else if (t === "files") {
      showFiles = async (id2, dir) => content.replaceChildren(await filesPane(id2, dir));
      await showFiles(id, arg ?? "/");
    } else if (t === "logs") content.replaceChildren(await logsPane(id, logsPid));
    else if (t === "terminal") {
      const t2 = terminalPane(id);
      content.replaceChildren(t2.pane);
      closeView = t2.stop;
      await t2.start();
    }
  };
  await render(tab);
}

async function usageView() {
  const pane = el("div", {});
  setView("Usage and quotas", pane);
  try {
    const u = await api("GET", "/v1/usage");
    for (const t of u.tenants) {
      let quota = null;
      try {
        quota = await api("GET", `/v1/quotas/${enc(t.tenant)}`);
      } catch {}
      const q = quota?.quota ?? {};
      const lim = (v, f = String) => (v === null || v === undefined ? "unlimited" : f(v));
      pane.append(
        el("h3", {}, `Tenant ${t.tenant}`),
        table(
          ["", "Used", "Quota"],
          [
            el("tr", {}, el("td", {}, "sandboxes"), el("td", {}, String(t.sandboxes.length)), el("td", {}, lim(q.max_sandboxes))),
            el("tr", {}, el("td", {}, "CPU today"), el("td", {}, `${t.cpu_seconds_today.toFixed(1)} s`), el("td", {}, lim(q.cpu_seconds_per_day, (v) => `${v} s`))),
            el("tr", {}, el("td", {}, "CPU (all time)"), el("td", {}, `${t.cpu_seconds.toFixed(1)} s`), el("td", {}, "")),
            el("tr", {}, el("td", {}, "memory"), el("td", {}, `${t.memory_gib_seconds.toFixed(2)} GiB·s`), el("td", {}, lim(q.max_memory_bytes, bytes))),
            el("tr", {}, el("td", {}, "disk"), el("td", {}, bytes(t.disk_bytes)), el("td", {}, lim(q.disk_bytes, bytes))),
            el("tr", {}, el("td", {}, "egress up/down"), el("td", {}, `${bytes(t.egress_bytes_up)} / ${bytes(t.egress_bytes_down)}`), el("td", {}, "")),
          ],
          { class: "list" },
        ),
      );
    }
  } catch (e) {
    pane.append(errorBox(e));
  }
}

async function auditView() {
  const badge = el("span", { class: "badge", id: "audit-verify" }, "verifying…");
  const pane = el("div", {});
  setView("Audit log", el("p", {}, "Chain: ", badge), pane);
  let after = 0;
  try {
    const v = await api("GET", "/v1/audit/verify");
    after = Math.max(0, v.entries - 200); // the newest 200
    badge.textContent = v.ok ? `verified (${v.entries} entries)` : `BROKEN at ${v.first_bad_seq}: ${v.reason ?? ""}`;
    badge.classList.add(v.ok ? "ok" : "bad");
  } catch (e) {
    badge.textContent = `not verified (${e.message})`;
  }
  try {
    const a = await api("GET", `/v1/audit?after=${after}&limit=200`);
    pane.append(
      table(
        ["Seq", "Time", "Tenant", "Key", "Action", "Target", "Result"],
        a.entries
          .slice()
          .reverse()
          .map((x) =>
            el("tr", {}, [x.seq, x.time, x.tenant, x.key_id ?? "", x.action, x.target, x.result].map((c) => el("td", {}, String(c)))),
          ),
        { class: "list" },
      ),
    );
  } catch (e) {
    pane.append(errorBox(e));
  }
}

let generation = 0; // bumped at every view change

async function route() {
  generation++;
  clearInterval(timer);
  timer = null;
  closeView();
  closeView = () => {};
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "sb" && parts[1]) await sandboxView(parts[1], parts[2]);
  else if (parts[0] === "usage") await usageView();
  else if (parts[0] === "audit") await auditView();
  else await sandboxesView();
}

function boot() {
  document.getElementById("tenant").textContent = meta("tb-tenant");
  document.getElementById("keyid").textContent = meta("tb-key");
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", headers: { "X-Threadbox-CSRF": CSRF } });
    location.assign("/ui/");
  });
  window.addEventListener("hashchange", route);
  route();
}

boot();
