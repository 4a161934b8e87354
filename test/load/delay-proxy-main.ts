/**
 * Delaying TCP proxies in a process of their own, so the delay they add is not stretched by a busy load generator
 * or test: `tsx test/load/delay-proxy-main.ts '<spec JSON>'` (ProxySpec in tcp-proxy.ts). Every link is a tcp-proxy.ts
 * proxy with its one-way delay and jitter; a link may name the two regions it joins, so regions can be
 * partitioned and round trips changed through a small HTTP control API on loopback:
 *
 *   GET  /links                        every link: name, port, regions, delay, cut, counts
 *   POST /partition/{region}           cut every link of the region (sockets closed, new ones refused)
 *   POST /heal/{region}                accept again on every link of the region
 *   POST /cut/{a}/{b}, /heal/{a}/{b}   the same for the links between two regions
 *   PUT  /round-trip/{a}/{b}           {"roundTripMs": 150, "jitter"?: 0.1}: both directions of the pair
 *
 * Prints one JSON line once every link listens, `{"control": PORT, "links": {"<name>": PORT, …}}`; exits on
 * SIGTERM or when its parent goes away.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { z } from 'zod';
import { ProxySpec, tcpProxy, type ProxyPorts, type TcpProxy } from '../helpers/tcp-proxy.js';

const spec = ProxySpec.parse(JSON.parse(process.argv[2] ?? '{}'));
const links = new Map<string, { proxy: TcpProxy; between: readonly string[] | undefined }>();
for (const link of spec.links) {
  const proxy = await tcpProxy(link.target, { delayMs: link.delayMs, jitter: link.jitter, port: link.port });
  links.set(link.name, { proxy, between: link.between });
}

const ofRegion = (region: string) =>
  [...links.values()].filter((l) => l.between?.includes(region) === true).map((l) => l.proxy);
const ofPair = (a: string, b: string) =>
  [...links.values()]
    .filter((l) => l.between !== undefined && l.between.includes(a) && l.between.includes(b) && a !== b)
    .map((l) => l.proxy);

async function body(req: IncomingMessage): Promise<unknown> {
  let text = '';
  for await (const chunk of req) text += String(chunk);
  return text === '' ? {} : (JSON.parse(text) as unknown);
}

const RoundTrip = z.strictObject({
  roundTripMs: z.number().min(0).max(120_000),
  jitter: z.number().min(0).max(1).optional(),
});

async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
  const parts = (req.url ?? '/')
    .split('/')
    .filter((p) => p.length > 0)
    .map(decodeURIComponent);
  const send = (status: number, value: unknown) => {
    res.writeHead(status, { 'content-type': 'application/json' }).end(`${JSON.stringify(value)}\n`);
  };
  const [verb, a, b] = parts;
  if (req.method === 'GET' && verb === 'links' && parts.length === 1) {
    return send(
      200,
      [...links].map(([name, { proxy, between }]) => ({
        name,
        port: proxy.port,
        between,
        delayMs: proxy.delay.delayMs,
        jitter: proxy.delay.jitter,
        cut: proxy.isCut,
        ...proxy.stats(),
      })),
    );
  }
  const chosen = a === undefined ? [] : b === undefined ? ofRegion(a) : ofPair(a, b);
  if (req.method === 'POST' && (verb === 'partition' || verb === 'cut' || verb === 'heal')) {
    const pairVerb = verb === 'cut' || (verb === 'heal' && b !== undefined);
    if (a === undefined || (pairVerb && b === undefined) || (verb === 'partition' && b !== undefined)) {
      return send(404, { error: 'no such route' });
    }
    if (chosen.length === 0) return send(404, { error: 'no link matches' });
    await Promise.all(chosen.map((p) => (verb === 'heal' ? p.restore() : p.cut())));
    return send(200, { links: chosen.length, cut: verb !== 'heal' });
  }
  if (req.method === 'PUT' && verb === 'round-trip' && a !== undefined && b !== undefined) {
    const parsed = RoundTrip.safeParse(await body(req));
    if (!parsed.success) return send(400, { error: parsed.error.issues.map((i) => i.message).join('; ') });
    if (chosen.length === 0) return send(404, { error: 'no link matches' });
    for (const p of chosen) {
      p.setDelay({
        delayMs: parsed.data.roundTripMs / 2,
        ...(parsed.data.jitter === undefined ? {} : { jitter: parsed.data.jitter }),
      });
    }
    return send(200, { links: chosen.length });
  }
  return send(404, { error: 'no such route' });
}

const control = createServer((req, res) => {
  handle(req, res).catch((error: unknown) => {
    if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
    res.end(`${JSON.stringify({ error: String(error) })}\n`);
  });
});
await new Promise<void>((resolve) => control.listen(spec.control, '127.0.0.1', resolve));
const address = control.address();
const ports: ProxyPorts = {
  control: address !== null && typeof address === 'object' ? address.port : 0,
  links: Object.fromEntries([...links].map(([name, { proxy }]) => [name, proxy.port])),
};
console.log(JSON.stringify(ports));

const stop = () => {
  control.close();
  void Promise.all([...links.values()].map((l) => l.proxy.cut())).then(() => process.exit(0));
};
process.once('SIGTERM', stop);
process.once('SIGINT', stop);
// A proxy outliving whoever started it would hold its ports: stop when the parent is gone.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) stop();
}, 500).unref();
