// Hostile and malformed input on the E2B routes, spoken with fetch: every answer is an error in
// E2B's shape ({code: <status>, message} on the control plane and /files; Connect errors on
// envd), and the gateway keeps serving.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Agent, request } from 'node:http'
import { gzipSync } from 'node:zlib'
import { Sandbox } from 'e2b'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
let sbx

before(async () => { sbx = await Sandbox.create({ metadata: { suite: 'e2b-hostile' } }) })
after(async () => { if (sbx) await sbx.kill().catch(() => {}) })

function envelope (flags, json, lengthOverride) {
  const body = Buffer.from(json)
  const head = Buffer.alloc(5)
  head[0] = flags
  head.writeUInt32BE(lengthOverride ?? body.length, 1)
  return Buffer.concat([head, body])
}

// A Connect stream's frames: [flags, parsed JSON].
function frames (buf) {
  const out = []
  for (let i = 0; i + 5 <= buf.length;) {
    const n = buf.readUInt32BE(i + 1)
    out.push([buf[i], JSON.parse(buf.subarray(i + 5, i + 5 + n).toString())])
    i += 5 + n
  }
  return out
}

function envdHeaders (extra = {}) {
  return { 'X-Access-Token': sbx.envdAccessToken ?? `${sbx.sandboxId}.${KEY}`, 'E2b-Sandbox-Id': sbx.sandboxId, ...extra }
}

async function start (body, headers = envdHeaders()) {
  const res = await fetch(`${API}/process.Process/Start`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1', ...headers },
    body
  })
  return { status: res.status, frames: frames(Buffer.from(await res.arrayBuffer())) }
}

async function expectStreamError (p, code) {
  const r = await p
  assert.equal(r.status, 200, 'a stream answers its error in the end-stream message')
  assert.equal(r.frames.length, 1)
  assert.equal(r.frames[0][0], 2)
  assert.equal(r.frames[0][1].error.code, code)
}

test('control plane: malformed bodies and unknown ids answer {code, message}', async () => {
  const post = (body, key = KEY) => fetch(`${API}/v2/sandboxes`, {
    method: 'POST', headers: { 'X-API-KEY': key, 'Content-Type': 'application/json' }, body
  })
  for (const [body, status] of [['{', 400], ['[]', 400], ['{"templateID": 7}', 400],
    ['{"metadata": {"a": 1}}', 400], ['{"timeout": -1}', 400],
    ['{"network": {"allowOut": "x"}}', 400], ['{"templateID": "BAD ID"}', 400]]) {
    const r = await post(body)
    assert.equal(r.status, status, body)
    const j = await r.json()
    assert.equal(j.code, status)
    assert.equal(typeof j.message, 'string')
  }
  const unauth = await post('{}', 'sk_wrong.key')
  assert.equal(unauth.status, 401)
  assert.equal((await unauth.json()).code, 401)
  const long = await fetch(`${API}/sandboxes/${'x'.repeat(300)}`, { headers: { 'X-API-KEY': KEY } })
  assert.equal(long.status, 404)
  assert.equal((await long.json()).code, 404)
  const list = await fetch(`${API}/v2/sandboxes?metadata=novalue&limit=5`, { headers: { 'X-API-KEY': KEY } })
  assert.equal(list.status, 400)
})

test('control plane: list order, startedAfter and template as E2B serves them', async () => {
  const second = await Sandbox.create({ metadata: { suite: 'e2b-hostile' } })
  try {
    const list = async (q) => {
      const r = await fetch(`${API}/v2/sandboxes?metadata=suite%3De2b-hostile${q}`, { headers: { 'X-API-KEY': KEY } })
      assert.equal(r.status, 200, q)
      return (await r.json()).map((s) => s.sandboxID)
    }
    // Newest first by default, oldest first with order=asc.
    assert.deepEqual(await list(''), [second.sandboxId, sbx.sandboxId])
    assert.deepEqual(await list('&order=desc'), [second.sandboxId, sbx.sandboxId])
    assert.deepEqual(await list('&order=asc'), [sbx.sandboxId, second.sandboxId])
    // Paging follows the order: one at a time, newest first.
    const r = await fetch(`${API}/v2/sandboxes?metadata=suite%3De2b-hostile&limit=1`, { headers: { 'X-API-KEY': KEY } })
    const next = r.headers.get('x-next-token')
    assert.deepEqual((await r.json()).map((s) => s.sandboxID), [second.sandboxId])
    if (next) assert.deepEqual(await list(`&limit=1&nextToken=${next}`), [sbx.sandboxId])
    // startedAfter: the first one's start (+1 ms: the answer's times are in ms) leaves the second.
    const first = (await (await fetch(`${API}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': KEY } })).json()).startedAt
    const after = new Date(Date.parse(first) + 1).toISOString()
    assert.deepEqual(await list(`&startedAfter=${encodeURIComponent(after)}`), [second.sandboxId])
    assert.deepEqual(await list(`&template=base`), [second.sandboxId, sbx.sandboxId])
    assert.deepEqual(await list(`&template=tiny`), [])
    for (const q of ['&order=up', '&startedAfter=yesterday', '&template=BAD%20ID']) {
      const bad = await fetch(`${API}/v2/sandboxes?${q.slice(1)}`, { headers: { 'X-API-KEY': KEY } })
      assert.equal(bad.status, 400, q)
      assert.equal((await bad.json()).code, 400)
    }
  } finally {
    await second.kill()
  }
})

test('envd: broken Connect envelopes are invalid_argument', async () => {
  const msg = JSON.stringify({ process: { cmd: '/bin/true' } })
  await expectStreamError(start(envelope(1, msg)), 'invalid_argument') // compressed
  await expectStreamError(start(envelope(0, msg, msg.length + 10)), 'invalid_argument') // short
  await expectStreamError(start(envelope(0, msg, 0xffffffff)), 'invalid_argument') // huge length
  await expectStreamError(start(Buffer.from([0, 0])), 'invalid_argument') // no header
  await expectStreamError(start(envelope(0, '{"process":')), 'invalid_argument') // bad JSON
  await expectStreamError(start(envelope(0, '{"process":{"cmd":5}}')), 'invalid_argument')
  await expectStreamError(start(Buffer.concat([envelope(0, msg), envelope(0, msg)])), 'invalid_argument')
  // Over max-body-bytes (1 MiB).
  await expectStreamError(start(envelope(0, JSON.stringify({ process: { cmd: 'x'.repeat(2 << 20) } }))), 'invalid_argument')
})

test('envd: routing and keys', async () => {
  const msg = envelope(0, JSON.stringify({ process: { cmd: '/bin/true' } }))
  // An unknown sandbox, named with an API key that is good for its tenant.
  await expectStreamError(start(msg, { 'X-API-KEY': KEY, 'E2b-Sandbox-Id': 'sbx_00000000000000000000000000' }), 'not_found')
  // An access token is the sandbox's own, never "<sandbox>.<API key>", and opens no other sandbox.
  await expectStreamError(start(msg, { 'X-Access-Token': `sbx_00000000000000000000000000.${KEY}` }), 'unauthenticated')
  await expectStreamError(start(msg, { 'X-Access-Token': `${sbx.sandboxId}.${KEY}` }), 'unauthenticated')
  assert.ok(!sbx.envdAccessToken.includes(KEY), 'the access token holds nothing of the API key')
  await expectStreamError(start(msg, { 'X-Access-Token': `sbx_00000000000000000000000000.${KEY}`, 'E2b-Sandbox-Id': sbx.sandboxId }), 'unauthenticated')
  await expectStreamError(start(msg, { 'X-Access-Token': `${sbx.sandboxId}.sk_bad.key` }), 'unauthenticated')
  await expectStreamError(start(msg, {}), 'unauthenticated')
  // The Host header alone names the sandbox (with the key in X-API-KEY); fetch will not set Host.
  const ok = await new Promise((resolve, reject) => {
    const u = new URL(`${API}/process.Process/Start`)
    const req = request({
      host: u.hostname,
      port: u.port,
      path: u.pathname,
      method: 'POST',
      headers: { 'Content-Type': 'application/connect+json', 'X-API-KEY': KEY, Host: `49983-${sbx.sandboxId}.e2b.local` }
    }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, frames: frames(Buffer.concat(chunks)) }))
    })
    req.on('error', reject)
    req.end(msg)
  })
  assert.equal(ok.status, 200)
  assert.ok(ok.frames[0][1].event.start.pid > 0)
  assert.deepEqual(ok.frames.at(-1), [2, {}])

  const unary = (path, body, ct = 'application/json') => fetch(`${API}${path}`, {
    method: 'POST', headers: { 'Content-Type': ct, ...envdHeaders() }, body
  })
  let r = await unary('/process.Process/Nope', '{}')
  assert.equal(r.status, 501)
  assert.equal((await r.json()).code, 'unimplemented')
  r = await unary('/filesystem.Filesystem/Stat', 'nope')
  assert.equal(r.status, 400)
  assert.equal((await r.json()).code, 'invalid_argument')
  r = await unary('/filesystem.Filesystem/Stat', '{"path":"/nope"}', 'application/proto')
  assert.equal((await r.json()).code, 'invalid_argument')
  r = await unary('/process.Process/SendSignal', '{"process":{"pid":1},"signal":"SIGNAL_SIGHUP"}')
  assert.equal((await r.json()).code, 'invalid_argument')
  r = await unary('/process.Process/SendInput', '{"process":{"pid":424242},"input":{"stdin":"aGk="}}')
  assert.equal(r.status, 404)
  assert.equal((await r.json()).code, 'not_found')
})

test('envd: the polling watcher (Python sync SDK) over Connect JSON', async () => {
  const unary = (method, body) => fetch(`${API}/filesystem.Filesystem/${method}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json', ...envdHeaders() }, body: JSON.stringify(body)
  })
  await sbx.files.makeDir('/home/user/polled')
  let r = await unary('CreateWatcher', { path: '/home/user/polled', recursive: false })
  assert.equal(r.status, 200)
  const { watcherId } = await r.json()
  assert.equal(typeof watcherId, 'string')
  await sbx.files.write('/home/user/polled/p.txt', 'x')
  const seen = []
  const found = () => seen.some((e) => e.name === 'p.txt' && e.type === 'EVENT_TYPE_CREATE')
  for (let i = 0; i < 300 && !found(); i++) {
    r = await unary('GetWatcherEvents', { watcherId })
    assert.equal(r.status, 200)
    seen.push(...(await r.json()).events)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  assert.ok(found(), JSON.stringify(seen))
  r = await unary('RemoveWatcher', { watcherId })
  assert.equal(r.status, 200)
  assert.deepEqual(await r.json(), {})
  r = await unary('GetWatcherEvents', { watcherId })
  assert.equal(r.status, 404)
  assert.equal((await r.json()).code, 'not_found')
  r = await unary('GetWatcherEvents', { watcherId: 42 })
  assert.equal(r.status, 400)
  assert.equal((await r.json()).code, 'invalid_argument')
})

test('envd /files: bad uploads are refused in E2B shape', async () => {
  const post = (qs, body, headers) => fetch(`${API}/files${qs}`, { method: 'POST', headers: { ...envdHeaders(), ...headers }, body })
  let r = await post('?path=x.gz', Buffer.from([0x1f, 0x8b]), { 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'br' })
  assert.equal(r.status, 415)
  assert.equal((await r.json()).code, 415)
  r = await post('?path=x.gz', Buffer.from([0x1f, 0x8b, 8, 0, 0]), { 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' })
  assert.equal(r.status, 400, 'a truncated gzip stream')
  assert.equal((await r.json()).code, 400)
  r = await post('?path=bomb', gzipSync(Buffer.alloc(65 << 20)), { 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' })
  assert.equal(r.status, 413, 'a gzip bomb stops at the limit')
  r = await post('?path=a', 'garbage', { 'Content-Type': 'multipart/form-data; boundary=xyz' })
  assert.equal(r.status, 400)
  r = await post('', 'data', { 'Content-Type': 'application/octet-stream' })
  assert.equal(r.status, 400)
  r = await fetch(`${API}/files?path=/etc/nope`, { headers: envdHeaders() })
  assert.equal(r.status, 404)
  assert.equal((await r.json()).code, 404)
  r = await fetch(`${API}/files?path=/etc/hostname&username=nobody`, { headers: envdHeaders() })
  assert.equal(r.status, 400)
})

// What the SDKs' fetch does: a keep-alive connection that carried a streamed response goes back
// to the pool. The gateway must keep it open after the stream's end; closing it then, with no
// "Connection: close" announced, races the client's next request on it ("fetch failed").
function keepAliveRequest (agent, method, path, headers, body) {
  return new Promise((resolve, reject) => {
    const req = request(`${API}${path}`, { method, agent, headers }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks), reused: req.reusedSocket }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

test('a keep-alive connection outlives a streamed response', async () => {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  try {
    const streams = [
      ['POST', '/process.Process/Start', { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1', ...envdHeaders() },
        envelope(0, JSON.stringify({ process: { cmd: '/bin/echo', args: ['hi'] } })), /"exitCode":0/],
      ['POST', `/v1/sandboxes/${sbx.sandboxId}/commands`, { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
        JSON.stringify({ cmd: 'echo hi' }), /"text":"hi\\n"[^]*event: exit/]
    ]
    for (const [method, path, headers, body, want] of streams) {
      const s = await keepAliveRequest(agent, method, path, headers, body)
      assert.equal(s.status, 200, path)
      assert.notEqual(s.headers.connection, 'close', `${path} announces no close`)
      assert.match(s.body.toString(), want, path)
      // Long enough for a FIN sent after the last chunk to arrive and take the socket out.
      await new Promise((resolve) => setTimeout(resolve, 200))
      const next = await keepAliveRequest(agent, 'GET', '/healthz', {}, undefined)
      assert.equal(next.status, 200)
      assert.equal(next.reused, true, `the connection that carried ${path} is used again`)
    }
  } finally {
    agent.destroy()
  }
})

test('the gateway still serves', async () => {
  const r = await fetch(`${API}/healthz`)
  assert.equal(r.status, 200)
  const h = await fetch(`${API}/health`, { headers: envdHeaders() })
  assert.equal(h.status, 204)
  assert.equal((await sbx.commands.run('echo still')).stdout, 'still\n')
})
