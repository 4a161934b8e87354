/** Waiting on a condition with a deadline: how tests wait, instead of a fixed sleep followed by an assertion. */

/**
 * Poll `check` every `everyMs` until it returns true, or throw naming `what` once `timeoutMs` passed; resolves
 * with the elapsed milliseconds.
 */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
  everyMs = 10,
): Promise<number> {
  const start = performance.now();
  for (;;) {
    if (await check()) return performance.now() - start;
    if (performance.now() - start > timeoutMs) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
