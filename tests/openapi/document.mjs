// The document against the code, without a stack (CTest "openapi.document"):
// 1. api/openapi.json is valid OpenAPI 3.1 (@readme/openapi-parser, pinned in package-lock.json);
// 2. its (method, path) pairs are exactly the routes the gateway dispatches: the table
//    route() matches requests against, as `space-gateway --list-routes` prints it. A route
//    served but not documented, or documented but not served, fails with its name.
// Usage: node document.mjs <api/openapi.json> <space-gateway binary>
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { validate } from "@readme/openapi-parser";

const [docPath, gateway] = process.argv.slice(2);
const METHODS = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];
let failed = 0;
const fail = (msg) => {
  console.error(`FAIL: ${msg}`);
  failed++;
};

const doc = JSON.parse(readFileSync(docPath, "utf8"));
if (!/^3\.1\.\d+$/.test(doc.openapi ?? "")) fail(`openapi is ${doc.openapi}, not 3.1.x`);
const result = await validate(structuredClone(doc));
if (!result.valid) fail(`not valid OpenAPI: ${JSON.stringify(result.errors, null, 1)}`);
for (const w of result.warnings ?? []) console.error(`warning: ${JSON.stringify(w)}`);

const documented = new Set();
for (const [path, item] of Object.entries(doc.paths ?? {}))
  for (const m of METHODS) if (item[m]) documented.add(`${m.toUpperCase()} ${path}`);

const served = new Set(
  execFileSync(gateway, ["--list-routes"], { encoding: "utf8" }).split("\n").filter(Boolean),
);
if (served.size === 0) fail("space-gateway --list-routes listed no route");
for (const r of served) if (!documented.has(r)) fail(`served but not in the document: ${r}`);
for (const r of documented) if (!served.has(r)) fail(`documented but not served: ${r}`);

console.log(`${documented.size} documented routes, ${served.size} served`);
if (failed) {
  console.error(`${failed} problem(s)`);
  process.exit(1);
}
console.log("the document is valid OpenAPI 3.1 and matches the gateway's routes");
