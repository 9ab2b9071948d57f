// Snapshots and fork with the real SDK (e2b@2.51.0; docs/snapshots.md): createSnapshot,
// listSnapshots, Sandbox.create(snapshotId), deleteSnapshot, fork. Run by run.sh (CTest: e2b).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

let sbx
const made = []
before(async () => {
  sbx = await Sandbox.create({ timeoutMs: 600_000 })
})
after(async () => {
  for (const id of [sbx?.sandboxId, ...made]) if (id) await Sandbox.kill(id).catch(() => {})
})

test('a snapshot: both sandboxes made from it have what was written before, none what came after', async () => {
  await sbx.files.write('/home/user/before.txt', 'before')
  const snap = await sbx.createSnapshot({ name: 'e2b-snap' })
  assert.match(snap.snapshotId, /^snp_/)
  assert.deepEqual(snap.names, ['e2b-snap'])
  await sbx.files.write('/home/user/after.txt', 'after')
  const listed = []
  for (const p = sbx.listSnapshots(); p.hasNext;) listed.push(...(await p.nextItems()))
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), JSON.stringify(listed))

  const a = await Sandbox.create(snap.snapshotId)
  const b = await Sandbox.create(snap.snapshotId)
  made.push(a.sandboxId, b.sandboxId)
  assert.notEqual(a.sandboxId, b.sandboxId)
  for (const box of [a, b]) {
    assert.equal(await box.files.read('/home/user/before.txt'), 'before')
    assert.equal(await box.files.exists('/home/user/after.txt'), false)
  }
  await a.files.write('/home/user/mine.txt', 'a')
  assert.equal(await b.files.exists('/home/user/mine.txt'), false)

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  await assert.rejects(Sandbox.create(snap.snapshotId))
})

test('listSnapshots pages: limit per page, x-next-token to the next, each snapshot once', async () => {
  const ids = []
  for (let i = 0; i < 3; i++) ids.push((await sbx.createSnapshot({ name: `paged-${i}` })).snapshotId)
  try {
    const pages = []
    for (const p = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId, limit: 2 }); p.hasNext;) pages.push(await p.nextItems())
    assert.deepEqual(pages.map((pg) => pg.length), [2, 1], JSON.stringify(pages))
    const seen = pages.flat().map((x) => x.snapshotId)
    assert.deepEqual([...seen].sort(), [...ids].sort())
    // One page at a time, by hand: the token is the header, and a deleted boundary is no hole.
    const api = process.env.E2B_API_URL
    const headers = { 'X-API-KEY': process.env.E2B_API_KEY }
    let res = await fetch(`${api}/snapshots?sandboxID=${sbx.sandboxId}&limit=1`, { headers })
    const first = await res.json()
    const token = res.headers.get('x-next-token')
    assert.equal(first.length, 1)
    assert.equal(token, first[0].snapshotID)
    assert.equal(await Sandbox.deleteSnapshot(token), true)
    res = await fetch(`${api}/snapshots?sandboxID=${sbx.sandboxId}&limit=5&nextToken=${token}`, { headers })
    assert.equal(res.status, 200)
    assert.equal(res.headers.get('x-next-token'), null, 'the last page has no token')
    assert.deepEqual((await res.json()).map((x) => x.snapshotID), seen.filter((x) => x !== token))
    res = await fetch(`${api}/snapshots?limit=0`, { headers })
    assert.equal(res.status, 400)
    res = await fetch(`${api}/snapshots?nextToken=..%2F`, { headers })
    assert.equal(res.status, 400)
  } finally {
    for (const id of ids) await Sandbox.deleteSnapshot(id).catch(() => {})
  }
})

test('fork: copies that count on by themselves, each with its own network', async () => {
  // Written aside and renamed over: a reader never meets the file truncated and empty (a CI
  // run once read "" there, counted as 0).
  await sbx.commands.run(
    'n=0; while :; do n=$((n+1)); echo $n > /tmp/c.t; mv /tmp/c.t /tmp/c; sleep 0.2; done',
    { background: true },
  )
  await new Promise((resolve) => setTimeout(resolve, 600))
  const copies = await sbx.fork({ count: 2 })
  assert.equal(copies.length, 2)
  for (const c of copies) {
    assert.ok(!(c instanceof Error), String(c))
    made.push(c.sandboxId)
  }
  const read = async (box) => Number((await box.commands.run('cat /tmp/c')).stdout.trim())
  const first = await Promise.all(copies.map(read))
  await new Promise((resolve) => setTimeout(resolve, 1500))
  const later = await Promise.all(copies.map(read))
  for (let i = 0; i < copies.length; i++) assert.ok(later[i] > first[i], `${first[i]} -> ${later[i]}`)
  // Each its own hostname, its id: the restored kernel had the source's.
  const host = async (box) => (await box.commands.run('hostname')).stdout.trim()
  assert.equal(await host(sbx), sbx.sandboxId)
  for (const c of copies) assert.equal(await host(c), c.sandboxId)
  await copies[0].files.write('/tmp/only-here', 'x')
  assert.equal(await copies[1].files.exists('/tmp/only-here'), false)
})
