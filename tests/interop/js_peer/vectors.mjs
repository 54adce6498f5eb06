// Checks this peer's wire code against the test vectors in docs/wire.md: for each vector,
// the peer id derived from the seed, the signing input, the (deterministic) signature, the
// envelope this code seals, and that the published envelope opens; and that a corrupted
// signature or payload is refused as `bad_signature`. Prints one JSON line; exit 1 on a
// failure. Usage: node vectors.mjs <path to docs/wire.md>
import { readFileSync } from 'node:fs'
import {
  Identity, Refused, decodePayload, openEnvelope, seal, signingInput, VERSION
} from './wire.mjs'

export function parseVectors (markdown) {
  const blocks = [...markdown.matchAll(/```text\n([\s\S]*?)```/g)].map((m) => m[1])
  return blocks.filter((b) => b.startsWith('vector:')).map((block) => Object.fromEntries(
    block.trim().split('\n').map((line) => {
      const at = line.indexOf(': ')
      return [line.slice(0, at), line.slice(at + 2).trim()]
    })
  ))
}

function refusal (fn) {
  try { fn(); return null } catch (err) {
    if (err instanceof Refused) return err.reason
    throw err
  }
}

export function checkVectors (markdown) {
  const results = []
  for (const v of parseVectors(markdown)) {
    const hex = (s) => Buffer.from(s, 'hex')
    const identity = new Identity(hex(v.private_key_seed))
    const fields = {
      version: VERSION,
      kind: v.kind,
      swarmId: v.swarm_id,
      sender: identity.peerId,
      seq: BigInt(v.seq),
      policyVersion: BigInt(v.policy_version),
      payload: hex(v.payload)
    }
    const input = signingInput(fields)
    const sealed = Buffer.from(seal(identity, fields))
    const envelope = hex(v.envelope)
    const badSignature = Buffer.from(envelope)
    badSignature[badSignature.length - 1] ^= 0x01
    const badPayload = Buffer.from(envelope)
    badPayload[envelope.indexOf(hex(v.payload)) + 3] ^= 0x01
    let opened = null
    const openRefusal = refusal(() => {
      opened = openEnvelope(envelope, v.swarm_id)
      decodePayload(opened.kind, opened.payload)
    })
    results.push({
      vector: v.vector,
      peer_id: identity.peerId === v.peer_id,
      signing_input: input.toString('hex') === v.signing_input,
      signature: identity.sign(input).toString('hex') === v.signature,
      sealed_envelope: sealed.equals(envelope),
      opens: openRefusal === null && opened.sender === v.peer_id,
      corrupted_signature_refused: refusal(() => openEnvelope(badSignature, v.swarm_id)) === 'bad_signature',
      corrupted_payload_refused: refusal(() => openEnvelope(badPayload, v.swarm_id)) === 'bad_signature',
      wrong_swarm_refused: refusal(() => openEnvelope(envelope, 'another-swarm')) === 'wrong_swarm'
    })
  }
  return results
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const results = checkVectors(readFileSync(process.argv[2], 'utf8'))
  const ok = results.length > 0 && results.every((r) => Object.values(r).every((x) => x !== false))
  console.log(JSON.stringify({ event: 'vectors', ok, results }))
  process.exit(ok ? 0 : 1)
}
