import { AgentClient } from '@quotaplane/client';
import { buildReportsApp } from './examples/reports-service/app.js';
const client = new AgentClient({ baseUrl: 'http://127.0.0.1:7101' });
const app = await buildReportsApp({ client });
app.get('/stats', (_req, reply) => reply.send(client.stats()));
await app.listen({ host: '127.0.0.1', port: 8080 });
console.log('up');
