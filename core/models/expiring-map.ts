/**
 * Keys that expire as Redis keys do, for the in-memory models that must agree with the Lua scripts: a value whose
 * `expiresAt` (µs) is at or before `now` reads as absent and is dropped when met.
 */
export class ExpiringMap<V extends { expiresAt: number }> {
  readonly #map = new Map<string, V>();

  /** The value under `key` at `now`, or undefined when there is none or it has expired (then dropped). */
  live(key: string, now: number): V | undefined {
    const value = this.#map.get(key);
    if (value !== undefined && value.expiresAt <= now) {
      this.#map.delete(key);
      return undefined;
    }
    return value;
  }

  set(key: string, value: V): void {
    this.#map.set(key, value);
  }

  /** Delete `key`; true when a live value was there at `now` (as Redis `DEL` counts). */
  delete(key: string, now: number): boolean {
    const live = this.live(key, now) !== undefined;
    this.#map.delete(key);
    return live;
  }

  /** The live keys at `now`, after dropping the expired ones. */
  keys(now: number): string[] {
    return [...this.#map.keys()].filter((key) => this.live(key, now) !== undefined);
  }
}
