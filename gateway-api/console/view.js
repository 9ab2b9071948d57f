// DOM helpers of the console. Everything that comes from the API (metadata, command output,
// file names, event payloads) enters the page as text: createElement and textContent only,
// never innerHTML, so a payload that looks like markup stays characters on the screen.
"use strict";

const View = (() => {
  // el("td", {className: "x", title: "t", onclick: fn}, "text", node, ...): attributes by
  // property or setAttribute, handlers by addEventListener, children as text or nodes.
  function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on") && typeof v === "function") n.addEventListener(k.slice(2), v);
      else if (k === "className") n.className = v;
      else if (k === "dataset") Object.assign(n.dataset, v);
      else if (k === "text") n.textContent = v;
      else if (k === "value") n.value = v;
      else if (k === "checked" || k === "disabled" || k === "hidden" || k === "selected") n[k] = true;
      else n.setAttribute(k, String(v));
    }
    return append(n, ...children);
  }

  // Appends children (text, nodes, arrays of them; null and false skipped) to n.
  function append(n, ...children) {
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      n.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return n;
  }

  const clear = (n) => n.replaceChildren();

  // RFC 3339 (or microseconds since the epoch) as local "YYYY-MM-DD HH:MM:SS".
  function time(t) {
    if (t === null || t === undefined || t === "") return "";
    const d = typeof t === "number" ? new Date(t / 1000) : new Date(t);
    if (Number.isNaN(d.getTime())) return String(t);
    const p = (x) => String(x).padStart(2, "0");
    return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ` +
      `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  }

  // A bounded, batched view of a stream of lines or rows (command output, events): push()
  // only queues; once per animation frame the queue becomes one DocumentFragment, and the
  // oldest nodes beyond `cap` are removed. Thousands of events per second cost one layout per
  // frame and at most `cap` nodes, and the page stays responsive.
  class LiveLog {
    // container gets the nodes; scroller (default: container) is the box that scrolls, e.g.
    // the div around a table whose tbody is the container.
    constructor(container, { cap = 2000, make, scroller } = {}) {
      this.container = container;
      this.scroller = scroller || container;
      this.cap = cap;
      this.make = make || ((x) => el("div", {}, String(x)));
      this.queue = [];
      this.frame = 0;
      this.dropped = 0;
      this.total = 0;
    }

    push(item) {
      this.queue.push(item);
      this.total++;
      // The queue itself is bounded too: what could never be shown is not kept.
      if (this.queue.length > this.cap) {
        this.dropped += this.queue.length - this.cap;
        this.queue.splice(0, this.queue.length - this.cap);
      }
      if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
    }

    flush() {
      this.frame = 0;
      if (!this.queue.length) return;
      const c = this.container;
      const sc = this.scroller;
      const stick = sc.scrollTop + sc.clientHeight >= sc.scrollHeight - 4;
      const f = document.createDocumentFragment();
      for (const item of this.queue) f.appendChild(this.make(item));
      this.queue = [];
      c.appendChild(f);
      let over = c.childElementCount - this.cap;
      this.dropped += Math.max(over, 0);
      while (over-- > 0) c.firstElementChild.remove();
      if (stick) sc.scrollTop = sc.scrollHeight;
    }

    // Renders what is queued now, without waiting for a frame (tests, tab switches).
    flushNow() {
      if (this.frame) cancelAnimationFrame(this.frame);
      this.flush();
    }

    reset() {
      if (this.frame) cancelAnimationFrame(this.frame);
      this.frame = 0;
      this.queue = [];
      this.dropped = 0;
      this.total = 0;
      clear(this.container);
    }
  }

  // The sandbox table's rows, built off-document in one fragment and swapped in at once.
  function sandboxRows(tbody, sandboxes, actionsFor) {
    const f = document.createDocumentFragment();
    for (const s of sandboxes) {
      const meta = Object.entries(s.metadata || {}).map(([k, v]) => `${k}=${v}`).join(", ");
      f.appendChild(el("tr", { dataset: { id: s.id, state: s.state } },
        el("td", {}, el("a", { href: `#/sandbox/${encodeURIComponent(s.id)}/events` }, s.id)),
        el("td", {}, s.template),
        el("td", {}, el("span", { className: `state state-${s.state}`, text: s.state })),
        el("td", {}, time(s.created_at)),
        el("td", { className: "meta" }, meta),
        el("td", { className: "actions" }, actionsFor ? actionsFor(s) : [])));
    }
    tbody.replaceChildren(f);
  }

  return { el, append, clear, time, LiveLog, sandboxRows };
})();
