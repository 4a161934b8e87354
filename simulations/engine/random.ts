/**
 * Seeded randomness for the simulator: xoshiro128** (Blackman & Vigna) seeded through splitmix32, all in 32-bit
 * integer arithmetic so every platform draws the same numbers. Independent streams come from `fork(label)`, so
 * the arrivals of one region never shift because a strategy drew more numbers for its network.
 */

const TWO_POW_32 = 4294967296;

function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) | 0;
  let z = state.s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** FNV-1a over a label, mixed into a 32-bit seed: the root of a named stream. */
function streamSeed(seed: number, label: string): number {
  let h = 0x811c9dc5 ^ (seed >>> 0) ^ Math.floor(seed / TWO_POW_32);
  for (let i = 0; i < label.length; i++) {
    h ^= label.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** A deterministic pseudo-random stream. Not for anything secret. */
export class Random {
  #a: number;
  #b: number;
  #c: number;
  #d: number;
  readonly #seed: number;
  /** The stream's name: the labels of its forks, joined by `/`. */
  readonly label: string;

  /** `seed`: any safe integer; `label` names the stream (different labels give independent streams). */
  constructor(seed: number, label = '') {
    if (!Number.isSafeInteger(seed) || seed < 0)
      throw new RangeError(`seed must be a safe integer ≥ 0, got ${seed}`);
    this.#seed = seed;
    const state = { s: streamSeed(seed, label) };
    this.#a = splitmix32(state);
    this.#b = splitmix32(state);
    this.#c = splitmix32(state);
    this.#d = splitmix32(state);
    // streamSeed folds the seed's two 32-bit words into one, so seeds ≥ 2^32 would share streams with smaller
    // ones (2^32 with 1): the high word goes into the state as well, by an odd multiplier (a bijection mod 2^32),
    // which leaves every seed below 2^32 drawing exactly what it did.
    const high = Math.floor(seed / TWO_POW_32);
    if (high !== 0) this.#b ^= Math.imul(high, 0x9e3779b9);
    if ((this.#a | this.#b | this.#c | this.#d) === 0) this.#a = 1;
    this.label = label;
  }

  /** An independent stream derived from this one's seed and label, whatever has been drawn so far. */
  fork(label: string): Random {
    return new Random(this.#seed, `${this.label}/${label}`);
  }

  /** Next 32-bit unsigned integer. */
  nextUint32(): number {
    const result = Math.imul(rotl(Math.imul(this.#b, 5), 7), 9) >>> 0;
    const t = this.#b << 9;
    this.#c ^= this.#a;
    this.#d ^= this.#b;
    this.#b ^= this.#c;
    this.#a ^= this.#d;
    this.#c ^= t;
    this.#d = rotl(this.#d, 11);
    return result;
  }

  /** Uniform in [0, 1). */
  next(): number {
    return this.nextUint32() / TWO_POW_32;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** Exponentially distributed with the given mean (mean 0 gives 0). */
  exponential(mean: number): number {
    return -Math.log(1 - this.next()) * mean;
  }

  /** True with probability p. */
  chance(p: number): boolean {
    return p > 0 && this.next() < p;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}
