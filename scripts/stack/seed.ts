/**
 * The demo policy the stack starts with, created through the admin API as an operator would: create-only
 * (`If-None-Match: *`), so a stack restarted on kept data never overwrites what was changed since.
 */

/** Name and budget of the demo policy: 90 a minute per subject, burst 90, split over the regions. */
export const DEMO_POLICY = { name: 'demo', capacity: 90, refillPerSecond: 1.5 } as const;

export interface SeedResult {
  /** false when the policy already existed and was left as it was. */
  readonly created: boolean;
  /** The stored policy, as the admin API echoes it. */
  readonly policy: Record<string, unknown>;
}

/** PUT the demo policy unless it exists; throws with the problem document when the API refuses. */
export async function seedDemoPolicy(adminUrl: string, adminToken: string): Promise<SeedResult> {
  const url = `${adminUrl}/v1/policies/${DEMO_POLICY.name}`;
  const auth = { authorization: `Bearer ${adminToken}` };
  const put = await fetch(url, {
    method: 'PUT',
    headers: { ...auth, 'content-type': 'application/json', 'if-none-match': '*' },
    body: JSON.stringify({ capacity: DEMO_POLICY.capacity, refillPerSecond: DEMO_POLICY.refillPerSecond }),
    signal: AbortSignal.timeout(10_000),
  });
  if (put.status === 201) return { created: true, policy: (await put.json()) as Record<string, unknown> };
  if (put.status === 412) {
    const get = await fetch(url, { headers: auth, signal: AbortSignal.timeout(10_000) });
    if (get.ok) return { created: false, policy: (await get.json()) as Record<string, unknown> };
    throw new Error(`reading the demo policy failed: ${get.status} ${await get.text()}`);
  }
  throw new Error(`creating the demo policy failed: ${put.status} ${await put.text()}`);
}
