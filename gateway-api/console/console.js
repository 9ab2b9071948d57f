// The console's pages, one hash route each:
//   #/login                         the key
//   #/sandboxes                     list with filters, create, lifecycle buttons
//   #/sandbox/<id>/<tab>            events (live), timeline (the log), commands, files, network
//   #/admin/keys, #/admin/platforms admin keys only
// Each page owns an AbortController: leaving the page ends its streams and timers.
"use strict";

(() => {
  const { el, append, clear, time, LiveLog } = View;
  const main = document.getElementById("main");
  const nav = document.getElementById("nav");
  const notice = document.getElementById("notice");
  const STATES = ["requested", "placed", "running", "paused", "suspending", "suspended",
    "resuming", "failed", "deleted"];
  const LIST_MAX = 5000; // sandboxes fetched for the list, in pages of 1000
  let page = null; // {abort: AbortController}
  let isAdmin = false;
  let adminProbed = false;
  let loginNotice = "";

  function say(text, kind) {
    notice.hidden = !text;
    notice.className = kind || "";
    notice.textContent = text || "";
  }

  const errText = (e) => (e instanceof Api.ApiError
    ? `${e.status}${e.code ? ` ${e.code}` : ""}: ${e.message}`
    : String(e && e.message ? e.message : e));

  // Runs an action from a button: disabled while it runs, the error said, not thrown.
  async function act(button, fn) {
    if (button) button.disabled = true;
    try {
      return await fn();
    } catch (e) {
      // Leaving a page (or "Stop following") aborts its requests: nothing to report.
      if (e && e.name === "AbortError") return undefined;
      if (e instanceof Api.ApiError && e.status === 401) return logout("The key was refused.");
      say(errText(e), "error");
      return undefined;
    } finally {
      if (button) button.disabled = false;
    }
  }

  function logout(message) {
    Api.clearKey();
    isAdmin = false;
    adminProbed = false;
    for (const a of document.querySelectorAll(".admin-only")) a.hidden = true;
    delete document.body.dataset.admin;
    // Said by the login page once it is shown (show() clears the notice first).
    loginNotice = message || "";
    if (location.hash === "#/login") show();
    else location.hash = "#/login";
  }
  document.getElementById("logout").addEventListener("click", () => logout());

  // ---- login ----

  function loginPage() {
    nav.hidden = true;
    if (loginNotice) say(loginNotice, "error");
    loginNotice = "";
    const input = el("input", { type: "password", id: "key", name: "key", autocomplete: "off",
      required: true, placeholder: "API key", "aria-label": "API key" });
    const status = el("p", { id: "login-status", className: "error", role: "alert" });
    const form = el("form", { id: "login", className: "card" },
      el("h1", {}, "Log in"),
      el("p", {}, "Paste an API key (space up printed the first one; it is in space.env as " +
        "SPACE_API_KEY). It stays in this tab's session storage until you log out or close it."),
      input, el("button", { type: "submit" }, "Log in"), status);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const k = input.value.trim();
      status.textContent = "";
      if (!k) return;
      try {
        await Api.call("GET", Api.url("/v1/sandboxes", { limit: 1 }), undefined, { key: k });
      } catch (e) {
        status.textContent = e instanceof Api.ApiError && e.status === 401
          ? "This key was refused." : `Could not log in: ${errText(e)}`;
        input.value = "";
        return;
      }
      input.value = "";
      Api.setKey(k);
      location.hash = "#/sandboxes";
    });
    main.replaceChildren(form);
    input.focus();
  }

  // Shows the admin pages when the key may list keys: 403 for a tenant's key. The tenant
  // filter names none, so an admin's answer is an empty list, not every key.
  async function probeAdmin() {
    adminProbed = true;
    try {
      await Api.call("GET", Api.url("/v1/keys", { tenant: "console-admin-probe" }));
      isAdmin = true;
    } catch (e) {
      isAdmin = false;
    }
    for (const a of document.querySelectorAll(".admin-only")) a.hidden = !isAdmin;
    document.body.dataset.admin = isAdmin ? "yes" : "no";
  }

  // ---- sandboxes ----

  function lifecycleButtons(s, after) {
    const b = (label, action, states) => states.includes(s.state)
      ? el("button", { type: "button", className: `act-${action}`, dataset: { action },
        onclick: (ev) => lifecycle(ev.currentTarget, s.id, action, after) }, label)
      : null;
    return [
      b("Pause", "pause", ["running"]),
      b("Resume", "resume", ["paused", "suspended"]),
      b("Suspend", "suspend", ["running", "paused"]),
      b("Delete", "delete", ["requested", "placed", "running", "paused", "suspended", "failed"]),
    ];
  }

  async function lifecycle(button, id, action, after) {
    if (action === "delete" && !confirm(`Delete sandbox ${id}?`)) return;
    say(`${action}: ${id}...`);
    const done = await act(button, async () => {
      if (action === "delete") await Api.call("DELETE", `/v1/sandboxes/${Api.seg(id)}`);
      else await Api.call("POST", `/v1/sandboxes/${Api.seg(id)}/${action}`);
      return true;
    });
    if (done) say(`${action}: ${id} done`);
    if (after) after(action, done);
  }

  async function sandboxesPage(signal) {
    const state = el("select", { id: "f-state", "aria-label": "state" },
      el("option", { value: "" }, "any state but deleted"),
      STATES.map((s) => el("option", { value: s }, s)));
    const tmpl = el("input", { id: "f-template", placeholder: "template", "aria-label": "template" });
    const text = el("input", { id: "f-text", placeholder: "id or metadata text",
      "aria-label": "id or metadata text" });
    const count = el("span", { id: "count", className: "muted" });
    const tbody = el("tbody", { id: "sandbox-rows" });
    let all = [];
    let lastSig = "";

    const ctemplate = el("select", { id: "c-template", required: true, "aria-label": "template" });
    const ctimeout = el("input", { id: "c-timeout", type: "number", min: 0, max: 2592000,
      value: "300", "aria-label": "timeout (s)" });
    const cmeta = el("textarea", { id: "c-metadata", rows: 2, placeholder: "key=value, one a line",
      "aria-label": "metadata" });
    const create = el("form", { id: "create", className: "card" },
      el("h2", {}, "New sandbox"),
      el("label", {}, "Template ", ctemplate),
      el("label", {}, "Timeout (s, 0 = none) ", ctimeout),
      el("label", {}, "Metadata ", cmeta),
      el("button", { type: "submit", id: "c-submit" }, "Create"));

    const filters = el("form", { id: "filters", className: "filters" },
      state, tmpl, text, el("button", { type: "submit" }, "Refresh"), count);
    main.replaceChildren(el("h1", {}, "Sandboxes"), create, filters,
      el("table", { id: "sandboxes" },
        el("thead", {}, el("tr", {}, ["id", "template", "state", "created", "metadata", ""]
          .map((h) => el("th", {}, h)))),
        tbody));

    const visible = () => {
      const t = tmpl.value.trim().toLowerCase();
      const q = text.value.trim().toLowerCase();
      return all.filter((s) => (!t || s.template.toLowerCase().includes(t)) &&
        (!q || s.id.includes(q) || Object.entries(s.metadata || {})
          .some(([k, v]) => `${k}=${v}`.toLowerCase().includes(q))));
    };
    const render = () => {
      const rows = visible();
      View.sandboxRows(tbody, rows, (s) => lifecycleButtons(s, () => load()));
      count.textContent = `${rows.length} of ${all.length}`;
    };
    // Every page of the list (limit 1000), up to LIST_MAX; the state filter is the API's.
    const load = async () => {
      const got = [];
      let cursor = null;
      do {
        const r = await Api.call("GET", Api.url("/v1/sandboxes",
          { state: state.value, limit: 1000, cursor }), undefined, { signal });
        got.push(...r.sandboxes);
        cursor = r.next_cursor;
      } while (cursor && got.length < LIST_MAX && !signal.aborted);
      // The 5 s refresh mostly finds nothing new: then the rows stay as they are.
      const sig = JSON.stringify(got);
      if (sig === lastSig) return;
      lastSig = sig;
      all = got;
      render();
    };

    filters.addEventListener("submit", (ev) => {
      ev.preventDefault();
      act(null, load);
    });
    state.addEventListener("change", () => act(null, load));
    tmpl.addEventListener("input", render);
    text.addEventListener("input", render);
    create.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const metadata = {};
      for (const l of cmeta.value.split("\n")) {
        const i = l.indexOf("=");
        if (l.trim() === "") continue;
        if (i < 1) return say(`metadata line without key=value: ${l}`, "error");
        metadata[l.slice(0, i).trim()] = l.slice(i + 1);
      }
      const body = { template: ctemplate.value, timeout_s: Number(ctimeout.value || 0), metadata };
      say(`creating a ${body.template} sandbox...`);
      const s = await act(ev.submitter, () => Api.call("POST", "/v1/sandboxes", body));
      if (s) {
        say(`created ${s.id}: ${s.state}`);
        cmeta.value = "";
        await act(null, load);
      }
    });

    act(null, async () => {
      const t = await Api.call("GET", "/v1/templates", undefined, { signal });
      ctemplate.replaceChildren(...t.templates.map((x) => el("option", { value: x.name }, x.name)));
    });
    await act(null, load);
    // Kept fresh while shown: a few hundred rows every 5 s is one query and one swap.
    const timer = setInterval(() => { if (!document.hidden) act(null, load); }, 5000);
    signal.addEventListener("abort", () => clearInterval(timer));
  }

  // ---- one sandbox ----

  // The payload of an event record: the envelope's member named after its type
  // ("CommandRequested" -> "command_requested"; the log refuses an event whose type does not
  // name its payload), so fields the envelope gains (the signature's, say) are never taken for it.
  function payloadOf(ev) {
    if (!ev || typeof ev.type !== "string") return null;
    const key = ev.type.replace(/(?!^)([A-Z])/g, "_$1").toLowerCase();
    return Object.prototype.hasOwnProperty.call(ev, key) ? ev[key] : null;
  }

  function parseRecord(e) {
    try {
      const r = JSON.parse(e.data);
      return r && typeof r === "object" && r.event ? r : null;
    } catch (_) {
      return null;
    }
  }

  const brief = (v) => {
    const s = v === null || v === undefined ? "" : JSON.stringify(v);
    return s.length > 400 ? `${s.slice(0, 400)}...` : s;
  };

  function eventLine(r) {
    const ev = r.event;
    return el("div", { className: `ev ${r.status === "rejected" ? "rejected" : ""}` },
      el("span", { className: "seq" }, String(r.seq)), " ",
      el("span", { className: "when" }, time(Number(ev.occurred_at_us))), " ",
      el("span", { className: "type" }, String(ev.type || "")), " ",
      r.status === "rejected" ? el("span", { className: "reason" }, `rejected: ${r.reason || ""} `) : null,
      el("span", { className: "payload" }, brief(payloadOf(ev))));
  }

  // The timeline and the egress decisions are grids of divs, not tables: each row lays out
  // alone (fixed columns) and rows off screen skip layout (content-visibility, console.css),
  // which keeps 2,000 rows cheap to append to; an auto-layout table measures every cell.
  function gridRow(cells, attrs) {
    return el("div", { ...attrs, className: `row ${attrs.className || ""}`, role: "row" },
      cells.map(([text, cls]) => el("span", { className: cls || "", role: "cell" }, text)));
  }

  function gridTable(id, heads) {
    const body = el("div", { id: `${id}-rows`, role: "rowgroup" });
    const scroller = el("div", { id, className: `grid grid-${id}`, role: "table" },
      el("div", { className: "row head", role: "row" }, heads.map((h) => el("span", { role: "columnheader" }, h))),
      body);
    return { body, scroller };
  }

  function timelineRow(r) {
    const ev = r.event;
    return gridRow([
      [String(r.seq)], [time(Number(ev.occurred_at_us))], [String(ev.type || ""), "type"],
      [String(ev.actor || "")], [r.status === "rejected" ? `rejected: ${r.reason || ""}` : r.status],
      [brief(payloadOf(ev)), "payload"],
    ], { className: r.status === "rejected" ? "rejected" : "", dataset: { type: ev.type || "" } });
  }

  function decisionRow(kind, d) {
    return gridRow([
      [time(Number(d.last_at_us || d.first_at_us))], [kind, "decision"], [String(d.protocol || "")],
      [String(d.name || "")], [String(d.address || "")], [String(d.port || "")],
      [String(d.rule || "")], [String(d.reason || "")], [String(d.count || 1)],
    ], { className: kind });
  }

  async function sandboxPage(signal, id, tab) {
    const base = `/v1/sandboxes/${Api.seg(id)}`;
    const head = el("div", { id: "sandbox-head", className: "card" });
    const tabs = ["events", "timeline", "commands", "files", "network"];
    const panes = {};
    for (const t of tabs) panes[t] = el("section", { id: `tab-${t}`, className: "pane", hidden: t !== tab });
    main.replaceChildren(
      el("p", {}, el("a", { href: "#/sandboxes" }, "All sandboxes")),
      head,
      el("nav", { className: "tabs" }, tabs.map((t) => el("a", {
        href: `#/sandbox/${encodeURIComponent(id)}/${t}`, className: t === tab ? "active" : "",
        dataset: { tab: t } }, t))),
      ...tabs.map((t) => panes[t]));

    // The header: state and facts, lifecycle buttons; refreshed after each action.
    const showHead = (s) => {
      const meta = Object.entries(s.metadata || {});
      head.replaceChildren(
        el("h1", {}, s.id, " ", el("span", { id: "sandbox-state", className: `state state-${s.state}` }, s.state)),
        el("dl", {},
          el("dt", {}, "template"), el("dd", {}, s.template),
          el("dt", {}, "worker"), el("dd", {}, s.worker || ""),
          el("dt", {}, "created"), el("dd", {}, time(s.created_at)),
          el("dt", {}, "deadline"), el("dd", {}, s.timeout_at ? time(s.timeout_at) : "none"),
          el("dt", {}, "resources"), el("dd", {}, brief(s.resources)),
          el("dt", {}, "metadata"), el("dd", { id: "sandbox-meta" }, meta.length
            ? el("ul", {}, meta.map(([k, v]) => el("li", {}, `${k} = ${v}`))) : "none"),
          s.failure_reason ? [el("dt", {}, "failure"), el("dd", {}, s.failure_reason)] : null),
        el("div", { className: "actions" }, lifecycleButtons(s, (action, ok) => {
          if (action === "delete" && ok) location.hash = "#/sandboxes";
          else refresh();
        })));
    };
    const refresh = () => act(null, async () => showHead(await Api.call("GET", base, undefined, { signal })));
    await refresh();

    // Live events: from now on.
    const liveStatus = el("p", { className: "muted stream-state" });
    const liveBox = el("div", { id: "live-events", className: "log" });
    const live = new LiveLog(liveBox, { make: eventLine });
    append(panes.events, el("h2", {}, "Live events"), liveStatus, liveBox);
    const streamState = (p) => (s, e) => { p.textContent = `stream: ${s}${e ? ` (${errText(e)})` : ""}`; };
    Api.follow(`${base}/events`, (e) => {
      const r = parseRecord(e);
      if (!r) return;
      live.push(r);
      if (/^Sandbox(Paused|Resumed|Suspended|Started|Deleted|Failed)$/.test(r.event.type)) refresh();
    }, { signal, onState: streamState(liveStatus) });

    // The timeline, the network policy and the egress decisions: the sandbox's whole log
    // (from=0), then what comes.
    const tlStatus = el("p", { className: "muted stream-state" });
    const tl = gridTable("timeline", ["seq", "time", "type", "actor", "status", "payload"]);
    const timeline = new LiveLog(tl.body, { make: timelineRow, scroller: tl.scroller });
    append(panes.timeline, el("h2", {}, "Audit timeline"), tlStatus, tl.scroller);
    const policyBox = el("pre", { id: "policy" }, "no policy event seen yet");
    const policyFrom = el("p", { className: "muted", id: "policy-from" });
    const counts = el("ul", { id: "egress-counts" }, el("li", {}, "no egress decision in the log yet"));
    const dec = gridTable("egress", ["time", "decision", "protocol", "name", "address", "port",
      "rule", "reason", "count"]);
    const decisions = new LiveLog(dec.body, { make: (x) => decisionRow(x.kind, x.d), scroller: dec.scroller });
    const tally = new Map();
    const showTally = () => counts.replaceChildren(...[...tally.entries()]
      .sort((a, b) => b[1] - a[1]).map(([k, n]) => el("li", {}, `${k}: ${n}`)));
    const netForm = networkForm(base, signal);
    append(panes.network, el("h2", {}, "Network policy"), policyFrom, policyBox, netForm,
      el("h2", {}, "Egress decisions"),
      el("p", { className: "muted" }, "From the sandbox's EgressAllowed / EgressDenied events " +
        "(space-egressd aggregates identical decisions per interval: count)."),
      counts, dec.scroller);

    Api.follow(`${base}/events?from=0`, (e) => {
      const r = parseRecord(e);
      if (!r) return;
      timeline.push(r);
      if (r.status !== "accepted") return;
      const p = payloadOf(r.event);
      if (p && typeof p === "object") {
        const pol = p.network || (p.request && p.request.network);
        if (pol && typeof pol === "object") {
          policyBox.textContent = JSON.stringify(pol, null, 2);
          policyFrom.textContent = `from ${r.event.type} at ${time(Number(r.event.occurred_at_us))} (seq ${r.seq})`;
        }
        const kind = r.event.type === "EgressAllowed" ? "allowed"
          : r.event.type === "EgressDenied" ? "denied" : null;
        if (kind && p.decision) {
          decisions.push({ kind, d: p.decision });
          const k = `${kind} ${p.decision.reason || p.decision.rule || ""}`.trim();
          tally.set(k, (tally.get(k) || 0) + Number(p.decision.count || 1));
          showTally();
        }
      }
    }, { signal, onState: streamState(tlStatus) });

    commandPane(panes.commands, base, signal);
    filesPane(panes.files, base, signal);
  }

  function networkForm(base, signal) {
    const mode = el("select", { id: "n-mode", "aria-label": "mode" },
      ["deny_all", "allow_all", "allowlist"].map((m) => el("option", { value: m }, m)));
    const allow = el("textarea", { id: "n-allow", rows: 2, placeholder: "allow: one entry a line",
      "aria-label": "allow" });
    const deny = el("textarea", { id: "n-deny", rows: 2, placeholder: "deny: one entry a line",
      "aria-label": "deny" });
    const form = el("form", { id: "network-form", className: "card" },
      el("h3", {}, "Replace the policy"), mode, allow, deny, el("button", { type: "submit" }, "Apply"));
    const lines = (t) => t.value.split("\n").map((x) => x.trim()).filter(Boolean);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { mode: mode.value, deny: lines(deny) };
      if (mode.value === "allowlist") body.allow = lines(allow);
      const r = await act(ev.submitter, () => Api.call("PUT", `${base}/network`, body, { signal }));
      if (r) say("network policy applied");
    });
    return form;
  }

  function commandPane(pane, base, signal) {
    const cmd = el("input", { id: "cmd", placeholder: "command, run as /bin/sh -c", "aria-label": "command",
      autocomplete: "off", spellcheck: "false" });
    const out = el("pre", { id: "cmd-output", className: "log" });
    const status = el("p", { id: "cmd-status", className: "muted" });
    const log = new LiveLog(out, {
      make: (x) => el("span", { className: x.stream }, x.text),
    });
    let running = null;
    const stop = el("button", { type: "button", id: "cmd-stop", disabled: true, onclick: () => running && running.abort() }, "Stop following");
    const form = el("form", { id: "cmd-form", className: "filters" }, cmd,
      el("button", { type: "submit", id: "cmd-run" }, "Run"), stop);
    append(pane, el("h2", {}, "Run a command"), form, status, out);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const line = cmd.value;
      if (!line.trim()) return;
      log.reset();
      status.textContent = "starting...";
      delete status.dataset.exit;
      running = new AbortController();
      const ac = running;
      signal.addEventListener("abort", () => ac.abort());
      stop.disabled = false;
      const dec = (b64) => {
        try {
          return new TextDecoder().decode(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
        } catch (_) {
          return "";
        }
      };
      // The output as SSE. If the connection breaks before the exit event, the command runs
      // on: follow it again from the last chunk seen (GET .../stream with Last-Event-ID).
      let cmdId = null;
      let lastSeq = null;
      let exited = false;
      const onEvent = (e) => {
        let d = {};
        try { d = JSON.parse(e.data); } catch (_) { return; }
        if (e.id) lastSeq = e.id;
        if (e.event === "start") {
          cmdId = d.cmd_id;
          if (!d.attached) status.textContent = `running: ${d.cmd_id} (pid ${d.pid})`;
        } else if (e.event === "stdout" || e.event === "stderr") {
          log.push({ stream: e.event, text: typeof d.text === "string" ? d.text : dec(d.b64 || "") });
        } else if (e.event === "exit") {
          exited = true;
          log.flushNow();
          status.textContent = `exit code ${d.exit_code}` +
            (d.signal ? `, signal ${d.signal}` : "") + (d.timed_out ? ", timed out" : "") +
            (d.error ? `, error: ${d.error}` : "") + (d.truncated ? ", output truncated" : "") +
            (d.output_lost ? ", output lost" : "");
          status.dataset.exit = String(d.exit_code);
        }
      };
      await act(ev.submitter, async () => {
        try {
          await Api.stream("POST", `${base}/commands`, onEvent, { body: { cmd: line }, signal: ac.signal });
        } catch (e) {
          if (!cmdId || ac.signal.aborted) throw e;
        }
        for (let tries = 0; !exited && cmdId && !ac.signal.aborted && tries < 5; tries++) {
          status.textContent = `reconnecting to ${cmdId}...`;
          await new Promise((r) => setTimeout(r, 1000));
          try {
            await Api.stream("GET", `${base}/commands/${Api.seg(cmdId)}/stream`, onEvent,
              { signal: ac.signal, lastEventId: lastSeq });
          } catch (e) {
            if (ac.signal.aborted || (e instanceof Api.ApiError && e.status < 500 && e.status !== 429)) throw e;
          }
        }
        if (!exited && !ac.signal.aborted) status.textContent = `lost the output of ${cmdId || "the command"}`;
      });
      if (ac.signal.aborted && !exited && !signal.aborted)
        status.textContent = `stopped following${cmdId ? ` ${cmdId}` : ""} (the command runs on)`;
      stop.disabled = true;
    });
  }

  function filesPane(pane, base, signal) {
    const path = el("input", { id: "f-path", value: "/", "aria-label": "directory" });
    const tbody = el("tbody", { id: "file-rows" });
    const note = el("p", { className: "muted", id: "files-note" });
    const up = el("input", { type: "file", id: "f-upload", "aria-label": "upload" });
    const form = el("form", { id: "files-form", className: "filters" }, path,
      el("button", { type: "submit" }, "List"),
      el("button", { type: "button", onclick: () => { path.value = parent(path.value); list(); } }, "Up"),
      up);
    append(pane, el("h2", {}, "Files"), form, note,
      el("table", { id: "files" }, el("thead", {}, el("tr", {}, ["name", "type", "size", "mode",
        "modified", ""].map((h) => el("th", {}, h)))), tbody));
    const parent = (p) => {
      const s = p.replace(/\/+$/, "");
      const i = s.lastIndexOf("/");
      return i <= 0 ? "/" : s.slice(0, i);
    };
    const baseName = (p) => p.slice(p.lastIndexOf("/") + 1) || p;
    const list = () => act(null, async () => {
      const r = await Api.call("GET", Api.url(`${base}/files/list`, { path: path.value }), undefined, { signal });
      note.textContent = `${r.entries.length} entries${r.truncated ? " (truncated)" : ""}`;
      const f = document.createDocumentFragment();
      for (const e of r.entries.sort((a, b) => (a.type === "dir") === (b.type === "dir")
        ? a.path.localeCompare(b.path) : a.type === "dir" ? -1 : 1)) {
        const name = baseName(e.path);
        f.appendChild(el("tr", {},
          el("td", {}, e.type === "dir"
            ? el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); path.value = e.path; list(); } }, `${name}/`)
            : name),
          el("td", {}, e.type + (e.target ? ` -> ${e.target}` : "")),
          el("td", {}, String(e.size)), el("td", {}, e.mode), el("td", {}, time(e.mtime)),
          el("td", {}, e.type === "file" ? el("button", { type: "button", onclick: (ev) =>
            act(ev.currentTarget, () => Api.download(Api.url(`${base}/files`, { path: e.path }), name)) },
          "Download") : null)));
      }
      tbody.replaceChildren(f);
    });
    form.addEventListener("submit", (ev) => { ev.preventDefault(); list(); });
    up.addEventListener("change", () => {
      const file = up.files[0];
      if (!file) return;
      const dest = `${path.value.replace(/\/+$/, "")}/${file.name}`;
      act(null, async () => {
        await Api.upload(Api.url(`${base}/files`, { path: dest }), file);
        say(`uploaded ${dest}`);
        up.value = "";
        await list();
      });
    });
    // Listed when the tab is first shown (the sandbox may not be running).
    pane.addEventListener("space:show", () => { if (!tbody.childElementCount) list(); }, { once: true });
  }

  // ---- admin ----

  async function keysPage(signal) {
    const tbody = el("tbody", { id: "key-rows" });
    const tenant = el("input", { id: "k-tenant", required: true, placeholder: "tenant", "aria-label": "tenant",
      pattern: "[a-z0-9][a-z0-9_\\-]{0,63}" });
    const name = el("input", { id: "k-name", placeholder: "name", "aria-label": "name" });
    const admin = el("input", { id: "k-admin", type: "checkbox" });
    const made = el("div", { id: "new-key" });
    const form = el("form", { id: "key-form", className: "card" }, el("h2", {}, "New key"),
      tenant, name, el("label", {}, admin, " admin"), el("button", { type: "submit" }, "Create"), made);
    main.replaceChildren(el("h1", {}, "API keys"), form,
      el("table", { id: "keys" }, el("thead", {}, el("tr", {}, ["id", "tenant", "name", "admin",
        "created", "last used", "revoked", ""].map((h) => el("th", {}, h)))), tbody));
    const load = () => act(null, async () => {
      const r = await Api.call("GET", "/v1/keys", undefined, { signal });
      const f = document.createDocumentFragment();
      for (const k of r.keys)
        f.appendChild(el("tr", { className: k.revoked_at ? "revoked" : "" },
          el("td", {}, k.id), el("td", {}, k.tenant), el("td", {}, k.name),
          el("td", {}, k.admin ? "yes" : ""), el("td", {}, time(k.created_at)),
          el("td", {}, time(k.last_used_at)), el("td", {}, time(k.revoked_at)),
          el("td", {}, k.revoked_at ? null : el("button", { type: "button", onclick: async (ev) => {
            if (!confirm(`Revoke key ${k.id} (${k.tenant})?`)) return;
            if (await act(ev.currentTarget, () => Api.call("DELETE", `/v1/keys/${Api.seg(k.id)}`).then(() => true)))
              load();
          } }, "Revoke"))));
      tbody.replaceChildren(f);
      if (r.truncated) say("the list is truncated (10,000 keys)");
    });
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const body = { tenant: tenant.value.trim(), admin: admin.checked };
      if (name.value.trim()) body.name = name.value.trim();
      const k = await act(ev.submitter, () => Api.call("POST", "/v1/keys", body, { signal }));
      if (!k) return;
      // Shown once, here only; the page keeps it nowhere else.
      made.replaceChildren(el("p", {}, "The new key, shown only now: copy it."),
        el("code", { className: "secret" }, k.key));
      tenant.value = "";
      name.value = "";
      load();
    });
    await load();
  }

  function platformsPage() {
    main.replaceChildren(el("h1", {}, "Platforms"), el("div", { className: "card" },
      el("p", {}, "Internal platforms create sandboxes over the bus with signed events " +
        "(docs/platforms.md). The gateway has no HTTP API for them, so this page cannot list " +
        "or change them. On the operator's host:"),
      el("pre", {}, "space platform ls\nspace platform add <name>\nspace platform publish ..."),
      el("p", {}, "Their sandboxes appear in the sandbox list under their tenant, and their " +
        "refused requests as SandboxRequestRejected events.")));
  }

  // ---- routing ----

  async function show() {
    if (page) page.abort.abort();
    page = { abort: new AbortController() };
    const signal = page.abort.signal;
    say("");
    const parts = location.hash.replace(/^#\/?/, "").split("/").map((x) => {
      try { return decodeURIComponent(x); } catch (_) { return ""; }
    });
    if (!Api.key()) return loginPage();
    if (parts[0] === "login") return loginPage();
    nav.hidden = false;
    if (!adminProbed) probeAdmin();
    for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", a.dataset.nav === parts[0] ||
      (parts[0] === "admin" && a.dataset.nav === parts[1]));
    if (parts[0] === "sandbox" && parts[1]) {
      const tab = ["events", "timeline", "commands", "files", "network"].includes(parts[2]) ? parts[2] : "events";
      return sandboxPage(signal, parts[1], tab);
    }
    if (parts[0] === "admin" && parts[1] === "keys") return keysPage(signal);
    if (parts[0] === "admin" && parts[1] === "platforms") return platformsPage();
    if (parts[0] !== "sandboxes") {
      history.replaceState(null, "", "#/sandboxes");
    }
    return sandboxesPage(signal);
  }

  // A tab change within one sandbox's page swaps panes without reopening its streams.
  let current = { id: null };
  function onHash() {
    const m = /^#\/sandbox\/([^/]+)\/([a-z]+)$/.exec(location.hash);
    if (m && current.id === m[1] && document.getElementById(`tab-${m[2]}`)) {
      for (const p of document.querySelectorAll(".pane")) p.hidden = p.id !== `tab-${m[2]}`;
      for (const a of document.querySelectorAll(".tabs a")) a.classList.toggle("active", a.dataset.tab === m[2]);
      document.getElementById(`tab-${m[2]}`).dispatchEvent(new Event("space:show"));
      return;
    }
    current = { id: m ? m[1] : null };
    show().then(() => {
      const shown = document.querySelector(".pane:not([hidden])");
      if (shown) shown.dispatchEvent(new Event("space:show"));
    }).catch((e) => say(errText(e), "error"));
  }

  window.addEventListener("hashchange", onHash);
  window.addEventListener("DOMContentLoaded", onHash);

  // The render functions, for tests/console's responsiveness check (synthetic data only).
  window.spaceConsole = { View, eventLine, timelineRow, gridTable };
})();
