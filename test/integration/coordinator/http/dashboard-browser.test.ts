/// <reference lib="dom" />
/**
 * The live dashboard in a real headless Chromium (Debian's chromium driven by playwright-core) against a real
 * coordinator and agents on NATS and Redis: the page signs in with the read token, loads without a console
 * error, and its share chart moves when the test shifts traffic from one region to another. It saves a
 * screenshot (docs/images/dashboard.png with QP_DASHBOARD_SCREENSHOT=docs/images/dashboard.png).
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { DASHBOARD_CSP } from '../../../../coordinator/http/dashboard-routes.js';
import { INSTALL_LINE, missingReason } from '../../../harness/system-packages.js';
import { READ_TOKEN } from '../../../helpers/coordinator-fixture.js';
import { decide, startStack, type ServiceStack } from '../../../helpers/fixture/index.js';
import { eventually } from '../../../helpers/wait.js';

const CHROMIUM = '/usr/bin/chromium';
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

let stack: ServiceStack;
let context: BrowserContext;
let profile: string;
const problems: string[] = [];

beforeAll(async () => {
  // The global setup installs chromium when it is missing and it can (test/harness/system-packages.ts).
  const why = missingReason(inject('missingPackages'), 'chromium');
  if (why !== undefined || !existsSync(CHROMIUM))
    throw new Error(why ?? `${CHROMIUM} is missing: ${INSTALL_LINE}`);
  stack = await startStack({ agentsPerRegion: 1 });
  // A short idle TTL: a region that shrank may grow again 3.5 s later (the regrowth cool-down is the TTL).
  await stack.putPolicy('dash', { capacity: 60, refillPerSecond: 20, idleTtlSeconds: 3 });
  await stack.ready(['dash']);
  profile = mkdtempSync(join(tmpdir(), 'qp-chromium-'));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: FLAGS,
    viewport: { width: 1280, height: 1100 },
  });
}, 90_000);
afterAll(async () => {
  await context?.close();
  await stack?.[Symbol.asyncDispose]();
  if (profile !== undefined) rmSync(profile, { recursive: true, force: true });
});

function watch(page: Page): void {
  page.on('console', (m) => {
    if (m.type() === 'error') problems.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('requestfailed', (r) =>
    problems.push(`request failed: ${r.url()} ${r.failure()?.errorText ?? ''}`),
  );
}

async function latestShares(page: Page): Promise<{ points: number; shares: Record<string, number> }> {
  return page.$eval('#chart-shares', (el) => ({
    points: Number((el as HTMLElement).dataset['points'] ?? 0),
    shares: JSON.parse((el as HTMLElement).dataset['latest'] ?? '{}') as Record<string, number>,
  }));
}

/** Traffic at one region's agent until `done` says so; throws naming `what` once `ms` passed. */
async function driveUntil(
  region: string,
  done: () => Promise<boolean>,
  ms: number,
  what: string,
): Promise<void> {
  const agent = stack.inRegion(region)[0]!;
  let i = 0;
  await eventually(
    async () => {
      // Three tenants, each refused part of what its own rate allows in this region: unmet demand, which is
      // what moves shares (traffic a region serves within its share moves nothing).
      await Promise.all(
        Array.from({ length: 10 }, () =>
          decide(agent.url, { policy: 'dash', subject: `d-${i++ % 3}`, cost: 1 }),
        ),
      );
      return done();
    },
    ms,
    what,
    50,
  );
}

describe('/dashboard in Chromium', () => {
  it('serves the page with a strict CSP and holds no data without a token', async () => {
    const page = await fetch(`${stack.coordinator.url}/dashboard`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-security-policy')).toBe(DASHBOARD_CSP);
    expect(await page.text()).not.toContain('dash"');
    expect((await fetch(`${stack.coordinator.url}/dashboard/assets/uPlot.iife.min.js`)).status).toBe(200);
    expect((await fetch(`${stack.coordinator.url}/dashboard/assets/..%2Fapp.ts`)).status).toBe(404);
    expect((await fetch(`${stack.coordinator.url}/v1/allocations/history?policy=dash`)).status).toBe(401);
  });

  it('refuses a wrong token, signs in with the read token, and follows traffic between regions', async () => {
    const page = await context.newPage();
    watch(page);
    await page.goto(`${stack.coordinator.url}/dashboard?interval=500`);
    await page.waitForSelector('#login:not([hidden])');
    await page.waitForLoadState('networkidle');
    expect(problems, 'the first load').toEqual([]);
    await page.fill('#token', 'not-the-token-of-this-coordinator');
    await page.click('#login button[type=submit]');
    await page.waitForFunction(
      () => document.querySelector('#login-error')?.textContent === 'That token was refused.',
    );
    // The refused sign-in's 401, which the page answers with its message, is reported by Chromium as a failed
    // resource: exactly that one is expected, and taken out; anything else stays and fails the test below.
    const refused =
      'console: Failed to load resource: the server responded with a status of 401 (Unauthorized)';
    expect(problems.filter((p) => p === refused)).toHaveLength(1);
    problems.splice(problems.indexOf(refused), 1);
    expect(problems, 'the refused sign-in').toEqual([]);

    await page.fill('#token', READ_TOKEN);
    await page.click('#login button[type=submit]');
    await page.waitForSelector('#board:not([hidden])');
    await page.waitForFunction(
      () => Number((document.querySelector('#chart-shares') as HTMLElement).dataset['points'] ?? 0) >= 3,
    );
    expect(await page.$eval('#policy', (s) => (s as HTMLSelectElement).value)).toBe('dash');
    expect(await page.locator('#regions tbody tr').count()).toBe(3);
    expect(await page.locator('#agents tbody tr').count()).toBe(3);
    expect(await page.locator('#chart-shares canvas').count()).toBe(1);
    const start = (await latestShares(page)).shares;

    // All traffic in eu: the chart's eu share climbs.
    await driveUntil(
      'eu',
      async () => ((await latestShares(page)).shares['eu'] ?? 0) > (start['eu'] ?? 0) + 0.15,
      30_000,
      `eu share on the chart rose from ${start['eu']}`,
    );
    const afterEu = (await latestShares(page)).shares;
    // Then all of it in ap: ap climbs and eu gives way.
    await driveUntil(
      'ap',
      async () => {
        const s = (await latestShares(page)).shares;
        return (s['ap'] ?? 0) > (afterEu['ap'] ?? 0) + 0.15 && (s['eu'] ?? 1) < (afterEu['eu'] ?? 0) - 0.1;
      },
      30_000,
      `ap share on the chart rose from ${afterEu['ap']}`,
    );
    await page.waitForFunction(() => (document.querySelector('#moves tbody')?.children.length ?? 0) > 1);
    expect(await page.locator('#moves tbody').innerText()).toContain('demand');
    // Moves by column: one per region, each cell its share before → after.
    const heads = await page.locator('#moves thead th').allInnerTexts();
    expect(heads.slice(0, 2)).toEqual(['When', 'Reason']);
    expect(heads.slice(2).sort()).toEqual(['ap', 'eu', 'us']);
    expect(await page.locator('#moves tbody tr').first().locator('td').nth(2).innerText()).toMatch(
      /^(\d+\.\d\d% → )?\d+\.\d\d%$/,
    );
    // The audit table keeps operators' changes: the rebalancer's moves are counted beside it, not listed.
    expect(await page.locator('#audit tbody').innerText()).not.toContain('rebalancer (system)');
    expect(await page.locator('#audit tbody').innerText()).toContain('create');
    expect(await page.locator('#audit-moves').innerText()).toMatch(/^[1-9]\d* rebalancer moves? left out$/);

    await page.screenshot({
      path: process.env['QP_DASHBOARD_SCREENSHOT'] ?? join(profile, 'dashboard.png'),
      fullPage: true,
    });
    expect(problems).toEqual([]);

    // Signing out forgets the token: a reload asks for it again.
    await page.click('#logout');
    await page.reload();
    await page.waitForSelector('#login:not([hidden])');
    expect(await page.evaluate(() => sessionStorage.getItem('quotaplane.token'))).toBeNull();
  }, 120_000);

  it('polls no faster than its floor whatever ?interval says, and keeps its token while the coordinator is down', async () => {
    const page = await context.newPage();
    let calls = 0;
    await page.route('**/v1/**', (route) => {
      calls++;
      return route.continue();
    });
    // 3e9 ms does not fit a browser timer's 32 bits: it fired at once, about 200 calls a second.
    await page.goto(`${stack.coordinator.url}/dashboard?interval=3000000000`);
    await page.waitForSelector('#login:not([hidden])');
    await page.fill('#token', READ_TOKEN);
    await page.click('#login button[type=submit]');
    await page.waitForFunction(() =>
      (document.querySelector('#status')?.textContent ?? '').startsWith('updated'),
    );
    expect(await page.locator('#status').innerText()).toContain('every 3600s');
    const signedIn = calls;
    await page.waitForTimeout(1500);
    expect(calls - signedIn).toBe(0);

    // The coordinator answers 503, and not in JSON, while the tab reloads: the token stays, the board says why.
    await page.unroute('**/v1/**');
    await page.route('**/v1/**', (route) =>
      route.fulfill({ status: 503, contentType: 'text/html', body: '<html>restarting</html>' }),
    );
    await page.goto(`${stack.coordinator.url}/dashboard?interval=500`);
    await page.waitForSelector('#board:not([hidden])');
    await page.waitForFunction(() =>
      (document.querySelector('#status')?.textContent ?? '').startsWith('update failed: 503'),
    );
    expect(await page.evaluate(() => sessionStorage.getItem('quotaplane.token'))).toBe(READ_TOKEN);
    // Back: the board fills again by itself, without a new sign-in.
    await page.unroute('**/v1/**');
    await page.waitForFunction(() =>
      (document.querySelector('#status')?.textContent ?? '').startsWith('updated'),
    );
    expect(await page.locator('#regions tbody tr').count()).toBe(3);
    await page.close();
  }, 60_000);

  it('signed out during a refresh, sends nothing more: no `Bearer null`, no "token was refused"', async () => {
    const page = await context.newPage();
    let signedOut = false;
    const sent: { path: string; authorization: string | undefined; afterSignOut: boolean }[] = [];
    page.on('request', (r) => {
      const url = new URL(r.url());
      if (url.pathname.startsWith('/v1/'))
        sent.push({
          path: url.pathname,
          authorization: r.headers()['authorization'],
          afterSignOut: signedOut,
        });
    });
    await page.goto(`${stack.coordinator.url}/dashboard?interval=250`);
    await page.waitForSelector('#login:not([hidden])');
    await page.fill('#token', READ_TOKEN);
    await page.click('#login button[type=submit]');
    await page.waitForFunction(() =>
      (document.querySelector('#status')?.textContent ?? '').startsWith('updated'),
    );
    // From now on every answer comes 1.5 s late: the next refresh is still waiting when the user signs out.
    const held = new Set<string>();
    await page.route('**/v1/**', async (route) => {
      held.add(new URL(route.request().url()).pathname);
      await new Promise((resolve) => setTimeout(resolve, 1500));
      // The page may have aborted the request meanwhile: then there is nothing left to continue.
      await route.continue().catch(() => undefined);
    });
    // A refresh asks for three things at once (allocations, regions, audit): sign out only once all three are held,
    // so a request the page sent before the click is never taken for one sent after it (it was, under load: the
    // browser reported the second and third requests after the test had marked the sign-out).
    await eventually(
      () => ['/v1/allocations', '/v1/regions', '/v1/audit'].every((path) => held.has(path)),
      5000,
      'a refresh waits for the delayed answers',
      10,
    );
    signedOut = true;
    await page.click('#logout');
    // The held answers are due 1.5 s after they were asked for; then six poll periods more.
    await page.waitForTimeout(3000);

    expect(sent.filter((r) => r.authorization !== `Bearer ${READ_TOKEN}`)).toEqual([]);
    expect(sent.filter((r) => r.afterSignOut)).toEqual([]);
    expect(await page.locator('#login').isVisible()).toBe(true);
    expect(await page.locator('#login-error').textContent()).toBe('');
    expect(await page.evaluate(() => sessionStorage.getItem('quotaplane.token'))).toBeNull();
    await page.close();
  }, 60_000);

  it('shows a policy chosen from the list at once, not at the next poll', async () => {
    await stack.putPolicy('dash-other', { capacity: 30, refillPerSecond: 10 });
    await stack.ready(['dash', 'dash-other']);
    const page = await context.newPage();
    const histories: string[] = [];
    page.on('request', (r) => {
      const url = new URL(r.url());
      if (url.pathname === '/v1/allocations/history') histories.push(url.searchParams.get('policy') ?? '');
    });
    // An hour between polls: only choosing the policy can fetch its figures within the test.
    await page.goto(`${stack.coordinator.url}/dashboard?interval=3600000`);
    await page.waitForSelector('#login:not([hidden])');
    await page.fill('#token', READ_TOKEN);
    await page.click('#login button[type=submit]');
    await page.waitForFunction(() =>
      (document.querySelector('#status')?.textContent ?? '').startsWith('updated'),
    );
    expect(await page.locator('#budget').textContent()).toMatch(/^budget: capacity 60, refill 20\/s,/);
    expect(histories).toEqual(['dash']);

    await page.selectOption('#policy', 'dash-other');
    await page.waitForFunction(
      () => (document.querySelector('#budget')?.textContent ?? '').startsWith('budget: capacity 30,'),
      undefined,
      { timeout: 5000 },
    );
    expect(await page.locator('#budget').textContent()).toMatch(/^budget: capacity 30, refill 10\/s,/);
    expect(histories).toEqual(['dash', 'dash-other']);
    await page.close();
  }, 60_000);
});
