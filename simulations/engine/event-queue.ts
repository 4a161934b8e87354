/**
 * The simulator's agenda: events ordered by virtual time (µs), ties broken by insertion order, so two runs
 * with the same seed fire the same events in the same order.
 */

/** Something that happens at a virtual instant. `at` and `seq` are owned by the queue once scheduled. */
export interface SimEvent {
  /** Virtual time, µs. */
  at: number;
  /** Insertion order, set by the queue. */
  seq: number;
  run(): void;
}

/** A binary min-heap of events on (at, seq). */
export class EventQueue {
  readonly #heap: SimEvent[] = [];
  #seq = 0;
  /** Virtual time of the event being run (µs): the time of the last event popped. */
  now = 0;

  get size(): number {
    return this.#heap.length;
  }

  /** Schedule `event` at `event.at` (never before `now`). An event object may be scheduled again once it has fired. */
  push(event: SimEvent): void {
    if (event.at < this.now) throw new RangeError(`event at ${event.at} µs is before now (${this.now} µs)`);
    event.seq = this.#seq++;
    const heap = this.#heap;
    let i = heap.length;
    heap.push(event);
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = heap[parent]!;
      if (before(p, event)) break;
      heap[i] = p;
      i = parent;
    }
    heap[i] = event;
  }

  /** Schedule a one-off callback. */
  at(time: number, run: () => void): void {
    this.push({ at: time, seq: 0, run });
  }

  /** Time of the next event, or Infinity when none is left. */
  peekTime(): number {
    return this.#heap.length === 0 ? Infinity : this.#heap[0]!.at;
  }

  /** Remove and return the earliest event. */
  pop(): SimEvent | undefined {
    const heap = this.#heap;
    const top = heap[0];
    const last = heap.pop();
    if (top !== undefined) this.now = top.at;
    if (top === undefined || last === undefined || heap.length === 0) return top;
    const n = heap.length;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const child = r < n && before(heap[r]!, heap[l]!) ? r : l;
      const c = heap[child]!;
      if (before(last, c)) break;
      heap[i] = c;
      i = child;
    }
    heap[i] = last;
    return top;
  }
}

function before(a: SimEvent, b: SimEvent): boolean {
  return a.at < b.at || (a.at === b.at && a.seq < b.seq);
}
