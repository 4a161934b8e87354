import { describe, expect, it } from 'vitest';
import { AgentClient, type AgentClientOptions } from '../../src/index.js';

/** The TypeError's message for `options`, or undefined when the client is made. */
function refusal(options: Record<string, unknown>): string | undefined {
  try {
    new AgentClient(options as unknown as AgentClientOptions).close();
    return undefined;
  } catch (error) {
    expect(error).toBeInstanceOf(TypeError);
    return (error as Error).message;
  }
}

describe('AgentClient options: a mistake is a TypeError that names the option', () => {
  it('baseUrl: missing (an unset environment variable), empty, relative, or not http', () => {
    const absolute =
      "AgentClient: baseUrl must be the agent's absolute URL, such as http://127.0.0.1:7101 (got ";
    expect(refusal({})).toBe(`${absolute}undefined)`);
    expect(refusal({ url: 'http://127.0.0.1:7101' })).toBe(`${absolute}undefined)`);
    expect(refusal({ baseUrl: '' })).toBe(`${absolute}"")`);
    expect(refusal({ baseUrl: '/agent' })).toBe(`${absolute}"/agent")`);
    expect(refusal({ baseUrl: 7101 })).toBe(`${absolute}7101)`);
    const http =
      'AgentClient: baseUrl must be an http:// URL, the agent listening on plain http on a private network';
    expect(refusal({ baseUrl: 'https://agent.internal' })).toBe(`${http} (got https:)`);
    // A host and port without a scheme parse as a URL whose scheme is the host.
    expect(refusal({ baseUrl: 'localhost:7101' })).toBe(`${http} (got localhost:)`);
    expect(refusal({ baseUrl: 'http://127.0.0.1:7101' })).toBeUndefined();
    expect(refusal({ baseUrl: 'http://agent.internal:7101/' })).toBeUndefined();
  });

  it('queueing and coalescing bounds', () => {
    const base = { baseUrl: 'http://127.0.0.1:7101' };
    expect(refusal({ ...base, maxQueued: -1 })).toBe('AgentClient: maxQueued must be an integer >= 0');
    expect(refusal({ ...base, maxExchanges: 0 })).toBe(
      'AgentClient: maxSockets and maxExchanges must be integers >= 1',
    );
    expect(refusal({ ...base, coalesce: { maxBatch: 129 } })).toBe(
      'AgentClient: coalesce.maxBatch must be an integer from 1 to 128',
    );
    expect(refusal({ ...base, coalesce: { windowMs: 1001 } })).toBe(
      'AgentClient: coalesce.windowMs must be from 0 to 1000',
    );
    expect(refusal({ ...base, maxQueued: 0, coalesce: { maxBatch: 128, windowMs: 1000 } })).toBeUndefined();
  });
});
