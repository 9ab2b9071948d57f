// Signed /files URLs (docs/e2b-signed-urls.md): what the SDK's downloadUrl() and uploadUrl()
// return is fetched with plain fetch and no header at all, as a browser or curl would; with
// E2B_SANDBOX_URL set nothing but the signature says which sandbox is meant.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { readFileSync, readdirSync, existsSync } from 'node:fs'
import { Sandbox } from 'e2b'

const API = process.env.E2B_API_URL
const KEY = process.env.E2B_API_KEY
let sbx, other
const seen = [] // every signature the tests used, searched for in the logs and events at the end

before(async () => {
  [sbx, other] = await Promise.all([
    Sandbox.create({ metadata: { suite: 'e2b-signed' } }),
    Sandbox.create({ metadata: { suite: 'e2b-signed-other' } })
  ])
  await sbx.files.write('/home/user/hello.txt', 'hello from the first sandbox')
  await other.files.write('/home/user/hello.txt', 'hello from the other sandbox')
})
after(async () => {
  await Promise.all([sbx, other].map((s) => s?.kill().catch(() => {})))
})

function signatureOf (url) {
  const sig = new URL(url).searchParams.get('signature')
  assert.match(sig, /^v1_[A-Za-z0-9+/]{43}$/)
  seen.push(sig)
  return sig
}

async function upload (url, name, text) {
  const form = new FormData()
  form.append('file', new Blob([text]), name)
  return fetch(url, { method: 'POST', body: form })
}

test('downloadUrl() opens with plain fetch, with and without an expiration', async () => {
  for (const opts of [{}, { useSignatureExpiration: 10_000 }]) {
    const url = await sbx.downloadUrl('/home/user/hello.txt', opts)
    signatureOf(url)
    assert.equal(new URL(url).searchParams.has('signature_expiration'), 'useSignatureExpiration' in opts)
    const res = await fetch(url)
    assert.equal(res.status, 200, await res.clone().text())
    assert.equal(await res.text(), 'hello from the first sandbox')
  }
  // The parameter's name percent-encoded is the same parameter (and is redacted in the log).
  const odd = (await sbx.downloadUrl('/home/user/hello.txt')).replace('signature=', 'sig%6Eature=')
  signatureOf(odd.replace('sig%6Eature=', 'signature='))
  const r = await fetch(odd)
  assert.equal(r.status, 200)
  assert.equal(await r.text(), 'hello from the first sandbox')
  // A relative path and an explicit user are part of what is signed.
  const url = await sbx.downloadUrl('hello.txt', { user: 'user' })
  assert.equal(new URL(url).searchParams.get('username'), 'user')
  signatureOf(url)
  const res = await fetch(url)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello from the first sandbox')
})

test('uploadUrl() takes a multipart POST with plain fetch, with and without an expiration', async () => {
  let i = 0
  for (const opts of [{}, { useSignatureExpiration: 10_000 }]) {
    const path = `/home/user/up-${i++}.txt`
    const url = await sbx.uploadUrl(path, opts)
    signatureOf(url)
    const res = await upload(url, path.split('/').pop(), `uploaded ${i}`)
    assert.equal(res.status, 200, await res.clone().text())
    const body = await res.json()
    assert.equal(body[0].path, path)
    assert.equal(await sbx.files.read(path), `uploaded ${i}`)
  }
})

test('an expired signature answers E2B\'s exact 401', async () => {
  for (const make of [(o) => sbx.downloadUrl('/home/user/hello.txt', o), (o) => sbx.uploadUrl('/home/user/late.txt', o)]) {
    const url = await make({ useSignatureExpiration: -10_000 })
    signatureOf(url)
    const res = await fetch(url, url.includes('late.txt') ? { method: 'POST', body: new FormData() } : {})
    assert.equal(res.status, 401)
    assert.deepEqual(JSON.parse(await res.text()), { code: 401, message: 'signature is already expired' })
  }
  assert.equal(await sbx.files.exists('/home/user/late.txt'), false)
})

test('a signature opens its own sandbox only', async () => {
  // The same path in both sandboxes: each URL reads its own sandbox's file.
  const mine = await sbx.downloadUrl('/home/user/hello.txt')
  const theirs = await other.downloadUrl('/home/user/hello.txt')
  signatureOf(mine); signatureOf(theirs)
  assert.equal(await (await fetch(theirs)).text(), 'hello from the other sandbox')
  assert.equal(await (await fetch(mine)).text(), 'hello from the first sandbox')
  // Pointed at the other sandbox by name, the first one's signature opens nothing.
  let res = await fetch(mine, { headers: { 'E2b-Sandbox-Id': other.sandboxId } })
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'invalid signature' })
  // Nor does it for another path, or with the path changed.
  const tampered = new URL(mine)
  tampered.searchParams.set('path', '/etc/passwd')
  res = await fetch(tampered)
  assert.equal(res.status, 401)
  assert.equal((await res.json()).message, 'invalid signature')
  // A later expiration than the one signed is another string: refused.
  const timed = new URL(await sbx.downloadUrl('/home/user/hello.txt', { useSignatureExpiration: 60 }))
  signatureOf(timed.href)
  timed.searchParams.set('signature_expiration', String(Number(timed.searchParams.get('signature_expiration')) + 86400))
  res = await fetch(timed)
  assert.equal(res.status, 401)
})

test('a read signature cannot write, a write signature cannot read', async () => {
  const read = await sbx.downloadUrl('/home/user/hello.txt')
  signatureOf(read)
  let res = await upload(read, 'hello.txt', 'overwritten')
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'invalid signature' })
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello from the first sandbox')
  const write = await sbx.uploadUrl('/home/user/hello.txt')
  signatureOf(write)
  res = await fetch(write)
  assert.equal(res.status, 401)
  assert.equal((await res.json()).message, 'invalid signature')
})

test('a key revoked: its sandbox\'s signed URLs stop working', async () => {
  // A key of its own, a sandbox created with it, a URL that works, then the key revoked.
  const auth = { Authorization: `Bearer ${KEY}` }
  const { tenant } = await (await fetch(`${API}/v1/sandboxes/${sbx.sandboxId}`, { headers: auth })).json()
  let res = await fetch(`${API}/v1/keys`, {
    method: 'POST', headers: { ...auth, 'Content-Type': 'application/json' }, body: JSON.stringify({ tenant, name: 'signed-url-test' })
  })
  if (res.status === 403) return // the stack's key is not an admin key: nothing to revoke with
  assert.equal(res.status, 201, await res.clone().text())
  const k = await res.json()
  const s = await Sandbox.create({ apiKey: k.key, metadata: { suite: 'e2b-signed-revoked' } })
  try {
    await s.files.write('/home/user/r.txt', 'r')
    const url = await s.downloadUrl('/home/user/r.txt')
    signatureOf(url)
    assert.equal((await fetch(url)).status, 200)
    res = await fetch(`${API}/v1/keys/${k.id}`, { method: 'DELETE', headers: auth })
    assert.ok(res.status === 200 || res.status === 204, `revoke: ${res.status}`)
    res = await fetch(url)
    assert.equal(res.status, 401)
  } finally {
    await Sandbox.kill(s.sandboxId).catch(() => {})
  }
})

test('no header and no signature: 401 that says what to send; a malformed one: 401', async () => {
  let res = await fetch(`${API}/files?path=/home/user/hello.txt`)
  assert.equal(res.status, 401)
  assert.match((await res.json()).message, /signed URL/)
  res = await fetch(`${API}/files?path=/home/user/hello.txt&signature=v1_short`)
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'invalid signature' })
  res = await fetch(`${API}/files?path=x&signature=v1_x&signature_expiration=soon`)
  assert.equal(res.status, 401)
})

test('signatures appear in neither the gateway\'s log nor the event log', async () => {
  assert.ok(seen.length >= 10)
  // The event log of the sandbox, as its SSE stream serves it (read for 3 s).
  const ctl = new AbortController()
  const res = await fetch(`${API}/v1/sandboxes/${sbx.sandboxId}/events?from=0`, {
    headers: { Authorization: `Bearer ${KEY}` }, signal: ctl.signal
  })
  assert.equal(res.status, 200)
  let events = ''
  const reader = res.body.getReader()
  const timer = setTimeout(() => ctl.abort(), 3000)
  try {
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      events += Buffer.from(value).toString()
    }
  } catch (e) {
    if (e.name !== 'AbortError') throw e
  } finally {
    clearTimeout(timer)
  }
  assert.match(events, /FileWritten/, 'the uploads are in the log')
  // The gateway's log: every file of the stack's log directory.
  const logs = [`${process.env.SPACE_HOME}/log`, `${process.env.SPACE_HOME}/logs`].filter(existsSync)
  assert.ok(logs.length > 0, `no log directory under ${process.env.SPACE_HOME}`)
  let text = ''
  for (const dir of logs) for (const f of readdirSync(dir)) text += readFileSync(`${dir}/${f}`, 'latin1')
  assert.match(text, /signature=REDACTED/, 'the signed requests are logged, their signature redacted')
  assert.match(text, /sig%6Eature=REDACTED/, 'under any spelling of its name')
  for (const sig of seen) {
    // As sent (percent-encoded in the query) and decoded.
    for (const form of [sig, encodeURIComponent(sig), sig.slice(3)]) {
      assert.ok(!events.includes(form), 'a signature in the event log')
      assert.ok(!text.includes(form), 'a signature in the logs')
    }
  }
  assert.ok(!text.includes(sbx.envdAccessToken) && !events.includes(sbx.envdAccessToken), 'the token leaked')
})

test('failed lookups are rate-limited per client: 429 with Retry-After, then served again', async () => {
  const bad = `${API}/files?path=/home/user/hello.txt&signature=v1_${'A'.repeat(43)}`
  const codes = []
  let retryAfter = null
  for (let i = 0; i < 40; i++) {
    const res = await fetch(bad)
    codes.push(res.status)
    if (res.status === 429) {
      retryAfter = res.headers.get('retry-after')
      assert.equal((await res.json()).code, 429)
    } else {
      await res.arrayBuffer()
    }
  }
  assert.ok(codes.includes(401) && codes.includes(429), codes.join(','))
  assert.equal(retryAfter, '1')
  const metrics = await (await fetch(`${API}/metrics`)).text()
  assert.match(metrics, /^space_gateway_signed_url_limited_total [1-9]/m)
  assert.match(metrics, /^space_gateway_signed_url_failures_total [1-9]/m)
  // A good URL is served again once the bucket refilled (10 a second, burst 20).
  const good = await sbx.downloadUrl('/home/user/hello.txt')
  signatureOf(good)
  await new Promise((resolve) => setTimeout(resolve, 2500))
  const res = await fetch(good)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello from the first sandbox')
})
