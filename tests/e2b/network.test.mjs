// E2B's network options become our policy, as the SandboxCreateRequested in the event log shows
// (space-replay timeline, next to the test binaries: SPACE_BIN_DIR).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { Sandbox } from 'e2b'

function policyOf (id) {
  const out = execFileSync(`${process.env.SPACE_BIN_DIR}/space-replay`,
    ['timeline', '--sandbox', id, '--json'], { encoding: 'utf8' })
  const first = JSON.parse(out.split('\n')[0])
  return first.event.sandbox_create_requested.network
}

const cases = [
  [{ allowInternetAccess: false }, { mode: 'deny_all', allow: [], deny: [] }],
  [{ allowInternetAccess: true, network: { denyOut: ['10.0.0.0/8'] } }, { mode: 'allow_all', allow: [], deny: ['10.0.0.0/8'] }],
  [{ network: { allowOut: ['example.com', '203.0.113.0/24'], denyOut: ['0.0.0.0/0'] } }, { mode: 'allowlist', allow: ['example.com', '203.0.113.0/24'], deny: [] }],
  [{}, { mode: 'deny_all', allow: [], deny: [] }] // the gateway's network-default
]

// E2B has no bandwidth options: no per-sandbox limit (0), so the platform default applies.
const unlimited = { up_bytes_per_s: 0, down_bytes_per_s: 0 }

for (const [opts, want] of cases) {
  test(`network ${JSON.stringify(opts)} -> ${want.mode}`, { skip: !process.env.SPACE_BIN_DIR && 'needs SPACE_BIN_DIR' }, async () => {
    const sbx = await Sandbox.create({ template: 'tiny', ...opts })
    try {
      assert.deepEqual(policyOf(sbx.sandboxId), { ...want, ...unlimited })
    } finally {
      await sbx.kill()
    }
  })
}
