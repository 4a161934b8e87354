/**
 * Envoy's rate-limit service (gRPC `ShouldRateLimit`) beside `POST /v1/decisions`, on the same agent process
 * (regional-agent/main.ts with `QP_GRPC_PORT`), the same Redis and the same policy, alternating round by round.
 * The gRPC load comes from this process through a few HTTP/2 connections (as Envoy keeps), 64 calls in flight,
 * as the HTTP load has 64 connections; pinned like the HTTP suite (server and Redis on core 1, load on core 0).
 *
 * The load generator is lean, as autocannon is for HTTP and Envoy is for gRPC: requests are encoded once (by the
 * proto's own serializer) and sent as gRPC frames over `node:http2`; each answer's status and `overall_code`
 * are read. A grpc-js client spends about 140 µs of CPU per call: on its one core it was the bottleneck, and the
 * agent idled between rounds of calls (the gRPC figure measured the client, at 0.29× of HTTP).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect, constants, type ClientHttp2Session, type IncomingHttpHeaders } from 'node:http2';
import { rlsClient } from '../regional-agent/grpc/rls-client.js';
import { rateLimitServiceDefinition } from '../regional-agent/grpc/rls-server.js';
import { processBackend } from '../test/harness/process-backend.js';
import { freePort, waitForPort } from '../test/harness/ports.js';
import { canPin, cpuMs, load, pinPid, redisPid, spawnServer, stopServer, type Load } from './http.bench.js';
import { alternate, median, type BenchSuite, type Comparison } from './lib.js';

const SUBJECTS = 10_000;
const IN_FLIGHT = 64;
const CHANNELS = 4;
const THIS_FILE = fileURLToPath(import.meta.url);
const POLICIES = { writes: { capacity: 120, refillPerSecond: 2, maxCost: 1 } };

const httpBody = (i: number) => JSON.stringify({ policy: 'writes', subject: `tenant-${i % SUBJECTS}` });
const descriptors = (i: number) => [
  {
    entries: [
      { key: 'policy', value: 'writes' },
      { key: 'subject', value: `tenant-${i % SUBJECTS}` },
    ],
  },
];
const SHOULD_RATE_LIMIT = '/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit';

/** Each subject's request as a gRPC message frame (uncompressed flag, 4-byte length, the protobuf). */
function encodedRequests(): Buffer[] {
  const method = rateLimitServiceDefinition().definition['ShouldRateLimit']!;
  return Array.from({ length: SUBJECTS }, (_, i) => {
    const message = method.requestSerialize({ domain: 'bench', descriptors: descriptors(i) });
    const frame = Buffer.allocUnsafe(5 + message.length);
    frame.writeUInt8(0, 0);
    frame.writeUInt32BE(message.length, 1);
    message.copy(frame, 5);
    return frame;
  });
}

/** One unary call on an HTTP/2 session: resolves with `overall_code`, rejects on a gRPC status other than 0. */
function call(
  session: ClientHttp2Session,
  frame: Buffer,
  deserialize: (b: Buffer) => unknown,
): Promise<string> {
  return new Promise((resolve, reject) => {
    const stream = session.request({
      [constants.HTTP2_HEADER_METHOD]: 'POST',
      [constants.HTTP2_HEADER_PATH]: SHOULD_RATE_LIMIT,
      'content-type': 'application/grpc',
      te: 'trailers',
      'grpc-timeout': '5S',
    });
    const chunks: Buffer[] = [];
    stream.on('data', (chunk: Buffer) => chunks.push(chunk));
    stream.on('trailers', (trailers: IncomingHttpHeaders) => {
      const status = trailers['grpc-status'];
      if (status !== '0') {
        reject(new Error(`grpc-status ${String(status)}: ${String(trailers['grpc-message'])}`));
        return;
      }
      const body = Buffer.concat(chunks);
      const response = deserialize(body.subarray(5)) as { overall_code?: string };
      resolve(response.overall_code ?? 'UNKNOWN');
    });
    stream.on('error', reject);
    stream.end(frame);
  });
}

interface GrpcLoad {
  calls: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  overLimit: number;
}

/** Closed loop of IN_FLIGHT callers spread over the connections, for `seconds`; latencies in ms. */
async function grpcLoad(sessions: readonly ClientHttp2Session[], seconds: number): Promise<GrpcLoad> {
  const frames = encodedRequests();
  const deserialize = rateLimitServiceDefinition().definition['ShouldRateLimit']!.responseDeserialize;
  const latencies: number[] = [];
  let errors = 0;
  let overLimit = 0;
  let i = 0;
  const deadline = performance.now() + seconds * 1000;
  const start = performance.now();
  const worker = async (w: number) => {
    const session = sessions[w % sessions.length]!;
    while (performance.now() < deadline) {
      const t = performance.now();
      try {
        const code = await call(session, frames[i++ % SUBJECTS]!, deserialize);
        if (code === 'OVER_LIMIT') overLimit++;
      } catch {
        errors++;
      }
      latencies.push(performance.now() - t);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, (_, w) => worker(w)));
  const elapsed = (performance.now() - start) / 1000;
  latencies.sort((a, b) => a - b);
  const at = (q: number) =>
    Number((latencies[Math.min(latencies.length - 1, Math.floor(q * latencies.length))] ?? 0).toFixed(2));
  return {
    calls: latencies.length,
    rps: latencies.length / elapsed,
    p50: at(0.5),
    p99: at(0.99),
    errors,
    overLimit,
  };
}

export const grpcSuite: BenchSuite = {
  name: 'grpc',
  async run({ seconds, rounds }, progress) {
    await using redis = await processBackend.startRedis();
    const pin = canPin();
    if (pin) {
      pinPid(redisPid(redis.host, redis.port), '1');
      pinPid(process.pid, '0');
      progress('grpc: Redis and the agent on core 1, the load generator on core 0');
    }
    const dir = mkdtempSync(join(tmpdir(), 'qp-bench-grpc-'));
    const policiesFile = join(dir, 'policies.json');
    writeFileSync(policiesFile, JSON.stringify({ policies: POLICIES }));
    const [httpPort, grpcPort] = await Promise.all([freePort(), freePort()]);
    const agent = spawnServer(
      [join(THIS_FILE, '../../regional-agent/main.ts')],
      {
        QP_REGION: 'bench',
        QP_REDIS_URL: redis.url,
        QP_POLICIES_FILE: policiesFile,
        QP_PORT: String(httpPort),
        QP_GRPC_PORT: String(grpcPort),
        QP_LOG_LEVEL: 'warn',
        QP_LOG_SAMPLE_RATE: '0',
        // Every answer measured is a real decision, none a fast failure-mode answer (checked below), and none
        // shed: the same settings as the HTTP suite's agent.
        QP_DECISION_DEADLINE_MS: '5000',
        QP_STORE_TIMEOUT_MS: '5000',
        QP_MAX_IN_FLIGHT: '100000',
      },
      pin,
    );
    let sessions: ClientHttp2Session[] = [];
    try {
      await Promise.all([httpPort, grpcPort].map((p) => waitForPort('127.0.0.1', p, 30_000)));
      // The service answers through the proto's client too (a smoke check), then the lean load begins.
      const smoke = rlsClient(`127.0.0.1:${grpcPort}`);
      try {
        await smoke.ready(10_000);
        await smoke.shouldRateLimit({ domain: 'bench', descriptors: descriptors(0) }, 5000);
      } finally {
        smoke.close();
      }
      sessions = Array.from({ length: CHANNELS }, () => connect(`http://127.0.0.1:${grpcPort}`));
      const url = `http://127.0.0.1:${httpPort}`;
      progress('grpc: warming up');
      await load(url, 3, httpBody);
      await grpcLoad(sessions, 3);

      const http: Load[] = [];
      const grpc: GrpcLoad[] = [];
      // The agent's CPU time per answer (user + system), and the load generator's, for each protocol.
      const cpu = { grpc: [] as number[], http: [] as number[], grpcClient: [] as number[] };
      const measured = async <T>(kind: 'grpc' | 'http', run: () => Promise<T>, count: (r: T) => number) => {
        const before = cpuMs(agent.pid!);
        const client = process.cpuUsage();
        const r = await run();
        const after = cpuMs(agent.pid!);
        const used = process.cpuUsage(client);
        if (before !== undefined && after !== undefined && count(r) > 0) {
          cpu[kind].push(((after - before) * 1000) / count(r));
          if (kind === 'grpc') cpu.grpcClient.push((used.user + used.system) / count(r));
        }
        return r;
      };
      const runs = await alternate(
        {
          grpc: async () => {
            const r = await measured(
              'grpc',
              () => grpcLoad(sessions, seconds),
              (g) => g.calls,
            );
            grpc.push(r);
            return r.rps;
          },
          http: async () => {
            const r = await measured(
              'http',
              () => load(url, seconds, httpBody),
              (h) => h.total,
            );
            http.push(r);
            return r.rps;
          },
        },
        rounds,
        progress,
      );
      const metrics = await (await fetch(`${url}/metrics`)).text();
      let degraded = 0;
      for (const m of metrics.matchAll(/^quotaplane_degraded_decisions_total\{[^}]*\} (\d+)/gm))
        degraded += Number(m[1]);
      if (degraded > 0)
        progress(`grpc: WARNING: ${degraded} of the agent's answers were failure-mode answers`);
      const ours = median(runs.grpc);
      const peer = median(runs.http);
      const out: Comparison[] = [
        {
          bench: `grpc decisions/s (ShouldRateLimit, ${IN_FLIGHT} in flight on ${CHANNELS} connections, 10k subjects)`,
          ours: Math.round(ours),
          peer: `HTTP POST /v1/decisions on the same agent (${IN_FLIGHT} connections)`,
          peerValue: Math.round(peer),
          ratio: Number((ours / peer).toFixed(2)),
          details: {
            pinned: pin,
            grpcRuns: runs.grpc.map(Math.round),
            httpRuns: runs.http.map(Math.round),
            p50Ms: { grpc: median(grpc.map((g) => g.p50)), http: median(http.map((h) => h.p50)) },
            p99Ms: { grpc: median(grpc.map((g) => g.p99)), http: median(http.map((h) => h.p99)) },
            errors: {
              grpc: grpc.reduce((n, g) => n + g.errors, 0),
              http: http.reduce((n, h) => n + h.errors, 0),
            },
            overLimit: grpc.reduce((n, g) => n + g.overLimit, 0),
            cpuUsPerDecision: {
              agentGrpc: Number(median(cpu.grpc).toFixed(1)),
              agentHttp: Number(median(cpu.http).toFixed(1)),
              loadGeneratorGrpc: Number(median(cpu.grpcClient).toFixed(1)),
            },
            degradedDecisions: degraded,
          },
        },
      ];
      return out;
    } finally {
      for (const s of sessions) s.close();
      if (pin) pinPid(process.pid, '0-1');
      await stopServer(agent);
      rmSync(dir, { recursive: true, force: true });
    }
  },
};
