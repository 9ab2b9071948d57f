// Every documented route answers as documented, against a live gateway (CTest
// "integration.openapi"). For each (method, path) of the document served at /v1/openapi.json:
// a deliberately simple request (ids that name nothing, the required query parameters, an
// empty JSON object or one byte as the body) must get a status the operation documents,
// never the gateway's unknown-route 404 ("no such route") nor a 405; an error must have the
// documented shape {code, message} and every answer an X-Request-Id. The same request
// without the API key must be 401 on every route the document secures, and answered on the
// ones it says are public.
// Usage: node probe.mjs <api/openapi.json>; SPACE_API_URL and SPACE_API_KEY name the stack.
import { readFileSync } from "node:fs";

const base = process.env.SPACE_API_URL;
const key = process.env.SPACE_API_KEY;
const repoDoc = readFileSync(process.argv[2]);
const METHODS = ["get", "put", "post", "delete", "patch"];
let failed = 0,
  probes = 0;
const fail = (msg) => {
  console.error(`FAIL: ${msg}`);
  failed++;
};

// The document the gateway serves is the repository's, byte for byte, without a key.
const served = await fetch(`${base}/v1/openapi.json`);
const servedBytes = Buffer.from(await served.arrayBuffer());
if (served.status !== 200) fail(`GET /v1/openapi.json: ${served.status}`);
if (!(served.headers.get("content-type") ?? "").startsWith("application/json"))
  fail(`GET /v1/openapi.json: content-type ${served.headers.get("content-type")}`);
if (!servedBytes.equals(repoDoc)) fail("the served document differs from api/openapi.json");
const doc = JSON.parse(servedBytes.toString("utf8"));

const PARAM = { id: "probe-missing", cid: "cmd_probemissing" };
function request(path, op) {
  let url = path.replace(/\{(\w+)\}/g, (_, n) => PARAM[n] ?? "probe");
  const query = (op.parameters ?? [])
    .filter((p) => p.in === "query" && p.required)
    .map((p) => `${p.name}=${p.name === "path" ? "/tmp" : "x"}`);
  if (query.length) url += `?${query.join("&")}`;
  const init = { headers: {} };
  const content = op.requestBody?.content ?? {};
  if (content["application/json"]) {
    init.headers["content-type"] = "application/json";
    init.body = "{}";
  } else if (content["application/octet-stream"]) {
    init.headers["content-type"] = "application/octet-stream";
    init.body = "x";
  }
  return { url, init };
}

// Sends it and reads the head (and a JSON body); an event stream is left after its head.
async function send(method, url, init) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 20000);
  try {
    const res = await fetch(`${base}${url}`, { ...init, method, signal: ac.signal });
    const ctype = res.headers.get("content-type") ?? "";
    let body = null;
    if (ctype.startsWith("application/json")) body = JSON.parse(await res.text());
    return { status: res.status, ctype, body, rid: res.headers.get("x-request-id") };
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
}

for (const [path, item] of Object.entries(doc.paths)) {
  for (const m of METHODS) {
    const op = item[m];
    if (!op) continue;
    const method = m.toUpperCase();
    const name = `${method} ${path}`;
    const secured = (op.security ?? doc.security ?? []).length > 0;
    const { url, init } = request(path, op);
    probes++;
    const r = await send(method, url, {
      ...init,
      headers: { ...init.headers, authorization: `Bearer ${key}` },
    });
    const documented = Object.keys(op.responses);
    if (r.status === 404 && r.body?.message === "no such route")
      fail(`${name}: the gateway does not know this route (404 no such route)`);
    else if (!documented.includes(String(r.status)))
      fail(`${name}: ${r.status} ${JSON.stringify(r.body)} is not among ${documented}`);
    if (!r.rid) fail(`${name}: no X-Request-Id`);
    if (r.status >= 400 && (typeof r.body?.code !== "string" || typeof r.body?.message !== "string"))
      fail(`${name}: error ${r.status} without {code, message}: ${JSON.stringify(r.body)}`);
    console.log(`${name} -> ${r.status}${r.body?.code ? ` ${r.body.code}` : ""}`);

    const anon = await send(method, url, init);
    if (secured && anon.status !== 401) fail(`${name}: ${anon.status} without a key, not 401`);
    if (!secured && anon.status === 401) fail(`${name}: documented as public but answers 401`);
  }
}
console.log(`${probes} routes probed`);
if (probes === 0) fail("the served document has no route");
if (failed) {
  console.error(`${failed} problem(s)`);
  process.exit(1);
}
