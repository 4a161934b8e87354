/**
 * `/dashboard`: the operators' live page, served from coordinator/dashboard/ (read into memory at start). The
 * page and its assets hold no data and need no token; the page signs in with the read token, keeps it in the
 * tab's sessionStorage and reads the admin API with it as a bearer token, so the API's own authentication
 * guards every number it shows. A strict Content-Security-Policy allows only this origin's scripts and fetches.
 */
import { readFileSync } from 'node:fs';
import type { AdminApp } from './admin-app.js';

const DIR = new URL('../dashboard/', import.meta.url);

const ASSETS: Record<string, { path: string; type: string }> = {
  'dashboard.js': { path: 'dashboard.js', type: 'text/javascript; charset=utf-8' },
  'dashboard.css': { path: 'dashboard.css', type: 'text/css; charset=utf-8' },
  'uPlot.iife.min.js': { path: 'vendor/uPlot.iife.min.js', type: 'text/javascript; charset=utf-8' },
  'uPlot.min.css': { path: 'vendor/uPlot.min.css', type: 'text/css; charset=utf-8' },
};

export const DASHBOARD_CSP =
  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
  "form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

export function registerDashboardRoutes(app: AdminApp): void {
  const page = readFileSync(new URL('index.html', DIR));
  const assets = new Map(
    Object.entries(ASSETS).map(([name, a]) => [
      name,
      { body: readFileSync(new URL(a.path, DIR)), type: a.type },
    ]),
  );
  const headers = {
    'content-security-policy': DASHBOARD_CSP,
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'cache-control': 'no-cache',
  };
  app.get('/dashboard', { schema: { hide: true } }, (_request, reply) =>
    reply.headers(headers).type('text/html; charset=utf-8').send(page),
  );
  app.get<{ Params: { file: string } }>(
    '/dashboard/assets/:file',
    { schema: { hide: true } },
    (request, reply) => {
      const asset = assets.get(request.params.file);
      if (asset === undefined) return reply.callNotFound();
      return reply.headers(headers).type(asset.type).send(asset.body);
    },
  );
}
