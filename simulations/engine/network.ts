/**
 * The simulated network: nodes (regions, the coordinator) joined by links with a one-way delay, jitter and loss.
 * A message is delivered by calling its callback at the arrival instant, or silently lost. Links can be cut and
 * nodes taken down: a message whose link is cut, or whose destination is down, when it would arrive is lost.
 */
import type { EventQueue } from './event-queue.js';
import type { Random } from './random.js';

/** One direction of a link. */
export interface LinkSpec {
  /** Fixed one-way delay, ms. */
  delayMs: number;
  /** Mean of the exponential extra delay added to each message, ms (long tails, as on real WANs). */
  jitterMs: number;
  /** Probability that a message is lost, in [0, 1]. */
  loss: number;
}

/** What a message is for: `control` (reports, leases, acks) or `data` (forwarded decisions and their replies). */
export type MessageClass = 'control' | 'data';

/** Counters of everything the network carried. */
export interface NetworkCounts {
  control: number;
  data: number;
  /** Messages lost to random loss. */
  lost: number;
  /** Messages dropped because their link was cut or a node was down. */
  dropped: number;
}

/** A network among `nodes`; node i is addressed by its index. */
export class Network {
  readonly nodes: readonly string[];
  readonly counts: NetworkCounts = { control: 0, data: 0, lost: 0, dropped: 0 };
  readonly #links: LinkSpec[][];
  readonly #cut: boolean[][];
  readonly #down: boolean[];
  readonly #queue: EventQueue;
  readonly #random: Random;

  /** `links[from][to]` gives each direction; a node's link to itself is its local hop. */
  constructor(nodes: readonly string[], links: LinkSpec[][], queue: EventQueue, random: Random) {
    this.nodes = nodes;
    this.#links = links;
    this.#cut = nodes.map(() => nodes.map(() => false));
    this.#down = nodes.map(() => false);
    this.#queue = queue;
    this.#random = random;
  }

  /** The spec of the link `from` → `to`. */
  link(from: number, to: number): LinkSpec {
    return this.#links[from]![to]!;
  }

  /**
   * Send a message; `deliver` runs when it arrives. Returns false when the message is lost at once (loss or a cut
   * link or a down node at send time); a message may also be dropped in flight, which the sender cannot tell.
   */
  send(from: number, to: number, kind: MessageClass, deliver: () => void): boolean {
    this.counts[kind]++;
    if (!this.reachable(from, to)) {
      this.counts.dropped++;
      return false;
    }
    const spec = this.#links[from]![to]!;
    if (this.#random.chance(spec.loss)) {
      this.counts.lost++;
      return false;
    }
    const delay = spec.delayMs + (spec.jitterMs > 0 ? this.#random.exponential(spec.jitterMs) : 0);
    this.#queue.at(this.#queue.now + Math.max(1, Math.round(delay * 1000)), () => {
      if (!this.reachable(from, to)) {
        this.counts.dropped++;
        return;
      }
      deliver();
    });
    return true;
  }

  /** True when a message from `from` to `to` can currently get through (ignoring random loss). */
  reachable(from: number, to: number): boolean {
    return !this.#down[from] && !this.#down[to] && !this.#cut[from]![to];
  }

  /** Cut or heal both directions between `a` and `b`. */
  setCut(a: number, b: number, cut: boolean): void {
    this.#cut[a]![b] = cut;
    this.#cut[b]![a] = cut;
  }

  /** Take a node down (it neither sends nor receives) or bring it back. */
  setDown(node: number, down: boolean): void {
    this.#down[node] = down;
  }

  isDown(node: number): boolean {
    return this.#down[node]!;
  }
}
