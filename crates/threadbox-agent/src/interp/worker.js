// threadbox JavaScript context worker (embedded in the agent; see docs/interpreter.md,
// ADR 0083). Started by a `node -e` bootstrap that reads this source from the control
// socket, then run as a function body with CTL_FD and require. One request at a time on
// the control socket (NDJSON each way). Cells run in this process's global context, so
// globals and top-level `let`/`const`/`class` of one cell are there in the next.
"use strict";
const net = require("net");
const vm = require("vm");
const util = require("util");
const path = require("path");
const Module = require("module");

const MAX_TEXT = 100 * 1024;
const MAX_VALUE = 8 * 1024 * 1024;
const MAX_DISPLAYS = 64;
const MAX_DISPLAY_TOTAL = 16 * 1024 * 1024;

const sock = new net.Socket({ fd: CTL_FD, readable: true, writable: true });
function send(o) {
  sock.write(JSON.stringify(o) + "\n");
}

const state = { running: false, displays: 0, displayBytes: 0, truncated: false, stop: null };

// console.* and process.stdout/stderr writes of a cell travel on the socket, in order
// with displays; between cells (timers of an earlier cell) they go to fds 1/2, which
// the agent reads and drops. Child processes write fds 1/2 directly.
for (const [name, stream] of [["stdout", process.stdout], ["stderr", process.stderr]]) {
  const orig = stream.write.bind(stream);
  stream.write = function (chunk, encoding, cb) {
    if (typeof encoding === "function") {
      cb = encoding;
      encoding = undefined;
    }
    if (!state.running) return orig(chunk, encoding, cb);
    const text = typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("utf8");
    if (text) send({ ev: "stream", name, text });
    if (cb) process.nextTick(cb);
    return true;
  };
}

function textRepr(v) {
  let t;
  try {
    t = typeof v === "string" ? util.inspect(v) : util.inspect(v, { depth: 4, breakLength: 100 });
  } catch (e) {
    t = "<inspect failed: " + e + ">";
  }
  if (t.length > MAX_TEXT) {
    state.truncated = true;
    t = t.slice(0, MAX_TEXT) + "...";
  }
  return t;
}

function norm(mime, v) {
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) return Buffer.from(v).toString("base64");
  if (mime.endsWith("json")) return v;
  return typeof v === "string" ? v : String(v);
}

// A MIME bundle: an object's `_repr_mimebundle_()` (as in Python), plus text/plain.
function formatObject(v) {
  const data = {};
  const md = {};
  if (v !== null && typeof v === "object" && typeof v._repr_mimebundle_ === "function") {
    try {
      const r = v._repr_mimebundle_() || {};
      for (const k of Object.keys(r)) data[k] = norm(k, r[k]);
    } catch (e) {
      // a broken bundle falls back to text
    }
  }
  if (!("text/plain" in data)) data["text/plain"] = textRepr(v);
  for (const k of Object.keys(data)) {
    const size = typeof data[k] === "string" ? data[k].length : JSON.stringify(data[k]).length;
    if (size > MAX_VALUE) {
      delete data[k];
      ((md.threadbox = md.threadbox || {}).dropped = md.threadbox.dropped || []).push(k);
      state.truncated = true;
    }
  }
  return [data, md];
}

function emitDisplay(data, md) {
  let size = 0;
  for (const v of Object.values(data)) if (typeof v === "string") size += v.length;
  if (state.displays >= MAX_DISPLAYS || state.displayBytes + size > MAX_DISPLAY_TOTAL) {
    state.truncated = true;
    return;
  }
  state.displays += 1;
  state.displayBytes += size;
  send({ ev: "display", data, metadata: md });
}

// display(value) shows a value as a rich output; display({"image/png": b64}, {raw: true})
// sends a MIME bundle as is.
globalThis.display = function display(v, opts) {
  if (opts && opts.raw && v !== null && typeof v === "object") {
    const data = {};
    for (const k of Object.keys(v)) data[k] = norm(k, v[k]);
    emitDisplay(data, (opts && opts.metadata) || {});
  } else {
    const [data, md] = formatObject(v);
    emitDisplay(data, md);
  }
};
globalThis.require = Module.createRequire(path.join(process.cwd(), "<cell>"));

function exceptionOf(e) {
  if (e !== null && typeof e === "object" && typeof e.stack === "string") {
    const lines = e.stack.split("\n");
    // User frames only: the cell's, not the worker's or node's internals.
    const kept = lines.filter((l) => !/^\s+at /.test(l) || l.includes("<cell-"));
    return {
      ev: "exception",
      name: String(e.name || (e.constructor && e.constructor.name) || "Error"),
      value: String(e.message === undefined ? "" : e.message),
      traceback: kept.join("\n"),
    };
  }
  const value = textRepr(e);
  return { ev: "exception", name: "Uncaught", value, traceback: "Uncaught " + value };
}

class Interrupted extends Error {}
Interrupted.prototype.name = "KeyboardInterrupt";

// SIGINT: a running script is stopped by vm's breakOnSigint; a cell waiting on a
// promise is released (its pending work goes on); between cells it does nothing.
process.on("SIGINT", () => {
  if (state.stop) state.stop(new Interrupted("interrupted"));
});
// An error of an earlier cell's timer or promise must not end the context.
process.on("uncaughtException", (e) => {
  process.stderr.write("Uncaught " + ((e && e.stack) || String(e)) + "\n");
});
process.on("unhandledRejection", (e) => {
  process.stderr.write("Unhandled rejection " + ((e && e.stack) || String(e)) + "\n");
});

async function execute(req) {
  const n = req.execution_count || 0;
  const code = req.code || "";
  const filename = "<cell-" + n + ">";
  const env = req.env || {};
  const saved = {};
  for (const k of Object.keys(env)) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = env[k];
  }
  state.displays = 0;
  state.displayBytes = 0;
  state.truncated = false;
  let status = "ok";
  let interrupted = false;
  state.running = true;
  send({ ev: "started" });
  try {
    let script;
    let wrapped = false;
    try {
      script = new vm.Script(code, { filename });
    } catch (e) {
      // Top-level await: the cell runs as the body of an async function (its value is
      // what it returns; its declarations are its own).
      if (!(e instanceof SyntaxError) || !/\bawait\b/.test(code)) throw e;
      script = new vm.Script("(async () => {\n" + code + "\n})()", { filename, lineOffset: -1 });
      wrapped = true;
    }
    let v = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (v !== null && typeof v === "object" && typeof v.then === "function" && (wrapped || v instanceof Promise)) {
      v = await new Promise((resolve, reject) => {
        state.stop = reject;
        v.then(resolve, reject);
      });
    }
    if (v !== undefined) {
      globalThis._ = v;
      const [data, md] = formatObject(v);
      send({ ev: "result", data, metadata: md });
    }
  } catch (e) {
    status = "exception";
    if (e instanceof Interrupted || (e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED")) {
      interrupted = true;
      send({ ev: "exception", name: "KeyboardInterrupt", value: "", traceback: "KeyboardInterrupt" });
    } else {
      send(exceptionOf(e));
    }
  } finally {
    state.stop = null;
    state.running = false;
    for (const k of Object.keys(saved)) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
  }
  send({ ev: "done", status, interrupted, truncated: state.truncated });
}

let buf = "";
let queue = Promise.resolve();
sock.setEncoding("utf8");
sock.on("data", (chunk) => {
  buf += chunk;
  let i;
  while ((i = buf.indexOf("\n")) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line.trim()) continue;
    let req;
    try {
      req = JSON.parse(line);
    } catch (e) {
      send({ ev: "error", message: "malformed request" });
      continue;
    }
    if (req.op === "execute") queue = queue.then(() => execute(req));
    else send({ ev: "error", message: "unknown op" });
  }
});
sock.on("end", () => process.exit(0));
sock.on("error", () => process.exit(0));
send({ ev: "ready", pid: process.pid, node: process.version });
