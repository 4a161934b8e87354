/**
 * Run the example next to an agent:
 *   AGENT_URL=http://127.0.0.1:7101 PORT=8080 npx tsx examples/reports-service/main.ts
 *   curl -i -XPOST localhost:8080/reports -H 'x-tenant-id: acme' -H 'content-type: application/json' -d '{"pages":3}'
 */
import { AgentClient } from '@quotaplane/client';
import { buildReportsApp } from './app.js';

// The client's defaults: its timeout follows the agent's answer bound (at least 300 ms; docs/running.md). A fixed
// 100 ms one turned 436 of 3,000 concurrent requests of one tenant into 503s while the agent was answering them.
const client = new AgentClient({ baseUrl: process.env['AGENT_URL'] ?? 'http://127.0.0.1:7101' });
const app = await buildReportsApp({ client });
const address = await app.listen({ host: '127.0.0.1', port: Number(process.env['PORT'] ?? 8080) });
console.log(`reports service on ${address}`);
const stop = () => {
  void app.close().then(() => {
    client.close();
    process.exit(0);
  });
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
