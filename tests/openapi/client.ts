// A client generated from the served document (@hey-api/openapi-ts, by run.sh into gen/) and
// nothing else: no hand-written URL, header or JSON shape. It creates a sandbox of template
// tiny, runs `echo hi`, checks the output, and deletes the sandbox. Type-checked by tsc
// against the generated types (a body the document does not allow fails to compile).
import { client } from "./gen/client.gen";
import { createSandbox, deleteSandbox, runCommand } from "./gen/sdk.gen";

declare const process: { env: Record<string, string | undefined>; exitCode?: number };

function check(ok: boolean, what: string, got: unknown): void {
  if (!ok) throw new Error(`${what}: got ${JSON.stringify(got)}`);
}

async function main(): Promise<void> {
  client.setConfig({ baseUrl: process.env.SPACE_API_URL, auth: () => process.env.SPACE_API_KEY });
  const created = await createSandbox({ body: { template: "tiny", timeout_s: 300 } });
  check(created.response.status === 201 && !!created.data, "create", created.error);
  const id = created.data!.id;
  console.log(`created ${id} (${created.data!.state})`);
  try {
    const ran = await runCommand({
      path: { id },
      body: { cmd: "echo hi" },
      headers: { Accept: "application/json" },
    });
    const out = ran.data;
    // 200 is the JSON answer (CommandResult); 202 (CommandAccepted) would be a background one.
    if (ran.response.status !== 200 || !out || !("stdout" in out))
      throw new Error(`run: got ${ran.response.status} ${JSON.stringify(ran.error ?? out)}`);
    check(out.stdout === "hi\n" && out.exit_code === 0, "echo hi", out);
    console.log(`ran echo hi: ${JSON.stringify(out.stdout)}, exit ${out.exit_code}`);
  } finally {
    const deleted = await deleteSandbox({ path: { id } });
    check(deleted.response.status === 204, "delete", deleted.error);
    console.log(`deleted ${id}`);
  }
}

main().catch((e) => {
  console.error(`FAIL: ${e.message}`);
  process.exitCode = 1;
});
