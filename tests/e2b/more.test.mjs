// Issue 19, the rest of E2B's lifecycle surface, with the real SDK (e2b@2.51.0): getMetrics
// (the worker's usage samples, E2B's shape and ours), autoPause (lifecycle.onTimeout 'pause'),
// updateNetwork (enforced by egressd: seen through its DNS answers, nothing leaves the host),
// pause {memory: false} (refused: a pause here always keeps memory).
// Run by run.sh (CTest: e2b).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const MiB = 1024 * 1024

async function ours (path) {
  const res = await fetch(`${API}${path}`, { headers: { Authorization: `Bearer ${KEY}` } })
  return { status: res.status, body: await res.json() }
}

// 128 MiB written (so the pages are really charged), then 6 s of a busy loop: the worker of
// this test's stack samples every 2 s (SPACE_SAMPLE_MS, tests/CMakeLists.txt), so at least two
// samples fall inside the work.
// 64 MiB written to /tmp first: the guest's page cache (memCache, which the host cannot see).
const WORK = 'head -c 67108864 /dev/zero > /tmp/cache64 && ' +
  'python3 -c "import time\na = bytearray(b\'x\' * (128 << 20))\nt = time.time()\n' +
  'while time.time() - t < 6: pass\nprint(len(a))"'

test('getMetrics: non-zero CPU and memory after work, in E2B\'s shape; ours the same', { timeout: 180_000 }, async (t) => {
  const box = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const t0 = new Date()
    const run = await box.commands.run(WORK, { timeoutMs: 60_000 })
    assert.equal(run.stdout.trim(), String(128 * MiB))
    let metrics = []
    for (let i = 0; i < 30; i++) {
      metrics = await box.getMetrics()
      if (metrics.some((m) => m.cpuUsedPct > 20) && metrics.some((m) => m.memUsed > 128 * MiB) &&
        metrics.some((m) => m.memCache >= 64 * MiB)) break
      await sleep(1000)
    }
    assert.ok(metrics.length > 0, 'samples')
    const busy = metrics.filter((m) => m.cpuUsedPct > 20)
    assert.ok(busy.length > 0, `a sample with the busy loop's CPU: ${JSON.stringify(metrics)}`)
    assert.ok(metrics.some((m) => m.memUsed > 128 * MiB), `a sample with the 128 MiB: ${JSON.stringify(metrics)}`)
    assert.ok(metrics.some((m) => m.memCache >= 64 * MiB), `a sample with the 64 MiB cached: ${JSON.stringify(metrics)}`)
    for (const m of metrics) {
      assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()), 'timestamp')
      assert.ok(m.timestamp.getTime() > t0.getTime() - 120_000 && m.timestamp.getTime() < Date.now() + 5_000)
      assert.ok(m.cpuCount >= 1, 'cpuCount')
      assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, 'cpuUsedPct')
      assert.equal(m.memTotal, 512 * MiB, 'memTotal: the sandbox\'s memory_mb')
      assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed}`)
      assert.ok(m.memCache === undefined || (m.memCache >= 0 && m.memCache <= m.memTotal), `memCache ${m.memCache}`)
      assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)
    }
    const top = busy.reduce((a, m) => (m.cpuUsedPct > a.cpuUsedPct ? m : a))
    t.diagnostic(`${metrics.length} samples; busiest: cpu ${top.cpuUsedPct}% of ${top.cpuCount}, mem ${(top.memUsed / MiB).toFixed(0)}/${top.memTotal / MiB} MiB, disk ${(top.diskUsed / MiB).toFixed(1)}/${top.diskTotal / MiB} MiB; cache up to ${(Math.max(...metrics.map((m) => m.memCache ?? 0)) / MiB).toFixed(0)} MiB`)
    for (let i = 1; i < metrics.length; i++) assert.ok(metrics[i].timestamp >= metrics[i - 1].timestamp, 'oldest first')

    // start and end (Unix seconds): a window in the future has nothing; one around the work has the busy sample.
    assert.deepEqual(await box.getMetrics({ start: new Date(Date.now() + 3_600_000) }), [])
    const windowed = await box.getMetrics({ start: new Date(busy[0].timestamp.getTime() - 1000), end: new Date(busy[0].timestamp.getTime() + 1000) })
    assert.ok(windowed.some((m) => m.cpuUsedPct === busy[0].cpuUsedPct), 'the busy sample is inside its window')
    assert.ok(windowed.length < metrics.length || metrics.length === 1, 'the window leaves the others out')

    // Ours: the same samples in our JSON.
    const { status, body } = await ours(`/v1/sandboxes/${box.sandboxId}/metrics`)
    assert.equal(status, 200)
    assert.equal(body.sandbox_id, box.sandboxId)
    assert.equal(body.state, 'running')
    assert.ok(body.samples.some((s) => s.cpu_used_pct > 20), JSON.stringify(body))
    assert.ok(body.samples.some((s) => s.memory_used_bytes > 128 * MiB))
    assert.ok(body.samples.some((s) => s.memory_cache_bytes >= 64 * MiB), JSON.stringify(body))
    assert.ok(body.samples.every((s) => s.memory_total_bytes === 512 * MiB && s.cpu_count >= 1 && typeof s.at === 'string'))
    const bad = await ours(`/v1/sandboxes/${box.sandboxId}/metrics?start=yesterday`)
    assert.equal(bad.status, 400)
    assert.equal((await ours('/v1/sandboxes/sbx_none/metrics')).status, 404)

    // Paused (our suspend): the SDK gets a list, not an error.
    assert.equal(await box.pause(), true)
    assert.deepEqual(await box.getMetrics(), [])
    const paused = await ours(`/v1/sandboxes/${box.sandboxId}/metrics`)
    assert.equal(paused.status, 200)
    assert.deepEqual(paused.body.samples, [])
  } finally {
    await Sandbox.kill(box.sandboxId).catch(() => {})
  }
  // Killed: E2B's not-found.
  await assert.rejects(Sandbox.getMetrics(box.sandboxId), (e) => e.name === 'SandboxNotFoundError')
})

const waitState = async (id, want, ms) => {
  let info
  for (const t0 = Date.now(); Date.now() - t0 < ms; await sleep(1000)) {
    info = await Sandbox.getInfo(id)
    if (info.state === want) return info
  }
  return info
}

test('autoPause: at its timeout the sandbox is paused, not killed; connect brings back its files and processes', { timeout: 240_000 }, async () => {
  const plain = await Sandbox.create({ template: 'tiny' })
  try {
    assert.equal((await Sandbox.getInfo(plain.sandboxId)).lifecycle.onTimeout, 'kill')
  } finally {
    await plain.kill()
  }

  const box = await Sandbox.create({ timeoutMs: 10_000, lifecycle: { onTimeout: 'pause' } })
  try {
    assert.equal((await Sandbox.getInfo(box.sandboxId)).lifecycle.onTimeout, 'pause')
    await box.files.write('/home/user/kept.txt', 'kept across the pause')
    await box.commands.run("sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 1; done'", { background: true })
    await sleep(2000)
    const info = await waitState(box.sandboxId, 'paused', 120_000)
    assert.equal(info.state, 'paused', 'the timeout paused it')
    // Still listed (a kill would have removed it), and still paused a while later.
    const listed = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === box.sandboxId), 'listed as paused')

    const back = await Sandbox.connect(box.sandboxId, { timeoutMs: 120_000 })
    assert.equal((await Sandbox.getInfo(box.sandboxId)).state, 'running')
    assert.equal(await back.files.read('/home/user/kept.txt'), 'kept across the pause')
    const n1 = Number((await back.files.read('/tmp/n')).trim())
    await sleep(2500)
    const n2 = Number((await back.files.read('/tmp/n')).trim())
    assert.ok(n1 > 0 && n2 > n1, `the counter runs on after the resume: ${n1} then ${n2}`)
  } finally {
    await Sandbox.kill(box.sandboxId).catch(() => {})
  }
})

test('autoPause: what is not served is refused clearly, before anything is created', async () => {
  await assert.rejects(Sandbox.create({ template: 'tiny', lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }),
    (e) => /autoPauseMemory false is not served/.test(e.message))
  await assert.rejects(Sandbox.create({ template: 'tiny', lifecycle: { onTimeout: 'pause', autoResume: true } }),
    (e) => /autoResume is not served/.test(e.message))
})

// A DNS query from inside the sandbox, to the resolver it has (the firewall sends every DNS
// query to egressd's): the answer's rcode. egressd answers a name its policy denies REFUSED (5)
// itself; an allowed one goes to the stack's upstream, a closed port on loopback (CMakeLists:
// SPACE_UPSTREAM_DNS), which makes it SERVFAIL (2). No query leaves the host either way.
const RCODE = (name) => `python3 - <<'EOF'
import random, socket, struct
q = struct.pack('>HHHHHH', random.randint(0, 65535), 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(p)]) + p.encode() for p in '${name}'.split('.')) + b'\\0' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(15)
ns = next(l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver'))
s.sendto(q, (ns, 53))
print(s.recv(512)[3] & 15)
EOF`

test('updateNetwork: the new policy is what egressd enforces, both ways', { timeout: 180_000 }, async () => {
  const box = await Sandbox.create({ network: { allowOut: ['allowed.space.test'] } })
  try {
    const rcode = async (name) => Number((await box.commands.run(RCODE(name), { timeoutMs: 30_000 })).stdout.trim())
    assert.equal(await rcode('denied.space.test'), 5, 'not in the allowlist: REFUSED by egressd')
    assert.equal(await rcode('allowed.space.test'), 2, 'allowed: asked upstream (SERVFAIL there)')

    await box.updateNetwork({ allowOut: ['denied.space.test'] })
    assert.equal(await rcode('denied.space.test'), 2, 'allowed after the update')
    assert.equal(await rcode('allowed.space.test'), 5, 'the old allowlist is gone')

    await Sandbox.updateNetwork(box.sandboxId, { allowInternetAccess: false })
    assert.equal(await rcode('denied.space.test'), 5, 'deny_all')

    // What is not served is refused, not dropped; a bad entry is refused by our validator.
    await assert.rejects(box.updateNetwork({ egressProxy: { address: 'http://127.0.0.1:3128' } }), /egressProxy is not served/)
    await assert.rejects(box.updateNetwork({ allowOut: ['Not A Host!'] }), /network.allow\[0\]/)
    await assert.rejects(Sandbox.updateNetwork('sbx_none', { allowOut: [] }), (e) => e.name === 'SandboxNotFoundError')
  } finally {
    await Sandbox.kill(box.sandboxId).catch(() => {})
  }
})

test('pause with keepMemory false and connect with onResume reboot are refused with 400; the sandbox runs on', async () => {
  const box = await Sandbox.create({ template: 'tiny' })
  try {
    await assert.rejects(box.pause({ keepMemory: false }), (e) => /memory false .*is not served/.test(e.message) && !(e.name === 'SandboxNotFoundError'))
    assert.equal((await Sandbox.getInfo(box.sandboxId)).state, 'running', 'not paused')
    await assert.rejects(Sandbox.connect(box.sandboxId, { onResume: 'reboot' }), /memory false .*is not served/)
    const raw = await fetch(`${API}/sandboxes/${box.sandboxId}/pause`, { method: 'POST', headers: { 'X-API-KEY': KEY, 'Content-Type': 'application/json' }, body: '{"memory":"no"}' })
    assert.equal(raw.status, 400)
    assert.equal((await raw.json()).code, 400)
    assert.equal((await Sandbox.getInfo(box.sandboxId)).state, 'running')
    // keepMemory true is E2B's default pause: ours.
    assert.equal(await box.pause({ keepMemory: true }), true)
    assert.equal((await Sandbox.getInfo(box.sandboxId)).state, 'paused')
  } finally {
    await Sandbox.kill(box.sandboxId).catch(() => {})
  }
})
