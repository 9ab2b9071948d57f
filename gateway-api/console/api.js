// The console's side of the /v1 API (api/openapi.json): the key, JSON calls, SSE streams and
// downloads. The key lives only in this tab's sessionStorage and travels only in the
// Authorization header: never in a URL (query strings end up in logs and histories), never in
// localStorage (it would outlive the tab), never in a log line.
"use strict";

const Api = (() => {
  const SLOT = "space.console.key";

  class ApiError extends Error {
    constructor(status, code, message, body) {
      super(message || code || `HTTP ${status}`);
      this.status = status;
      this.code = code || "";
      this.body = body || null;
    }
  }

  const key = () => sessionStorage.getItem(SLOT);
  const setKey = (k) => sessionStorage.setItem(SLOT, k);
  const clearKey = () => sessionStorage.removeItem(SLOT);

  function headers(extra) {
    const h = new Headers(extra || {});
    const k = key();
    if (k) h.set("Authorization", `Bearer ${k}`);
    return h;
  }

  // An error answer as ApiError: the gateway's {code, message}, or the status alone.
  async function failure(res) {
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      body = null;
    }
    const code = body && typeof body.code === "string" ? body.code : "";
    const msg = body && typeof body.message === "string" ? body.message : res.statusText;
    return new ApiError(res.status, code, msg, body);
  }

  // A JSON call: resolves to the parsed answer (null for 204), rejects with ApiError.
  // opts.key overrides the stored key (the login form tries a key before keeping it).
  async function call(method, path, body, opts = {}) {
    const h = headers({ Accept: "application/json" });
    if (opts.key !== undefined) h.set("Authorization", `Bearer ${opts.key}`);
    const init = { method, headers: h, cache: "no-store", signal: opts.signal };
    if (body !== undefined) {
      h.set("Content-Type", "application/json");
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    if (!res.ok) throw await failure(res);
    if (res.status === 204) return null;
    return res.json();
  }

  // The WHATWG "server-sent events" parser over a fetch body (EventSource cannot send the
  // Authorization header). Calls onEvent({id, event, data}) per dispatched event; resolves
  // when the stream ends. Lines end with CRLF, LF or CR; ':' lines are comments.
  async function readSse(res, onEvent, signal) {
    const reader = res.body.getReader();
    const dec = new TextDecoder("utf-8");
    let buf = "";
    let ev = { id: null, event: "", data: [] };
    const line = (l) => {
      if (l === "") {
        if (ev.data.length)
          onEvent({ id: ev.id, event: ev.event || "message", data: ev.data.join("\n") });
        ev = { id: ev.id, event: "", data: [] };
        return;
      }
      if (l[0] === ":") return;
      const i = l.indexOf(":");
      const field = i < 0 ? l : l.slice(0, i);
      let value = i < 0 ? "" : l.slice(i + 1);
      if (value[0] === " ") value = value.slice(1);
      if (field === "data") ev.data.push(value);
      else if (field === "event") ev.event = value;
      else if (field === "id" && !value.includes("\0")) ev.id = value;
    };
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let m;
        const eol = /\r\n|\n|\r/g;
        let start = 0;
        while ((m = eol.exec(buf)) !== null) {
          // A CR at the very end may be the first half of a CRLF: wait for the next chunk.
          if (m[0] === "\r" && m.index === buf.length - 1) break;
          line(buf.slice(start, m.index));
          start = m.index + m[0].length;
        }
        buf = buf.slice(start);
        if (buf.length > 4 * 1024 * 1024) throw new Error("an SSE line longer than 4 MiB");
      }
    } finally {
      if (signal && signal.aborted) reader.cancel().catch(() => {});
    }
  }

  // One SSE request: resolves when the stream ends, rejects with ApiError on an error answer.
  // opts: body (JSON), lastEventId, signal, onOpen (called once the 200 head is here).
  async function stream(method, path, onEvent, opts = {}) {
    const h = headers({ Accept: "text/event-stream" });
    if (opts.lastEventId) h.set("Last-Event-ID", opts.lastEventId);
    const init = { method, headers: h, cache: "no-store", signal: opts.signal };
    if (opts.body !== undefined) {
      h.set("Content-Type", "application/json");
      init.body = JSON.stringify(opts.body);
    }
    const res = await fetch(path, init);
    if (!res.ok) throw await failure(res);
    const ctype = res.headers.get("Content-Type") || "";
    if (!ctype.startsWith("text/event-stream")) throw new ApiError(res.status, "", "not an event stream");
    if (opts.onOpen) opts.onOpen();
    await readSse(res, onEvent, opts.signal);
  }

  // Follows an event log stream (GET, the events routes) until signal aborts: reconnects
  // with Last-Event-ID after the last event seen, backing off 1..15 s. A 4xx other than 429
  // ends it (the key or the sandbox is gone); onState tells the view what is happening.
  async function follow(path, onEvent, { signal, onState } = {}) {
    let last = null;
    let wait = 1000;
    const state = (s, e) => onState && onState(s, e);
    while (!signal.aborted) {
      try {
        state("connecting");
        await stream("GET", path, (e) => {
          if (e.id) last = e.id;
          wait = 1000;
          onEvent(e);
        }, { signal, lastEventId: last, onOpen: () => state("open") });
        state("closed");
      } catch (e) {
        if (signal.aborted) return;
        if (e instanceof ApiError && e.status >= 400 && e.status < 500 && e.status !== 429) {
          state("failed", e);
          return;
        }
        state("retrying", e);
      }
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 15000);
    }
  }

  // A file out of a sandbox: fetched with the header, handed to the browser as a blob.
  async function download(path, name) {
    const res = await fetch(path, { headers: headers(), cache: "no-store" });
    if (!res.ok) throw await failure(res);
    const blob = await res.blob();
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = name || "download";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // A file into a sandbox: the raw bytes, PUT at path.
  async function upload(path, file) {
    const h = headers({ "Content-Type": "application/octet-stream", Accept: "application/json" });
    const res = await fetch(path, { method: "PUT", headers: h, body: file, cache: "no-store" });
    if (!res.ok) throw await failure(res);
    return res.json();
  }

  // "/v1/x" + "?a=b&..." from an object, every value encoded; empty values left out.
  function url(path, query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query || {}))
      if (v !== undefined && v !== null && v !== "") q.append(k, String(v));
    const s = q.toString();
    return s ? `${path}?${s}` : path;
  }

  const seg = (s) => encodeURIComponent(s);

  return { ApiError, key, setKey, clearKey, call, stream, follow, readSse, download, upload, url, seg };
})();
