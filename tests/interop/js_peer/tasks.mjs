// The built-in `digit` task ("3=" -> "3") regenerated from its reference (source, seed,
// index), and its reward, so this peer publishes groups the node can regenerate and checks
// the node's own groups the way the node checks ours.
//
// A built-in task draws from CPython's `random.Random(f"swarm-task:{source}:{seed}:{index}")`
// (rewards/tasks.py): a string seed is the integer of its UTF-8 bytes followed by their
// SHA-512 (big-endian), fed to MT19937's init_by_array as 32-bit words, least
// significant first; `randrange(10)` draws `getrandbits(4)` (the top 4 bits of one
// 32-bit output) until the value is below 10. Implemented here from those documented
// algorithms (MT19937: Matsumoto & Nishimura's reference code).
import { sha512 } from './wire.mjs'

const N = 624
const M = 397

export class MersenneTwister {
  constructor (key) {
    this.mt = new Uint32Array(N)
    this.index = N
    this.initGenrand(19650218)
    const mt = this.mt
    let i = 1
    let j = 0
    for (let k = Math.max(N, key.length); k > 0; k--) {
      const prev = mt[i - 1] ^ (mt[i - 1] >>> 30)
      mt[i] = ((mt[i] ^ Math.imul(prev, 1664525)) + key[j] + j) >>> 0
      i++; j++
      if (i >= N) { mt[0] = mt[N - 1]; i = 1 }
      if (j >= key.length) j = 0
    }
    for (let k = N - 1; k > 0; k--) {
      const prev = mt[i - 1] ^ (mt[i - 1] >>> 30)
      mt[i] = ((mt[i] ^ Math.imul(prev, 1566083941)) - i) >>> 0
      i++
      if (i >= N) { mt[0] = mt[N - 1]; i = 1 }
    }
    mt[0] = 0x80000000
  }

  initGenrand (s) {
    const mt = this.mt
    mt[0] = s >>> 0
    for (let i = 1; i < N; i++) {
      mt[i] = (Math.imul(1812433253, mt[i - 1] ^ (mt[i - 1] >>> 30)) + i) >>> 0
    }
  }

  uint32 () {
    const mt = this.mt
    if (this.index >= N) {
      for (let k = 0; k < N; k++) {
        const y = (mt[k] & 0x80000000) | (mt[(k + 1) % N] & 0x7fffffff)
        mt[k] = mt[(k + M) % N] ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0)
      }
      this.index = 0
    }
    let y = mt[this.index++]
    y ^= y >>> 11
    y ^= (y << 7) & 0x9d2c5680
    y ^= (y << 15) & 0xefc60000
    y ^= y >>> 18
    return y >>> 0
  }

  getrandbits (k) { return this.uint32() >>> (32 - k) } // 0 < k <= 32

  randbelow (n) { // n < 2**32
    const k = 32 - Math.clz32(n)
    let r = this.getrandbits(k)
    while (r >= n) r = this.getrandbits(k)
    return r
  }

  static fromString (text) {
    const bytes = Buffer.from(text, 'utf8')
    const big = Buffer.concat([bytes, sha512(bytes)]) // one big-endian integer
    let start = 0
    while (start < big.length - 1 && big[start] === 0) start++
    const le = Buffer.from(big.subarray(start)).reverse()
    const words = []
    for (let i = 0; i < le.length; i += 4) {
      words.push((le[i] | ((le[i + 1] ?? 0) << 8) | ((le[i + 2] ?? 0) << 16) | ((le[i + 3] ?? 0) << 24)) >>> 0)
    }
    return new MersenneTwister(words.length ? words : [0])
  }
}

// `digit`: prompt "<d>=", answer "<d>".
export function digitTask (seed, index) {
  const rng = MersenneTwister.fromString(`swarm-task:digit:${BigInt(seed)}:${BigInt(index)}`)
  const d = rng.randbelow(10)
  return { prompt: `${d}=`, answer: `${d}` }
}

// The node's reward for a built-in task in `first_line` answer format (docs: the answer is
// the last complete <answer>...</answer> block, else the stripped first line):
// correctness (exact) + formatWeight * (the bare first line fully matches the answer pattern).
export function scoreDigit (answer, completion, formatWeight) {
  const tagged = lastTagged(completion)
  const extracted = tagged !== null ? tagged.trim() : (completion.split('\n', 1)[0].trim() || null)
  const correct = extracted !== null && extracted === answer ? 1 : 0
  const formatOk = tagged === null && extracted !== null && /^\d$/.test(extracted)
  return correct + formatWeight * (formatOk ? 1 : 0)
}

function lastTagged (text) {
  let last = null
  let pos = 0
  for (;;) {
    const start = text.indexOf('<answer>', pos)
    if (start < 0) return last
    const end = text.indexOf('</answer>', start + 8)
    if (end < 0) return last
    last = text.slice(start + 8, end)
    pos = end + 9
  }
}
