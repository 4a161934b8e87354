// The quotaplane dashboard: signs in with a token kept in sessionStorage (this tab only), then polls the admin
// API once a second and draws shares, demand and rates per region with uPlot. It only reads: every request is a
// GET with the token as a bearer credential, and nothing of the API is reachable without one.
/* global uPlot */
'use strict';

const TOKEN_KEY = 'quotaplane.token';
// `?interval=MS`, from 250 ms to an hour. Browsers keep a timer's delay in 32 bits: a larger one (or Infinity)
// fired at once, and a tab polled the API about 200 times a second.
const POLL_MS = pollPeriod(new URLSearchParams(location.search).get('interval'));
const COLOURS = ['#2f6fdf', '#d9480f', '#2b8a3e', '#862e9c', '#e8590c', '#1098ad', '#5c940d', '#c2255c'];

function pollPeriod(asked) {
  const ms = Number(asked);
  return asked !== null && Number.isFinite(ms) && ms > 0 ? Math.min(Math.max(250, ms), 3_600_000) : 1000;
}

const $ = (id) => document.getElementById(id);
const state = {
  // The signed-in session: its token, the AbortController of its requests, its poll timer, and whether a refresh
  // is running (`busy`) or was asked for meanwhile (`again`). Null when signed out. Signing out or in replaces
  // it: a refresh or timer of an older session sees that and stops, and its requests in flight are aborted, so
  // nothing is ever sent without a token (`Bearer null`) after a sign-out.
  session: null,
  policy: null,
  charts: {},
  regions: [],
};

class Unauthorized extends Error {}
/** The session a request belonged to ended (signed out, or in again) before its answer was read. */
class SessionEnded extends Error {}

function newSession(token) {
  endSession();
  state.session = { token, controller: new AbortController(), timer: null, busy: false, again: false };
  return state.session;
}

function endSession() {
  const session = state.session;
  if (session === null) return;
  state.session = null;
  clearTimeout(session.timer);
  session.controller.abort();
}

async function api(path, session) {
  if (session !== state.session) throw new SessionEnded('signed out');
  let res, json, body;
  try {
    res = await fetch(path, {
      headers: { authorization: `Bearer ${session.token}`, accept: 'application/json' },
      signal: session.controller.signal,
    });
    // A proxy's or a restarting server's answer may not be JSON: say its status, not the parser's complaint.
    // Every body is read to its end, so a later sign-out has nothing of a finished request left to abort.
    json = /json/.test(res.headers.get('content-type') ?? '');
    body = json ? await res.json() : (await res.text(), {});
  } catch (error) {
    if (session !== state.session) throw new SessionEnded('signed out');
    throw error;
  }
  if (session !== state.session) throw new SessionEnded('signed out');
  if (res.status === 401) throw new Unauthorized('the token was refused');
  if (!res.ok) throw new Error(`${body.code ?? res.status}: ${body.detail ?? res.statusText}`);
  if (!json) throw new Error(`${res.status}: the answer is not JSON`);
  return body;
}

function el(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function row(cells, numeric = []) {
  const tr = document.createElement('tr');
  cells.forEach((c, i) =>
    tr.appendChild(c instanceof Node ? wrap(c) : el('td', c ?? '—', numeric.includes(i) ? 'num' : '')),
  );
  return tr;
}
function wrap(node) {
  const td = document.createElement('td');
  td.appendChild(node);
  return td;
}
function fill(tableId, rows) {
  const body = $(tableId).querySelector('tbody');
  body.replaceChildren(...rows);
}

const pct = (s) => (s === null || s === undefined ? '—' : `${(Math.round(s * 10000) / 100).toFixed(2)}%`);
function ago(iso, now = Date.now()) {
  if (!iso) return '—';
  const d = (now - Date.parse(iso)) / 1000;
  const a = Math.abs(d);
  // 9.96 s is "10s", not "10.0s": round first, then choose the form.
  const tenths = Math.round(a * 10) / 10;
  const n = tenths < 10 ? tenths.toFixed(1) : Math.round(a);
  return d >= 0 ? `${n}s ago` : `in ${n}s`;
}
function health(region) {
  const known = (region.agentDetails ?? []).length;
  if (region.lastReportAt === null && known === 0) return 'silent';
  if (region.agents === 0) return 'down';
  return region.agents < known ? 'degraded' : 'ok';
}

// ---- charts ----------------------------------------------------------------------------------------------

function chart(id, regions, unitLabel) {
  const target = $(id);
  const width = Math.max(320, target.clientWidth || 420);
  const series = [
    {},
    ...regions.map((r, i) => ({ label: r, stroke: COLOURS[i % COLOURS.length], width: 2 })),
  ];
  return new uPlot(
    { width, height: 220, series, axes: [{}, { label: unitLabel, size: 60 }], scales: { x: { time: true } } },
    [[], ...regions.map(() => [])],
    target,
  );
}

function ratesChart(id, regions) {
  const target = $(id);
  const width = Math.max(320, target.clientWidth || 420);
  const series = [{}];
  regions.forEach((r, i) => {
    series.push({ label: `${r} admitted`, stroke: COLOURS[i % COLOURS.length], width: 2 });
    series.push({ label: `${r} refused`, stroke: COLOURS[i % COLOURS.length], width: 1, dash: [6, 4] });
  });
  return new uPlot(
    { width, height: 220, series, axes: [{}, { size: 60 }], scales: { x: { time: true } } },
    [[], ...series.slice(1).map(() => [])],
    target,
  );
}

function buildCharts(regions) {
  for (const c of Object.values(state.charts)) c.destroy();
  state.charts = {
    shares: chart('chart-shares', regions, 'share'),
    demand: chart('chart-demand', regions, 'tokens/s'),
    rates: ratesChart('chart-rates', regions),
  };
  state.regions = regions;
}

function drawHistory(samples) {
  const regions = state.regions;
  const x = samples.map((s) => Date.parse(s.at) / 1000);
  const by = (key) => regions.map((r) => samples.map((s) => s[key][r] ?? 0));
  state.charts.shares.setData([x, ...by('shares')]);
  state.charts.demand.setData([x, ...by('demand')]);
  const rates = [];
  for (const r of regions) {
    rates.push(samples.map((s) => s.admitted[r] ?? 0));
    rates.push(samples.map((s) => s.refused[r] ?? 0));
  }
  state.charts.rates.setData([x, ...rates]);
  // What the chart shows last, for readers of the page's state (and its tests).
  const last = samples.at(-1);
  $('chart-shares').dataset.points = String(samples.length);
  $('chart-shares').dataset.latest = last ? JSON.stringify(last.shares) : '{}';
}

// ---- one refresh ------------------------------------------------------------------------------------------

async function refresh(session) {
  const [allocations, regions, audit] = await Promise.all([
    api('/v1/allocations', session),
    api('/v1/regions', session),
    // Operators' changes: the rebalancer's moves are left out (counted below the table; the moves table lists them).
    api('/v1/audit?limit=15&moves=hide', session),
  ]);
  const names = allocations.policies.map((p) => p.policy).sort();
  const select = $('policy');
  if (names.join() !== [...select.options].map((o) => o.value).join()) {
    select.replaceChildren(...names.map((n) => el('option', n)));
    if (!names.includes(state.policy)) state.policy = names[0] ?? null;
    select.value = state.policy ?? '';
  }
  const regionNames = regions.regions.map((r) => r.region);
  if (regionNames.join() !== state.regions.join()) buildCharts(regionNames);

  const now = Date.now();
  const current = allocations.policies.find((p) => p.policy === state.policy);
  $('budget').textContent = current?.budget
    ? `budget: capacity ${current.budget.capacity}, refill ${current.budget.refillPerSecond}/s, epoch ${current.epoch}`
    : '';
  fill(
    'regions',
    regions.regions.map((r) => {
      const a = current?.regions?.[r.region];
      const h = health(r);
      return row(
        [
          r.region,
          el('span', h, h),
          pct(a?.share),
          a?.pending === null || a?.pending === undefined ? '—' : pct(a.pending),
          a?.capacity,
          a?.refillPerSecond,
          a?.demandPerSecond,
          a?.admittedPerSecond,
          a?.refusedPerSecond,
          r.shedPerSecond,
          a ? a.lease.holders.join(', ') || '—' : '—',
          r.reportLagMs === null ? '—' : `${Math.round(r.reportLagMs)} ms`,
        ],
        [4, 5, 6, 7, 8, 9],
      );
    }),
  );
  fill(
    'agents',
    regions.regions.flatMap((r) =>
      (r.agentDetails ?? []).map((a) =>
        row(
          [
            r.region,
            a.instance,
            el('span', a.lapsed ? 'lapsed' : 'live', a.lapsed ? 'down' : 'ok'),
            ago(a.lastHeartbeatAt, now),
            ago(a.leaseUntil, now),
            a.shedPerSecond,
          ],
          [5],
        ),
      ),
    ),
  );
  // One column per region: its share before → after the move.
  const head = $('moves').querySelector('thead tr');
  const wanted = ['When', 'Reason', ...regionNames];
  if ([...head.children].map((th) => th.textContent).join() !== wanted.join())
    head.replaceChildren(...wanted.map((h) => el('th', h)));
  fill(
    'moves',
    (current?.moves ?? []).map((m) =>
      row(
        [
          ago(m.at, now),
          m.reason,
          ...regionNames.map((r) => `${m.from ? `${pct(m.from[r])} → ` : ''}${pct(m.to[r])}`),
        ],
        regionNames.map((_, i) => i + 2),
      ),
    ),
  );
  fill(
    'audit',
    audit.entries.map((e) => row([ago(e.at, now), `${e.actor.name} (${e.actor.role})`, e.action, e.policy])),
  );
  const hidden = audit.movesHidden ?? 0;
  $('audit-moves').textContent = `${hidden} rebalancer ${hidden === 1 ? 'move' : 'moves'} left out`;
  if (state.policy !== null)
    drawHistory(
      (await api(`/v1/allocations/history?policy=${encodeURIComponent(state.policy)}`, session)).samples,
    );
  $('status').textContent = `updated ${new Date(now).toLocaleTimeString()} · every ${POLL_MS / 1000}s`;
}

/**
 * One refresh of `session`, then the next one POLL_MS later; nothing once the session ended. A refresh asked for
 * while one runs (a policy chosen) follows it at once rather than running beside it.
 */
async function tick(session) {
  if (session !== state.session) return;
  clearTimeout(session.timer);
  if (session.busy) {
    session.again = true;
    return;
  }
  session.busy = true;
  try {
    await refresh(session);
  } catch (error) {
    if (session !== state.session) return;
    if (error instanceof Unauthorized) return signOut('The token was refused: sign in again.');
    $('status').textContent = `update failed: ${error.message}; retrying`;
  } finally {
    session.busy = false;
  }
  if (session !== state.session) return;
  if (session.again) {
    session.again = false;
    return tick(session);
  }
  session.timer = setTimeout(() => void tick(session), POLL_MS);
}

// ---- sign in and out ---------------------------------------------------------------------------------------

function signOut(message = '') {
  endSession();
  sessionStorage.removeItem(TOKEN_KEY);
  $('board').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message;
}

async function signIn(token, saved = false) {
  const session = newSession(token);
  try {
    await api('/v1/regions', session);
  } catch (error) {
    // Signed out, or in again, meanwhile: that one decides.
    if (session !== state.session) return;
    // Only a refused token signs out. A coordinator that does not answer (restarting, behind a 503) keeps a
    // token this tab saved: the board shows the failure and keeps retrying, as it does once signed in.
    if (error instanceof Unauthorized || !saved) {
      signOut(
        error instanceof Unauthorized
          ? 'That token was refused.'
          : `The coordinator did not answer: ${error.message}`,
      );
      return;
    }
  }
  if (session !== state.session) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('login').hidden = true;
  $('board').hidden = false;
  $('logout').hidden = false;
  await tick(session);
}

$('login').addEventListener('submit', (event) => {
  event.preventDefault();
  void signIn($('token').value.trim());
});
$('logout').addEventListener('click', () => signOut());
$('policy').addEventListener('change', (event) => {
  state.policy = event.target.value;
  // The chosen policy's figures now, not at the next poll (an hour away with ?interval=3600000).
  if (state.session !== null) void tick(state.session);
});

const saved = sessionStorage.getItem(TOKEN_KEY);
if (saved) void signIn(saved, true);
else signOut();
