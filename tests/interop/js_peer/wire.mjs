// swarm's wire format (protocol 4), written from docs/wire.md alone: peer ids, the
// signing input, sealing and opening envelopes, and the payload schemas. Nothing here
// calls or ports swarm's Python; Ed25519 and SHA-2 are node's own crypto module and
// msgpack is @msgpack/msgpack.
import { createHash, createPrivateKey, createPublicKey, sign, verify } from 'node:crypto'
import { decode, encode } from '@msgpack/msgpack'

export const VERSION = 5
export const KINDS = ['hello', 'rollouts', 'delta', 'chunk']
const DOMAIN = Buffer.from('swarm/envelope/v3\0', 'latin1')
const MAX_WIRE_INT = 2n ** 53n - 1n
const MSGPACK = { useBigInt64: true } // task seeds are 63-bit: read them as BigInt

export class Refused extends Error {
  constructor (reason, detail = '') {
    super(`${reason}${detail ? ': ' + detail : ''}`)
    this.reason = reason
  }
}

export const sha256 = (bytes) => createHash('sha256').update(bytes).digest()
export const sha512 = (bytes) => createHash('sha512').update(bytes).digest()

// ---- base58btc (the Bitcoin alphabet) ------------------------------------------------
const ALPHABET = '123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz'

export function base58Encode (bytes) {
  let n = 0n
  for (const b of bytes) n = n * 256n + BigInt(b)
  let out = ''
  while (n > 0n) { out = ALPHABET[Number(n % 58n)] + out; n /= 58n }
  for (const b of bytes) { if (b !== 0) break; out = '1' + out }
  return out
}

export function base58Decode (text) {
  let n = 0n
  for (const ch of text) {
    const digit = ALPHABET.indexOf(ch)
    if (digit < 0) throw new Refused('bad_sender', 'not base58')
    n = n * 58n + BigInt(digit)
  }
  const bytes = []
  while (n > 0n) { bytes.unshift(Number(n % 256n)); n /= 256n }
  for (const ch of text) { if (ch !== '1') break; bytes.unshift(0) }
  return Uint8Array.from(bytes)
}

// ---- keys and peer ids ----------------------------------------------------------------
// A libp2p peer id of an Ed25519 key: base58btc of the identity multihash (0x00, length)
// of the protobuf PublicKey {Type = 1 (Ed25519), Data = 32 bytes}.
const PROTOBUF_ED25519 = Uint8Array.from([0x08, 0x01, 0x12, 0x20])
const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex')
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex')

export function peerIdOf (publicKey) {
  const proto = Buffer.concat([PROTOBUF_ED25519, publicKey])
  return base58Encode(Buffer.concat([Uint8Array.from([0x00, proto.length]), proto]))
}

export function publicKeyOf (peerId) {
  const mh = base58Decode(peerId)
  if (mh.length !== 38 || mh[0] !== 0x00 || mh[1] !== 36) {
    throw new Refused('bad_sender', 'not an identity multihash of an Ed25519 key')
  }
  const proto = mh.subarray(2)
  if (!PROTOBUF_ED25519.every((b, i) => proto[i] === b)) {
    throw new Refused('bad_sender', 'not an Ed25519 public key')
  }
  return Buffer.from(proto.subarray(4))
}

export class Identity {
  constructor (seed) {
    if (seed.length !== 32) throw new Error('an Ed25519 seed is 32 bytes')
    this.seed = Buffer.from(seed)
    this.privateKey = createPrivateKey({
      key: Buffer.concat([PKCS8_ED25519, this.seed]), format: 'der', type: 'pkcs8'
    })
    const spki = createPublicKey(this.privateKey).export({ format: 'der', type: 'spki' })
    this.publicKey = Buffer.from(spki.subarray(spki.length - 32))
    this.peerId = peerIdOf(this.publicKey)
  }

  sign (bytes) { return sign(null, bytes, this.privateKey) }
}

export function verifySignature (publicKey, bytes, signature) {
  const key = createPublicKey({
    key: Buffer.concat([SPKI_ED25519, publicKey]), format: 'der', type: 'spki'
  })
  return verify(null, bytes, key, signature)
}

// ---- the signing input ------------------------------------------------------------------
const u8 = (n) => Uint8Array.from([n])
function u16be (n) { const b = Buffer.alloc(2); b.writeUInt16BE(n); return b }
function u64be (n) { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(n)); return b }

export function signingInput ({ version, kind, swarmId, sender, seq, policyVersion, payload }) {
  const k = Buffer.from(kind, 'utf8')
  const s = Buffer.from(swarmId, 'utf8')
  const p = Buffer.from(sender, 'utf8')
  return Buffer.concat([
    DOMAIN, u16be(version), u8(k.length), k, u16be(s.length), s, u8(p.length), p,
    u64be(seq), u64be(policyVersion), sha256(payload)
  ])
}

// ---- envelopes ----------------------------------------------------------------------------
// An integer for the encoder: @msgpack/msgpack 3.1.3 with `useBigInt64` writes a `Number`
// of 2**32 or more as a float64 (which a receiver refuses where an int is due), so such
// values go out as BigInt (uint64); smaller ones as Number (the smallest int format).
export const wireInt = (n) => (BigInt(n) > 0xffffffffn ? BigInt(n) : Number(n))

export function seal (identity, { kind, swarmId, seq, policyVersion, payload }) {
  const fields = { version: VERSION, kind, swarmId, sender: identity.peerId, seq, policyVersion, payload }
  const signature = identity.sign(signingInput(fields))
  return encode(
    [VERSION, kind, swarmId, identity.peerId, wireInt(seq), wireInt(policyVersion), payload,
      signature],
    MSGPACK
  )
}

const isInt = (v) => typeof v === 'bigint' || Number.isSafeInteger(v)

// Decode and verify one envelope (docs/wire.md: size, structure, version, kind,
// signature, then swarm id). Returns the fields, the payload bytes undecoded.
export function openEnvelope (bytes, swarmId, maxBytes = 1 << 20) {
  if (bytes.length > maxBytes + 1024) throw new Refused('oversize')
  let value
  try { value = decode(bytes, MSGPACK) } catch (err) { throw new Refused('malformed', err.message) }
  if (!Array.isArray(value) || value.length !== 8) throw new Refused('malformed', 'not an 8-array')
  const [version, kind, swarm, sender, seq, policyVersion, payload, signature] = value
  if (!isInt(version) || typeof kind !== 'string' || typeof swarm !== 'string' ||
      typeof sender !== 'string' || !isInt(seq) || !isInt(policyVersion) ||
      !(payload instanceof Uint8Array) || !(signature instanceof Uint8Array)) {
    throw new Refused('malformed', 'field types')
  }
  if (Number(version) !== VERSION) throw new Refused('bad_version', String(version))
  if (!KINDS.includes(kind)) throw new Refused('unknown_kind', kind.slice(0, 32))
  for (const n of [seq, policyVersion]) {
    if (BigInt(n) < 0n || BigInt(n) > MAX_WIRE_INT) throw new Refused('malformed', 'int range')
  }
  const publicKey = publicKeyOf(sender)
  const fields = { version: VERSION, kind, swarmId: swarm, sender, seq, policyVersion, payload }
  if (signature.length !== 64 || !verifySignature(publicKey, signingInput(fields), signature)) {
    throw new Refused('bad_signature')
  }
  if (swarm !== swarmId) throw new Refused('wrong_swarm', swarm.slice(0, 64))
  return { ...fields, seq: BigInt(seq), policyVersion: BigInt(policyVersion), signature }
}

// ---- payloads (exact keys, exact types) -----------------------------------------------------
function exactMap (obj, keys, required = keys) {
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj) || obj instanceof Uint8Array) {
    throw new Refused('bad_payload', 'expected a map')
  }
  const have = Object.keys(obj)
  const unknown = have.filter((k) => !keys.includes(k))
  const missing = required.filter((k) => !have.includes(k))
  if (unknown.length || missing.length) {
    throw new Refused('bad_payload', `unknown ${unknown} missing ${missing}`)
  }
  return obj
}

function need (ok, what) { if (!ok) throw new Refused('bad_payload', what) }
const isStr = (v) => typeof v === 'string'
const isNum = (v) => (typeof v === 'number' && Number.isFinite(v)) || typeof v === 'bigint'
const isNat = (v) => isInt(v) && BigInt(v) >= 0n

export function checkHello (obj) {
  const required = ['model_id', 'model_family', 'policy_version', 'capabilities']
  const m = exactMap(obj, [...required, 'progress'], required)
  need(isStr(m.model_id) && isStr(m.model_family), 'model ids')
  need(isNat(m.policy_version), 'policy_version')
  need(Array.isArray(m.capabilities) && m.capabilities.every(isStr), 'capabilities')
  if (m.progress !== undefined) {
    exactMap(m.progress, ['rounds', 'reward', 'eval'], [])
    need(Object.values(m.progress).every(isNum), 'progress values')
  }
  return m
}

const MAX_LOGPROB_TOKENS = 16 * 1024

// One completion's per-token array: 4 little-endian bytes a token, read by `read`.
function perToken (bytes, name, read) {
  need(bytes instanceof Uint8Array && bytes.length % 4 === 0 &&
    bytes.length <= 4 * MAX_LOGPROB_TOKENS, `${name} entry`)
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const values = []
  for (let i = 0; i < bytes.length; i += 4) values.push(read(view, i))
  return values
}

// One completion's sampler logprobs: little-endian float32, each finite and <= 0.
export function checkLogprobs (bytes) {
  const values = perToken(bytes, 'logprobs', (view, i) => view.getFloat32(i, true))
  need(values.every((v) => Number.isFinite(v) && v <= 0), 'logprobs values')
  return values
}

// One completion's sampled token ids (protocol 5): little-endian uint32.
export function checkTokenIds (bytes) {
  return perToken(bytes, 'token_ids', (view, i) => view.getUint32(i, true))
}

export function checkGroup (obj) {
  const required = ['task', 'prompt', 'completions', 'rewards', 'model_id',
    'policy_version', 'finished']
  const m = exactMap(obj, [...required, 'model_family', 'logprobs', 'token_ids'], required)
  const task = exactMap(m.task, ['source', 'seed', 'index'])
  need(isStr(task.source) && isNat(task.seed) && isNat(task.index), 'task')
  need(isStr(m.prompt) && isStr(m.model_id) && isNat(m.policy_version), 'prompt/model')
  const n = Array.isArray(m.completions) ? m.completions.length : -1
  need(n > 0 && m.completions.every(isStr), 'completions')
  need(Array.isArray(m.rewards) && m.rewards.length === n && m.rewards.every(isNum), 'rewards')
  need(Array.isArray(m.finished) && m.finished.length === n &&
    m.finished.every((f) => typeof f === 'boolean'), 'finished')
  need(m.model_family === undefined || isStr(m.model_family), 'model_family')
  if (m.logprobs !== undefined) {
    need(Array.isArray(m.logprobs) && m.logprobs.length <= n, 'logprobs')
    if (m.logprobs.length > 0) {
      need(m.logprobs.length === n && isStr(m.model_family) && m.model_family !== '',
        'logprobs: one per completion, with model_family')
      m.logprobs.forEach(checkLogprobs)
    }
  }
  if (m.token_ids !== undefined) {
    need(Array.isArray(m.token_ids) && m.token_ids.length <= n, 'token_ids')
    if (m.token_ids.length > 0) {
      need(m.token_ids.length === n && isStr(m.model_family) && m.model_family !== '',
        'token_ids: one per completion, with model_family')
      const ids = m.token_ids.map(checkTokenIds)
      if (m.logprobs !== undefined && m.logprobs.length > 0) {
        need(ids.every((t, i) => 4 * t.length === m.logprobs[i].length),
          'token_ids: as many as logprobs')
      }
    }
  }
  return m
}

export function checkRollouts (obj) {
  const m = exactMap(obj, ['groups'])
  need(Array.isArray(m.groups), 'groups')
  m.groups.forEach(checkGroup)
  return m
}

export function decodePayload (kind, payload) {
  let obj
  try { obj = decode(payload, MSGPACK) } catch (err) { throw new Refused('malformed', err.message) }
  if (kind === 'hello') return checkHello(obj)
  if (kind === 'rollouts') return checkRollouts(obj)
  return obj // delta / chunk: signature verified, contents not used by this peer
}

export const encodePayload = (obj) => encode(obj, MSGPACK)
