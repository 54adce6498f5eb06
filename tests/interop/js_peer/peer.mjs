// An independent swarm peer on js-libp2p GossipSub (see README.md here).
//
// It dials a `swarm join` node, subscribes to the swarm's topics, opens and verifies every
// envelope with its own wire code (wire.mjs, written from docs/wire.md), regenerates the
// node's `digit` tasks and re-scores its completions (tasks.mjs), and publishes its own
// signed hellos and rollout groups (half correct, half wrong answers: reward variance)
// every interval. Its libp2p key is its envelope key, so GossipSub's `from` is the
// envelope's sender. Prints JSON lines on stdout: `started`, `stats` every interval,
// `refused` for the first refusals, and `final` at exit (SIGTERM, SIGINT or --duration-s).
import './polyfill.mjs'
import { randomBytes } from 'node:crypto'
import { parseArgs } from 'node:util'
import { gossipsub } from '@chainsafe/libp2p-gossipsub'
import { noise } from '@chainsafe/libp2p-noise'
import { yamux } from '@chainsafe/libp2p-yamux'
import { generateKeyPairFromSeed } from '@libp2p/crypto/keys'
import { identify } from '@libp2p/identify'
import { tcp } from '@libp2p/tcp'
import { multiaddr } from '@multiformats/multiaddr'
import { createLibp2p } from 'libp2p'
import { digitTask, scoreDigit } from './tasks.mjs'
import {
  Identity, Refused, checkLogprobs, checkTokenIds, decodePayload, encodePayload, openEnvelope, seal, wireInt
} from './wire.mjs'

const { values: opts } = parseArgs({
  options: {
    connect: { type: 'string' },
    'swarm-id': { type: 'string', default: 'swarm-demo' },
    'key-seed': { type: 'string' }, // 64 hex digits; random when absent
    'task-seed': { type: 'string' }, // decimal; random 63-bit when absent
    groups: { type: 'string', default: '4' },
    'group-size': { type: 'string', default: '8' },
    'interval-ms': { type: 'string', default: '1000' },
    'format-weight': { type: 'string', default: '0.5' },
    'corrupt-after': { type: 'string', default: '-1' }, // publish one bad signature after N batches
    'duration-s': { type: 'string', default: '0' }
  }
})
if (!opts.connect) {
  console.error('usage: node peer.mjs --connect /ip4/.../tcp/.../p2p/<peer id> [--swarm-id ID] ...')
  process.exit(2)
}

const swarmId = opts['swarm-id']
const topics = { peers: `swarm/${swarmId}/peers`, rollouts: `swarm/${swarmId}/rollouts` }
const keySeed = opts['key-seed'] ? Buffer.from(opts['key-seed'], 'hex') : randomBytes(32)
const identity = new Identity(keySeed)
// A 63-bit seed above 2**53, so the node must read it as a 64-bit integer (docs/wire.md).
const taskSeed = opts['task-seed'] !== undefined
  ? BigInt(opts['task-seed'])
  : (2n ** 53n) + (randomBytes(8).readBigUInt64BE() % (2n ** 62n))
const groupsPerBatch = Number(opts.groups)
const groupSize = Number(opts['group-size'])
const intervalMs = Number(opts['interval-ms'])
const formatWeight = Number(opts['format-weight'])
const corruptAfter = Number(opts['corrupt-after'])

const stats = {
  verified: {}, // envelopes that opened, by kind
  refused: {}, // envelopes refused, by reason
  checks: {}, // what we checked inside the node's payloads
  published: {}, // our envelopes, by kind (`rollouts_bad_signature`: the negative control)
  senders: {} // verified envelopes by sender
}
const bump = (table, key, n = 1) => { table[key] = (table[key] ?? 0) + n }
const print = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')
let refusalsPrinted = 0

function checkNodeGroups (payload) {
  for (const group of payload.groups) {
    if (group.task.source !== 'digit') { bump(stats.checks, 'other_source_groups'); continue }
    const task = digitTask(group.task.seed, group.task.index)
    if (task.prompt !== group.prompt) { bump(stats.checks, 'digit_prompt_mismatch'); continue }
    bump(stats.checks, 'digit_prompt_ok')
    const ours = group.completions.map((c) => scoreDigit(task.answer, c, formatWeight))
    const agree = ours.every((r, i) => Math.abs(r - Number(group.rewards[i])) < 1e-9)
    bump(stats.checks, agree ? 'rewards_agree' : 'rewards_disagree')
    // Sampler logprobs (protocol 4): one decoded entry per completion, one per token at least.
    const lps = (group.logprobs ?? []).map(checkLogprobs)
    const carried = lps.length === group.completions.length && lps.every((lp) => lp.length > 0)
    bump(stats.checks, carried ? 'logprobs_carried' : 'logprobs_missing')
    // Sampled token ids (protocol 5): one entry per completion, as many as its logprobs.
    const ids = (group.token_ids ?? []).map(checkTokenIds)
    const idsCarried = ids.length === group.completions.length &&
      ids.every((t, i) => t.length > 0 && t.length === (lps[i] ?? []).length)
    bump(stats.checks, idsCarried ? 'token_ids_carried' : 'token_ids_missing')
  }
}

function onMessage (msg, subscribe) {
  if (!msg.topic.startsWith(`swarm/${swarmId}/`)) return
  try {
    const envelope = openEnvelope(msg.data, swarmId)
    // GossipSub's `from` (signed by libp2p's strict signing) must be the envelope's signer.
    if (msg.type !== 'signed' || msg.from.toString() !== envelope.sender) {
      throw new Refused('sender_mismatch')
    }
    const payload = decodePayload(envelope.kind, envelope.payload)
    const expected = envelope.kind === 'hello' ? topics.peers : envelope.kind === 'rollouts' ? topics.rollouts : null
    if (expected !== null && msg.topic !== expected) throw new Refused('wrong_topic')
    bump(stats.verified, envelope.kind)
    bump(stats.senders, envelope.sender)
    if (envelope.kind === 'hello') {
      bump(stats.checks, 'hello_policy_version_matches_envelope',
        BigInt(payload.policy_version) === envelope.policyVersion ? 1 : 0)
      subscribe(`swarm/${swarmId}/deltas/${payload.model_family}`)
    } else if (envelope.kind === 'rollouts') {
      bump(stats.verified, 'groups', payload.groups.length)
      checkNodeGroups(payload)
    }
  } catch (err) {
    if (!(err instanceof Refused)) throw err
    bump(stats.refused, err.reason)
    if (refusalsPrinted++ < 10) print({ event: 'refused', reason: err.reason, detail: err.message })
  }
}

let seq = BigInt(Date.now()) * 1000n // wall-clock microseconds, as the wire suggests
let taskIndex = 0
let batches = 0 // rollout batches that reached at least one peer
let corruptSent = false

function helloEnvelope () {
  const payload = encodePayload({
    model_id: 'js-peer', model_family: 'js-peer', policy_version: 0, capabilities: ['rollouts']
  })
  return seal(identity, { kind: 'hello', swarmId, seq: seq++, policyVersion: 0, payload })
}

function rolloutsEnvelope () {
  const groups = []
  for (let g = 0; g < groupsPerBatch; g++) {
    const index = taskIndex++
    const task = digitTask(taskSeed, index)
    const wrong = String((Number(task.answer) + 1) % 10)
    const completions = Array.from({ length: groupSize }, (_, i) => (i % 2 === 0 ? task.answer : wrong))
    groups.push({
      task: { source: 'digit', seed: wireInt(taskSeed), index },
      prompt: task.prompt,
      completions,
      rewards: completions.map((c) => scoreDigit(task.answer, c, formatWeight)),
      model_id: 'js-peer',
      policy_version: 0,
      finished: completions.map(() => true)
    })
  }
  return seal(identity, {
    kind: 'rollouts', swarmId, seq: seq++, policyVersion: 0, payload: encodePayload({ groups })
  })
}

const libp2p = await createLibp2p({
  privateKey: await generateKeyPairFromSeed('Ed25519', keySeed),
  addresses: { listen: [] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: {
    identify: identify(),
    pubsub: gossipsub({
      allowPublishToZeroTopicPeers: true,
      emitSelf: false,
      heartbeatInterval: 1000,
      globalSignaturePolicy: 'StrictSign'
    })
  }
})
const pubsub = libp2p.services.pubsub
const subscribed = new Set()
const subscribe = (topic) => {
  if (!subscribed.has(topic)) { subscribed.add(topic); pubsub.subscribe(topic) }
}
pubsub.addEventListener('message', (evt) => onMessage(evt.detail, subscribe))
subscribe(topics.peers)
subscribe(topics.rollouts)
print({
  event: 'started',
  peer_id: identity.peerId,
  libp2p_peer_id: libp2p.peerId.toString(),
  task_seed: taskSeed.toString()
})
if (libp2p.peerId.toString() !== identity.peerId) {
  console.error('our peer id derivation disagrees with js-libp2p')
  process.exit(1)
}

const target = multiaddr(opts.connect)
for (let attempt = 0; ; attempt++) {
  try {
    await libp2p.dial(target)
    break
  } catch (err) {
    if (attempt >= 60) { console.error(`dial ${opts.connect} failed: ${err.message}`); process.exit(1) }
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
}
print({ event: 'connected', to: opts.connect })

// Publish; how many peers it went to (GossipSub accepts a publish with none while the
// mesh forms: counted as `<kind>_unsent`).
async function publish (kind, topic, data) {
  try {
    const { recipients } = await pubsub.publish(topic, data)
    bump(stats.published, recipients.length > 0 ? kind : `${kind}_unsent`)
    return recipients.length
  } catch (err) {
    bump(stats.published, `${kind}_failed`)
    return 0
  }
}

function snapshot (event) {
  return {
    event,
    peer_id: identity.peerId,
    connections: libp2p.getConnections().map((c) => c.remotePeer.toString()),
    mesh: Object.fromEntries(Object.values(topics).map((t) => [t, pubsub.getMeshPeers(t).length])),
    ...stats
  }
}

let stopping = false
let timer = null
async function stop () {
  if (stopping) return
  stopping = true
  if (timer !== null) clearInterval(timer)
  print(snapshot('final'))
  await Promise.race([libp2p.stop(), new Promise((resolve) => setTimeout(resolve, 1000))])
  process.exit(0)
}

async function tick () {
  await publish('hello', topics.peers, helloEnvelope())
  if (await publish('rollouts', topics.rollouts, rolloutsEnvelope()) > 0) batches++
  if (corruptAfter >= 0 && batches >= corruptAfter && !corruptSent) {
    // The negative control: a well-formed envelope whose signature is wrong in one bit,
    // sent once (to at least one peer).
    const bad = Buffer.from(rolloutsEnvelope())
    bad[bad.length - 1] ^= 0x01
    corruptSent = await publish('rollouts_bad_signature', topics.rollouts, bad) > 0
  }
  print(snapshot('stats'))
}

process.on('SIGTERM', stop)
process.on('SIGINT', stop)
timer = setInterval(() => { tick().catch((err) => { console.error(err); process.exit(1) }) }, intervalMs)
await tick()
const duration = Number(opts['duration-s'])
if (duration > 0) setTimeout(stop, duration * 1000)
