// The web console in a real browser (CTest "integration.console", via run.sh): Debian's
// chromium, headless, driven by playwright-core, against the fixture's stack. What a user does
// and sees, each step checked on the page itself:
//  - a wrong key is refused: the login form says so and stays, nothing is stored;
//  - the right key logs in; a sandbox is created from the page and its row shows running;
//  - `echo hi` is run from the page and `hi` arrives live (a second command proves the output
//    is shown before the command ends); its events appear in the live view and the timeline;
//  - files are listed and one is downloaded through the page (fetch + blob, with the header);
//  - the network tab shows the policy from the log;
//  - pause and resume from its row, suspend and resume from its page, the state visibly
//    changing; delete from the page; a file uploaded and downloaded again;
//  - XSS probes (metadata, command output, a file name) stay text and never run;
//  - the key is in no requested URL, not in localStorage; no CSP violation, no page error
//    (and a control: an inline script is blocked and the violation listener sees it);
//  - the admin pages: a tenant key made on the keys page (shown once) logs in, sees no admin
//    page and not the admin tenant's sandbox; revoked on the page, it is refused; platforms;
//  - scale: 300 synthetic sandbox rows and 5,000 synthetic events through the page's own
//    render functions (timed and printed; the DOM cap of 2,000 entries is asserted);
//  - a PNG screenshot of every page, paths printed.
// Env: SPACE_API_URL, SPACE_API_KEY (space.env), SPACE_CHROMIUM, SPACE_CONSOLE_OUT.
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const base = process.env.SPACE_API_URL;
const key = process.env.SPACE_API_KEY;
const out = process.env.SPACE_CONSOLE_OUT;
const exe = process.env.SPACE_CHROMIUM || "/usr/bin/chromium";
if (!base || !key || !out) throw new Error("SPACE_API_URL, SPACE_API_KEY and SPACE_CONSOLE_OUT are needed");
if (!/^http:\/\/(127\.0\.0\.1|\[::1\]|localhost):\d+$/.test(base))
  throw new Error(`the stack must be on loopback, not ${base}`);
mkdirSync(out, { recursive: true });

const XSS_META = "<img src=x onerror=window.__xss=1>";
const XSS_OUT = "<script>window.__xss=1</script>";
const t0 = Date.now();
let failed = 0;
let step = "start";
const log = (msg) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${msg}`);
const fail = (msg) => {
  console.error(`FAIL (${step}): ${msg}`);
  failed++;
};
const check = (ok, msg) => (ok ? log(`ok: ${msg}`) : fail(msg));

// Direct API calls, for cleanup and to cross-check what the page claims.
async function api(method, path) {
  const r = await fetch(`${base}${path}`, { method, headers: { authorization: `Bearer ${key}` } });
  return { status: r.status, body: r.status === 204 ? null : await r.json().catch(() => null) };
}

const profile = mkdtempSync(join(tmpdir(), "space-console-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: exe,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  viewport: { width: 1280, height: 900 },
  acceptDownloads: true,
});
context.setDefaultTimeout(30000);

const urls = [];
const pageErrors = [];
const cspConsole = [];
context.on("request", (r) => urls.push(r.url()));
// Every securitypolicyviolation the page sees, kept where the test can read it.
await context.addInitScript(() => {
  window.__csp = [];
  document.addEventListener("securitypolicyviolation", (e) =>
    window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
});
const page = context.pages()[0] ?? (await context.newPage());
page.on("pageerror", (e) => pageErrors.push(String(e)));
page.on("console", (m) => {
  if (/Content Security Policy/i.test(m.text())) cspConsole.push(m.text());
});
page.on("dialog", (d) => d.accept());

let n = 0;
async function shot(name) {
  const file = join(out, `${String(++n).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  console.log(`screenshot: ${file}`);
}

let sandboxId = null;
let tenantKey = null;
try {
  step = "headers";
  const res = await page.goto(`${base}/`);
  const h = res.headers();
  check(res.status() === 200, `GET / answers 200 (${res.status()})`);
  check((h["content-security-policy"] ?? "").includes("script-src 'self'") &&
    (h["content-security-policy"] ?? "").includes("frame-ancestors 'none'"), "GET / has the CSP");
  check(h["x-content-type-options"] === "nosniff" && h["x-frame-options"] === "DENY" &&
    h["referrer-policy"] === "no-referrer" && h["cache-control"] === "no-cache",
  `GET / has nosniff, DENY, no-referrer, no-cache (${h["cache-control"]})`);
  const missing = await fetch(`${base}/console/missing.js`);
  check(missing.status === 404, `an unknown console file is 404 (${missing.status})`);

  step = "wrong key";
  await page.locator("#login").waitFor();
  await shot("login");
  await page.fill("#key", "sk_wrong_console_test_key");
  await page.click("#login button[type=submit]");
  await page.waitForFunction(() => document.getElementById("login-status")?.textContent.length > 0);
  const refused = await page.textContent("#login-status");
  check(/refused/i.test(refused), `a wrong key is refused: "${refused}"`);
  check(await page.isVisible("#login"), "the page stays on the login form");
  check(await page.evaluate(() => sessionStorage.length === 0 && localStorage.length === 0),
    "a refused key is stored nowhere");
  await shot("login-refused");

  step = "login";
  await page.fill("#key", key);
  await page.click("#login button[type=submit]");
  await page.locator("#sandboxes").waitFor();
  check(await page.evaluate(() => location.hash === "#/sandboxes"), "logged in: the sandbox list");
  await page.locator('body[data-admin="yes"] #nav a[data-nav=keys]:not([hidden])').waitFor();
  log("ok: the admin key sees the admin pages");

  step = "create";
  await page.locator("#c-template option[value=tiny]").waitFor({ state: "attached" });
  await page.selectOption("#c-template", "tiny");
  await page.fill("#c-timeout", "600");
  await page.fill("#c-metadata", `probe=${XSS_META}\nowner=console-test`);
  const tc = Date.now();
  await page.click("#c-submit");
  const row = page.locator('#sandbox-rows tr[data-state="running"]', { hasText: "owner=console-test" });
  await row.waitFor({ timeout: 180000 });
  sandboxId = await row.getAttribute("data-id");
  log(`ok: created ${sandboxId} from the page, running after ${Date.now() - tc} ms`);
  const metaText = await row.locator("td.meta").textContent();
  check(metaText.includes(XSS_META), "the metadata XSS probe shows as text");
  check(await page.locator("#sandboxes img").count() === 0, "no <img> element made from metadata");
  await shot("sandboxes");

  step = "pause from the list";
  let t = Date.now();
  await row.locator("button.act-pause").click();
  const pausedRow = page.locator(`#sandbox-rows tr[data-id="${sandboxId}"][data-state="paused"]`);
  await pausedRow.waitFor({ timeout: 120000 });
  log(`ok: paused from its row in ${Date.now() - t} ms`);
  t = Date.now();
  await pausedRow.locator("button.act-resume").click();
  await page.locator(`#sandbox-rows tr[data-id="${sandboxId}"][data-state="running"]`).waitFor({ timeout: 120000 });
  log(`ok: resumed from its row in ${Date.now() - t} ms`);

  step = "filters";
  await page.fill("#f-text", "no-such-sandbox-text");
  check(await page.locator("#sandbox-rows tr").count() === 0, "the text filter hides rows");
  await page.fill("#f-text", "owner=console");
  check(await page.locator("#sandbox-rows tr").count() === 1, "the text filter finds the row");
  await page.fill("#f-text", "");

  step = "detail";
  await page.click(`#sandbox-rows tr[data-id="${sandboxId}"] a`);
  await page.locator("#sandbox-state", { hasText: "running" }).waitFor();
  check(await page.locator("#sandbox-meta").textContent().then((t) => t.includes(XSS_META)),
    "the detail page shows the metadata as text");
  await page.locator("#tab-events .stream-state", { hasText: "open" }).waitFor();
  await shot("sandbox-events");

  step = "command";
  await page.click('.tabs a[data-tab="commands"]');
  await page.fill("#cmd", "echo hi");
  await page.click("#cmd-run");
  await page.locator("#cmd-status[data-exit]").waitFor({ timeout: 60000 });
  check((await page.textContent("#cmd-output")) === "hi\n", `echo hi shows "hi" (${JSON.stringify(await page.textContent("#cmd-output"))})`);
  check((await page.textContent("#cmd-status")).includes("exit code 0"), "exit code 0 shown");
  // Live: the first line is on the page while the command still runs.
  await page.fill("#cmd", "echo hi; sleep 3; echo later");
  await page.click("#cmd-run");
  await page.locator("#cmd-output", { hasText: "hi" }).waitFor({ timeout: 60000 });
  const whileRunning = await page.evaluate(() => ({
    out: document.getElementById("cmd-output").textContent,
    exited: document.getElementById("cmd-status").dataset.exit !== undefined,
    status: document.getElementById("cmd-status").textContent,
  }));
  check(whileRunning.out === "hi\n" && !whileRunning.exited && whileRunning.status.startsWith("running"),
    `"hi" arrives live, before the command ends (${JSON.stringify(whileRunning)})`);
  await page.locator("#cmd-status[data-exit]").waitFor({ timeout: 60000 });
  check((await page.textContent("#cmd-output")) === "hi\nlater\n", "then the rest and the exit");
  // Output that looks like markup stays text; and a file with such a name for the files tab.
  await page.fill("#cmd", `printf '%s\\n' '${XSS_OUT}'; mkdir -p /tmp/console; echo content > /tmp/console/a.txt; ` +
    `touch '/tmp/console/${XSS_META}.txt'; echo err >&2`);
  await page.click("#cmd-run");
  await page.locator("#cmd-status[data-exit]").waitFor({ timeout: 60000 });
  const xssOut = await page.textContent("#cmd-output");
  check(xssOut.includes(XSS_OUT) && xssOut.includes("err"), "command output with <script> shows as text (and stderr)");
  check(await page.locator("#cmd-output script, #cmd-output img").count() === 0, "no element made from command output");
  await shot("sandbox-commands");
  // "Stop following" ends the page's stream, not the command.
  await page.fill("#cmd", "sleep 20");
  await page.click("#cmd-run");
  await page.locator("#cmd-status", { hasText: "running: " }).waitFor();
  await page.click("#cmd-stop");
  await page.locator("#cmd-status", { hasText: "stopped following" }).waitFor();
  const cmds = await api("GET", `/v1/sandboxes/${sandboxId}/commands`);
  const sleeper = (cmds.body?.commands ?? []).find((c) => c.cmd === "sleep 20");
  check(sleeper?.running === true, `stop following leaves the command running (${JSON.stringify(sleeper)})`);

  step = "timeline";
  await page.click('.tabs a[data-tab="timeline"]');
  const reqRow = page.locator('#timeline-rows .row[data-type="CommandRequested"]', { hasText: "echo hi" });
  await reqRow.first().waitFor({ timeout: 30000 });
  await page.locator('#timeline-rows .row[data-type="CommandExited"]').first().waitFor({ timeout: 30000 });
  log("ok: the command's events (CommandRequested \"echo hi\", CommandExited) are in the timeline");
  check(await page.locator('#timeline-rows .row[data-type="SandboxCreateRequested"]').count() === 1,
    "the timeline starts at the sandbox's creation");
  // The long command's facts go to the log as a headed batch (docs/trust.md): the head carries
  // the members' hashes beside its payload, which the page must not show in its place.
  const startedRow = page.locator('#timeline-rows .row[data-type="CommandStarted"]').first();
  await startedRow.waitFor({ timeout: 30000 });
  const startedPayload = await startedRow.locator(".payload").textContent();
  check(startedPayload.includes('"cmd_id"'),
    `a CommandStarted row shows its payload, not its signature's fields (${startedPayload.slice(0, 80)})`);
  check(await page.locator("#live-events .ev", { hasText: "CommandRequested" }).count() >= 1,
    "the live view got the command events as they happened");
  await shot("sandbox-timeline");

  step = "files";
  await page.click('.tabs a[data-tab="files"]');
  await page.fill("#f-path", "/tmp/console");
  await page.click("#files-form button[type=submit]");
  await page.locator("#file-rows tr", { hasText: "a.txt" }).waitFor();
  check(await page.locator("#file-rows tr", { hasText: `${XSS_META}.txt` }).count() === 1,
    "a file name with markup is listed as text");
  const [dl] = await Promise.all([
    page.waitForEvent("download"),
    page.locator("#file-rows tr", { hasText: "a.txt" }).locator("button").click(),
  ]);
  const dlPath = await dl.path();
  check(dl.suggestedFilename() === "a.txt" && readFileSync(dlPath, "utf8") === "content\n",
    `downloaded a.txt through the page (${dl.suggestedFilename()})`);
  await page.setInputFiles("#f-upload", { name: "up.txt", mimeType: "text/plain",
    buffer: Buffer.from("uploaded from the page\n") });
  await page.locator("#file-rows tr", { hasText: "up.txt" }).waitFor();
  const [dl2] = await Promise.all([
    page.waitForEvent("download"),
    page.locator("#file-rows tr", { hasText: "up.txt" }).locator("button").click(),
  ]);
  check(readFileSync(await dl2.path(), "utf8") === "uploaded from the page\n",
    "a file uploaded from the page reads back through the page");
  await shot("sandbox-files");

  step = "network";
  await page.click('.tabs a[data-tab="network"]');
  await page.locator("#policy", { hasText: "mode" }).waitFor();
  log(`ok: network policy shown: ${(await page.textContent("#policy")).replace(/\s+/g, " ")} ` +
    `${await page.textContent("#policy-from")}`);
  await shot("sandbox-network");

  step = "suspend";
  t = Date.now();
  await page.click("#sandbox-head button.act-suspend");
  await page.locator("#sandbox-state", { hasText: /^suspended$/ }).waitFor({ timeout: 180000 });
  log(`ok: suspended from the page in ${Date.now() - t} ms`);
  check((await api("GET", `/v1/sandboxes/${sandboxId}`)).body?.state === "suspended", "the API agrees: suspended");
  await shot("sandbox-suspended");
  step = "resume";
  t = Date.now();
  await page.click("#sandbox-head button.act-resume");
  await page.locator("#sandbox-state", { hasText: /^running$/ }).waitFor({ timeout: 180000 });
  log(`ok: resumed from the page in ${Date.now() - t} ms`);
  await page.click('.tabs a[data-tab="timeline"]');
  await page.locator('#timeline-rows .row[data-type="SandboxPaused"]').waitFor();
  await page.locator('#timeline-rows .row[data-type="SandboxSuspended"]').waitFor();
  await page.locator('#timeline-rows .row[data-type="SandboxResumed"]').nth(1).waitFor();
  log("ok: SandboxPaused, SandboxSuspended and both SandboxResumed in the timeline");

  step = "admin";
  await page.click("#nav a[data-nav=keys]");
  await page.locator("#key-rows tr").first().waitFor();
  log(`ok: keys page lists ${await page.locator("#key-rows tr").count()} key(s)`);
  await shot("admin-keys");
  await page.click("#nav a[data-nav=platforms]");
  await page.locator("h1", { hasText: "Platforms" }).waitFor();
  await shot("admin-platforms");

  step = "keys";
  // A tenant key made on the keys page: shown once; a tenant key sees no admin page and not
  // the other tenant's sandbox; revoked on the page, it is refused at login.
  await page.click("#nav a[data-nav=keys]");
  await page.fill("#k-tenant", "console-t2");
  await page.fill("#k-name", "made by integration.console");
  await page.click("#key-form button[type=submit]");
  await page.locator("#new-key code.secret").waitFor();
  tenantKey = (await page.textContent("#new-key code.secret")).trim();
  check(tenantKey.length > 16 && tenantKey !== key, "a new key is shown once on the keys page");
  await page.locator("#key-rows tr", { hasText: "console-t2" }).waitFor();
  await page.click("#logout");
  await page.fill("#key", tenantKey);
  await page.click("#login button[type=submit]");
  await page.locator("#sandboxes").waitFor();
  await page.waitForFunction(() => document.getElementById("count").textContent !== "");
  check(await page.locator("#sandbox-rows tr").count() === 0, "the tenant key sees none of the other tenant's sandboxes");
  await page.locator("body[data-admin]").waitFor({ state: "attached" });
  check(await page.evaluate(() => document.body.dataset.admin === "no") &&
    await page.locator("#nav a[data-nav=keys]").isHidden(), "the tenant key sees no admin page");
  await shot("tenant-key-sandboxes");
  await page.click("#logout");
  await page.fill("#key", key);
  await page.click("#login button[type=submit]");
  await page.locator("#sandboxes").waitFor();
  await page.click("#nav a[data-nav=keys]");
  const t2 = page.locator("#key-rows tr", { hasText: "console-t2" });
  await t2.locator("button").click();
  await page.locator("#key-rows tr.revoked", { hasText: "console-t2" }).waitFor();
  log("ok: the tenant key revoked on the keys page");
  await page.click("#logout");
  await page.fill("#key", tenantKey);
  await page.click("#login button[type=submit]");
  await page.locator("#login-status", { hasText: "refused" }).waitFor();
  log("ok: the revoked key is refused at login");
  await page.fill("#key", key);
  await page.click("#login button[type=submit]");
  await page.locator("#sandboxes").waitFor();

  step = "scale";
  // The page's own render functions on synthetic data, in the page (measured, not asserted).
  const scale = await page.evaluate(async () => {
    const { View, timelineRow } = window.spaceConsole;
    const table = document.createElement("table");
    table.id = "sandboxes";
    const tbody = document.createElement("tbody");
    table.appendChild(tbody);
    document.body.appendChild(table);
    const rows = Array.from({ length: 300 }, (_, i) => ({
      id: `sbx${i}`, template: "tiny", state: i % 3 ? "running" : "paused",
      created_at: new Date().toISOString(), metadata: { i: String(i), owner: "synthetic" },
    }));
    let t = performance.now();
    View.sandboxRows(tbody, rows, () => []);
    tbody.getBoundingClientRect();
    const rowsMs = performance.now() - t;
    const rowCount = tbody.childElementCount;
    table.remove();

    // 5,000 events at 100 per frame into each live view as the page builds it: the live
    // events (lines in a .log box) and the timeline (a grid). The work per frame (building,
    // appending and trimming nodes, and the layout that scrolling forces) is timed apart
    // from waiting for frames, which a headless browser paces as it likes.
    const feed = async (container, scroller, make) => {
      document.body.appendChild(scroller);
      const live = new View.LiveLog(container, { make, scroller });
      let work = 0;
      let flushes = 0;
      let longest = 0;
      const flush = live.flush.bind(live);
      live.flush = () => {
        const s = performance.now();
        flush();
        const d = performance.now() - s;
        work += d;
        flushes++;
        longest = Math.max(longest, d);
      };
      const start = performance.now();
      for (let b = 0; b < 50; b++) {
        for (let i = 0; i < 100; i++) {
          const seq = b * 100 + i + 1;
          live.push({ seq, status: "accepted", event: { type: "CommandOutput", actor: "svc:worker",
            occurred_at_us: Date.now() * 1000, command_output: { cmd_id: "c", data: "x".repeat(200) } } });
        }
        await new Promise((r) => requestAnimationFrame(r));
      }
      live.flushNow();
      const kept = container.childElementCount;
      scroller.remove();
      return { ms: performance.now() - start, work, flushes, longest, kept };
    };
    const box = document.createElement("div");
    box.className = "log";
    const events = await feed(box, box, window.spaceConsole.eventLine);
    const g = window.spaceConsole.gridTable("scale-timeline", ["seq", "time", "type", "actor", "status", "payload"]);
    const grid = await feed(g.body, g.scroller, timelineRow);
    return { rowsMs, rowCount, events, grid };
  });
  const fmt = (x) => `${x.flushes} flushes in ${x.ms.toFixed(0)} ms of frames, ${x.work.toFixed(1)} ms ` +
    `of DOM work, longest flush ${x.longest.toFixed(1)} ms`;
  log(`scale (measured, not asserted): 300 sandbox rows rendered in ${scale.rowsMs.toFixed(1)} ms; ` +
    `5,000 events into the live view: ${fmt(scale.events)}; into the timeline: ${fmt(scale.grid)}`);
  check(scale.rowCount === 300, `300 rows rendered (${scale.rowCount})`);
  check(scale.events.kept === 2000 && scale.grid.kept === 2000,
    `the live view and the timeline keep the last 2,000 of 5,000 (${scale.events.kept}, ${scale.grid.kept})`);

  step = "delete";
  await page.goto(`${base}/#/sandbox/${sandboxId}/events`);
  await page.locator("#sandbox-head button.act-delete").click();
  await page.locator("#sandboxes").waitFor({ timeout: 120000 });
  await page.waitForFunction((id) => !document.querySelector(`#sandbox-rows tr[data-id="${id}"]`), sandboxId);
  const gone = await api("GET", `/v1/sandboxes/${sandboxId}`);
  check(gone.status === 404 || gone.body?.state === "deleted", `deleted from the page (API: ${gone.status} ${gone.body?.state ?? ""})`);
  if (gone.status === 404 || gone.body?.state === "deleted") sandboxId = null;
  await shot("sandboxes-after-delete");

  step = "secrets";
  check(await page.evaluate(() => window.__xss === undefined), "no XSS probe ran (window.__xss undefined)");
  const secrets = [key, tenantKey].filter(Boolean);
  const leaked = urls.filter((u) => secrets.some((k) => u.includes(k) || u.includes(encodeURIComponent(k))));
  check(leaked.length === 0, `no key is in any of the ${urls.length} requested URLs`);
  const stores = await page.evaluate((k) => ({
    local: localStorage.length,
    localHas: Object.values(localStorage).some((v) => k.some((x) => v.includes(x))),
    session: sessionStorage.length,
  }), secrets);
  check(stores.local === 0 && !stores.localHas, "nothing in localStorage");
  check(stores.session === 1, "the key is in sessionStorage (one entry)");
  const csp = await page.evaluate(() => window.__csp);
  check(csp.length === 0 && cspConsole.length === 0, `no CSP violation (${JSON.stringify([...csp, ...cspConsole])})`);
  check(pageErrors.length === 0, `no page error (${JSON.stringify(pageErrors)})`);
  // The control: an inline script is refused by the CSP and the listener sees it, so the
  // checks above could have failed.
  const control = await page.evaluate(async () => {
    const sc = document.createElement("script");
    sc.textContent = "window.__inline = 1";
    document.body.appendChild(sc);
    await new Promise((r) => setTimeout(r, 200));
    return { ran: window.__inline !== undefined, seen: window.__csp.length };
  });
  check(!control.ran && control.seen > 0,
    `control: an inline script is blocked and reported (${JSON.stringify(control)})`);

  step = "logout";
  await page.click("#logout");
  await page.locator("#login").waitFor();
  check(await page.evaluate(() => sessionStorage.length === 0), "logging out forgets the key");
} catch (e) {
  fail(e.stack || String(e));
  await shot("failure").catch(() => {});
} finally {
  if (sandboxId) await api("DELETE", `/v1/sandboxes/${sandboxId}`).catch(() => {});
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}

log(`${failed ? `${failed} failure(s)` : "all console checks passed"}`);
process.exit(failed ? 1 : 0);
