/**
 * The dashboard's vendored chart library is the published package, byte for byte, at the version its README
 * names, and the page loads only assets the coordinator serves (no CDN).
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';

const root = new URL('../../../../', import.meta.url);
const read = (path: string) => readFileSync(new URL(path, root));

describe('coordinator/dashboard', () => {
  it('vendors uplot exactly as the devDependency publishes it', () => {
    const pkg = JSON.parse(read('node_modules/uplot/package.json').toString()) as { version: string };
    const ours = JSON.parse(read('package.json').toString()) as { devDependencies: Record<string, string> };
    expect(ours.devDependencies['uplot']).toBe(pkg.version);
    expect(read('coordinator/dashboard/vendor/README.md').toString()).toContain(
      `npm \`uplot\` ${pkg.version}`,
    );
    for (const file of ['uPlot.iife.min.js', 'uPlot.min.css']) {
      expect(
        read(`coordinator/dashboard/vendor/${file}`).equals(read(`node_modules/uplot/dist/${file}`)),
      ).toBe(true);
    }
    expect(read('coordinator/dashboard/vendor/uPlot.LICENSE').toString()).toContain('The MIT License');
  });

  it('loads every script and style from /dashboard/assets/', () => {
    const html = read('coordinator/dashboard/index.html').toString();
    const all = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map((m) => m[1]!);
    // The icon is empty and inline (no request, no 404 for /favicon.ico); the rest are the page's assets.
    expect(all.filter((ref) => ref === 'data:,')).toHaveLength(1);
    expect(html).toContain('<link rel="icon" href="data:," />');
    const refs = all.filter((ref) => ref !== 'data:,');
    expect(refs.length).toBe(4);
    for (const ref of refs) expect(ref).toMatch(/^\/dashboard\/assets\/[\w.]+$/);
    const routes = read('coordinator/http/dashboard-routes.ts').toString();
    for (const ref of refs) expect(routes).toContain(`'${ref.split('/').at(-1)!}'`);
  });
});
