// Issue 19, the rest of E2B's lifecycle surface, with the real SDK (e2b@2.51.0): getMetrics
// (the worker's usage samples, E2B's shape and ours), autoPause (lifecycle.onTimeout 'pause').
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

// 128 MiB written (so the pages are really charged), then 12 s of a busy loop: the worker
// samples every 5 s, so at least two samples fall inside the work.
const WORK = 'python3 -c "import time\na = bytearray(b\'x\' * (128 << 20))\nt = time.time()\n' +
  'while time.time() - t < 12: pass\nprint(len(a))"'

test('getMetrics: non-zero CPU and memory after work, in E2B\'s shape; ours the same', { timeout: 180_000 }, async (t) => {
  const box = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const t0 = new Date()
    const run = await box.commands.run(WORK, { timeoutMs: 60_000 })
    assert.equal(run.stdout.trim(), String(128 * MiB))
    let metrics = []
    for (let i = 0; i < 30; i++) {
      metrics = await box.getMetrics()
      if (metrics.some((m) => m.cpuUsedPct > 20) && metrics.some((m) => m.memUsed > 128 * MiB)) break
      await sleep(1000)
    }
    assert.ok(metrics.length > 0, 'samples')
    const busy = metrics.filter((m) => m.cpuUsedPct > 20)
    assert.ok(busy.length > 0, `a sample with the busy loop's CPU: ${JSON.stringify(metrics)}`)
    assert.ok(metrics.some((m) => m.memUsed > 128 * MiB), `a sample with the 128 MiB: ${JSON.stringify(metrics)}`)
    for (const m of metrics) {
      assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()), 'timestamp')
      assert.ok(m.timestamp.getTime() > t0.getTime() - 120_000 && m.timestamp.getTime() < Date.now() + 5_000)
      assert.ok(m.cpuCount >= 1, 'cpuCount')
      assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, 'cpuUsedPct')
      assert.equal(m.memTotal, 512 * MiB, 'memTotal: the sandbox\'s memory_mb')
      assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `memUsed ${m.memUsed}`)
      assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)
    }
    const top = busy.reduce((a, m) => (m.cpuUsedPct > a.cpuUsedPct ? m : a))
    t.diagnostic(`${metrics.length} samples; busiest: cpu ${top.cpuUsedPct}% of ${top.cpuCount}, mem ${(top.memUsed / MiB).toFixed(0)}/${top.memTotal / MiB} MiB, disk ${(top.diskUsed / MiB).toFixed(1)}/${top.diskTotal / MiB} MiB`)
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

  const box = await Sandbox.create({ timeoutMs: 15_000, lifecycle: { onTimeout: 'pause' } })
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
