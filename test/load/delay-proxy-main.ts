/**
 * A delaying TCP proxy as its own process (`tsx test/load/delay-proxy-main.ts HOST PORT DELAY_MS`), so the
 * delay it adds is not stretched by the load generator's busy event loop. Prints its port on the first line;
 * exits on SIGTERM.
 */
import { tcpProxy } from '../helpers/tcp-proxy.js';

const [host, port, delay] = process.argv.slice(2);
const proxy = await tcpProxy({ host: host ?? '127.0.0.1', port: Number(port) }, { delayMs: Number(delay) });
console.log(proxy.port);
process.once('SIGTERM', () => {
  void proxy[Symbol.asyncDispose]().then(() => process.exit(0));
});
