/**
 * `@quotaplane/client` as a user gets it: `npm pack` builds and packs it (run on a copy of the package and the
 * core/ it bundles, with no build in it, so what the tarball holds the pack built), the tarball is installed
 * into a fresh project outside the repository (dependencies from the npm cache that the repository's `npm ci`
 * filled), and a small Fastify service, once `require`d as CommonJS and once `import`ed as ESM, protects a route
 * with it against a real agent process and Redis. The package's types are checked from both module systems too.
 */
import { execFile } from 'node:child_process';
import {
  cpSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { startAgentProcess, type AgentProcess } from '../../../../test/helpers/agent-process.js';
import { uniquePrefix } from '../../../../test/harness/fixtures.js';

const run = promisify(execFile);
const repo = resolve(import.meta.dirname, '../../../..');
const versionOf = (name: string): string =>
  (JSON.parse(readFileSync(join(repo, 'node_modules', name, 'package.json'), 'utf8')) as { version: string })
    .version;

// The same service in both module systems: a route costing one token of `work` per tenant. It serves on a
// free port, asks itself over HTTP, and prints what it saw as one JSON line.
const service = (load: string) => `${load}
async function main() {
  const client = new AgentClient({ baseUrl: process.env.AGENT_URL, timeoutMs: 5000 });
  const app = Fastify();
  await app.register(quotaplane, {
    client,
    subject: (request) => (typeof request.headers['x-tenant-id'] === 'string' ? 'tenant:' + request.headers['x-tenant-id'] : undefined),
  });
  app.get('/work', { config: { quota: { policy: 'work' } } }, async () => ({ done: true }));
  const base = await app.listen({ host: '127.0.0.1', port: 0 });
  const answers = [];
  for (let i = 0; i < 4; i++) {
    const res = await fetch(base + '/work', { headers: { 'x-tenant-id': process.env.TENANT } });
    answers.push({ status: res.status, ratelimit: res.headers.get('ratelimit'), body: await res.json() });
  }
  const direct = await client.check('work', 'tenant:' + process.env.TENANT);
  await app.close();
  client.close();
  console.log(JSON.stringify({ resolved: resolved, answers, direct }));
}
main().catch((error) => { console.error(error); process.exit(1); });
`;

const cjs = service(`'use strict';
const { AgentClient } = require('@quotaplane/client');
const { quotaplane } = require('@quotaplane/client/fastify');
const Fastify = require('fastify');
const resolved = require.resolve('@quotaplane/client');`);

const esm = service(`import { AgentClient } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import Fastify from 'fastify';
const resolved = import.meta.resolve('@quotaplane/client');`);

// Types as a TypeScript user sees them, from an ES module and from a CommonJS one.
const typed = (imports: string) => `${imports}
const client = new AgentClient({ baseUrl: 'http://127.0.0.1:7101', onUnavailable: 'local', fallback: { capacity: 5, refillPerSecond: 1 } });
const app = Fastify();
void app.register(quotaplane, { client, subject: () => 'tenant:a', onRefused: (error: AgentRequestError) => error.code });
app.get('/x', { config: { quota: { policy: 'work', onUnavailable: 'open' } } }, async () => 'ok');
export async function f(): Promise<number | undefined> {
  const d: Decision = await client.check('work', 'tenant:a');
  const degraded: Degraded | undefined = d.degraded;
  return degraded === undefined ? d.results[0]?.remaining : client.stats().failures.timeout;
}
`;
const typedImports = `import { AgentClient, type AgentRequestError, type Decision, type Degraded } from '@quotaplane/client';
import { quotaplane } from '@quotaplane/client/fastify';
import Fastify from 'fastify';`;

let dir: string;
let agent: AgentProcess;
let packOutput: { stdout: string; stderr: string };
let builtByPack: boolean;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'qp-client-package-'));
  // The package's sources and what they bundle, laid out as in the repository, without a dist/ (and without
  // touching the repository's, which other test files load meanwhile); dependencies from its node_modules.
  const source = join(dir, 'source');
  for (const part of [
    'tsconfig.json',
    'core',
    'packages/client/package.json',
    'packages/client/tsconfig.json',
    'packages/client/tsdown.config.ts',
    'packages/client/src',
  ]) {
    cpSync(join(repo, part), join(source, part), { recursive: true });
  }
  symlinkSync(join(repo, 'node_modules'), join(source, 'node_modules'));
  packOutput = await run('npm', ['pack', '--pack-destination', dir], {
    cwd: join(source, 'packages', 'client'),
    timeout: 120_000,
  });
  builtByPack = existsSync(join(source, 'packages', 'client', 'dist', 'index.mjs'));
  const tarball = readdirSync(dir).find((f) => f.endsWith('.tgz'));
  if (tarball === undefined) throw new Error('npm pack made no tarball');
  const project = join(dir, 'service');
  await run('mkdir', ['-p', project]);
  writeFileSync(join(project, 'package.json'), JSON.stringify({ name: 'service', private: true }));
  // Dependencies come from the npm cache the repository's install filled; fastify at the repository's version.
  await run(
    'npm',
    [
      'install',
      '--prefer-offline',
      '--no-audit',
      '--no-fund',
      '--no-package-lock',
      join(dir, tarball),
      `fastify@${versionOf('fastify')}`,
    ],
    { cwd: project, timeout: 180_000 },
  );
  const { url } = inject('redis');
  agent = await startAgentProcess({
    redisUrl: url,
    policies: { work: { capacity: 3, refillPerSecond: 0.001 } },
  });
}, 400_000);

afterAll(async () => {
  await agent?.[Symbol.asyncDispose]();
  if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
});

interface ServiceRun {
  resolved: string;
  answers: { status: number; ratelimit: string | null; body: Record<string, unknown> }[];
  direct: { allowed: boolean; results: { remaining: number; limit: number }[] };
}

async function runService(file: string, source: string): Promise<ServiceRun> {
  const project = join(dir, 'service');
  writeFileSync(join(project, file), source);
  const tenant = uniquePrefix('pkg');
  const { stdout } = await run(process.execPath, [file], {
    cwd: project,
    env: { PATH: process.env['PATH'] ?? '', AGENT_URL: agent.url, TENANT: tenant },
    timeout: 60_000,
  });
  return JSON.parse(stdout.trim()) as ServiceRun;
}

function expectProtected(result: ServiceRun): void {
  expect(result.answers.map((a) => a.status)).toEqual([200, 200, 200, 429]);
  expect(result.answers.map((a) => a.ratelimit?.split(';')[1])).toEqual(['r=2', 'r=1', 'r=0', 'r=0']);
  expect(result.answers[0]!.body).toEqual({ done: true });
  expect(result.answers[3]!.body).toMatchObject({ code: 'RATE_LIMITED', 'violated-policies': ['work'] });
  expect(result.direct).toMatchObject({ allowed: false, results: [{ remaining: 0, limit: 3 }] });
}

describe('the packed @quotaplane/client installed in a fresh project', () => {
  it('npm pack builds the package before packing it (prepack)', () => {
    expect(builtByPack).toBe(true);
    expect(packOutput.stdout + packOutput.stderr).toContain('prepack');
    expect(packOutput.stdout).toMatch(/quotaplane-client-0\.1\.0\.tgz/);
  });

  it('installs without tsx or any of the agent: only its declared dependencies', () => {
    const installed = join(dir, 'service', 'node_modules');
    const manifest = JSON.parse(
      readFileSync(join(installed, '@quotaplane', 'client', 'package.json'), 'utf8'),
    ) as { dependencies: Record<string, string> };
    expect(Object.keys(manifest.dependencies).sort()).toEqual(['fastify-plugin', 'opossum', 'zod']);
    expect(existsSync(join(installed, 'tsx'))).toBe(false);
    expect(existsSync(join(installed, 'ioredis'))).toBe(false);
    const files = readdirSync(join(installed, '@quotaplane', 'client', 'dist'));
    expect(files).toEqual(expect.arrayContaining(['index.cjs', 'index.mjs', 'fastify.cjs', 'fastify.mjs']));
    expect(files).toEqual(
      expect.arrayContaining(['index.d.cts', 'index.d.mts', 'fastify.d.cts', 'fastify.d.mts']),
    );
  });

  it('a CommonJS service requires it and is protected by the real agent', async () => {
    const result = await runService('service.cjs', cjs);
    expect(result.resolved).toBe(
      join(dir, 'service', 'node_modules', '@quotaplane', 'client', 'dist', 'index.cjs'),
    );
    expectProtected(result);
  });

  it('an ES module service imports it and is protected by the real agent', async () => {
    const result = await runService('service.mjs', esm);
    expect(result.resolved).toBe(
      `file://${join(dir, 'service', 'node_modules', '@quotaplane', 'client', 'dist', 'index.mjs')}`,
    );
    expectProtected(result);
  });

  it('its types check from an ES module and from a CommonJS module', async () => {
    const project = join(dir, 'service');
    writeFileSync(join(project, 'typed.mts'), typed(typedImports));
    writeFileSync(join(project, 'typed.cts'), typed(typedImports));
    writeFileSync(
      join(project, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module: 'nodenext',
          moduleResolution: 'nodenext',
          target: 'es2023',
          strict: true,
          noEmit: true,
          types: ['node'],
          typeRoots: [join(repo, 'node_modules', '@types')],
        },
        files: ['typed.mts', 'typed.cts'],
      }),
    );
    const tsc = join(repo, 'node_modules', 'typescript', 'bin', 'tsc');
    const checked = await run(process.execPath, [tsc, '-p', project], {
      cwd: project,
      timeout: 120_000,
    }).then(
      () => 'ok',
      (error: Error & { stdout?: string }) => error.stdout || error.message,
    );
    expect(checked).toBe('ok');
  }, 120_000);
});
