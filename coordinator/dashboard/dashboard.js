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
  token: sessionStorage.getItem(TOKEN_KEY),
  policy: null,
  charts: {},
  timer: null,
  regions: [],
};

class Unauthorized extends Error {}

async function api(path) {
  const res = await fetch(path, {
    headers: { authorization: `Bearer ${state.token}`, accept: 'application/json' },
  });
  if (res.status === 401) throw new Unauthorized('the token was refused');
  // A proxy's or a restarting server's answer may not be JSON: say its status, not the parser's complaint.
  const json = /json/.test(res.headers.get('content-type') ?? '');
  const body = json ? await res.json() : {};
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

async function refresh() {
  const [allocations, regions, audit] = await Promise.all([
    api('/v1/allocations'),
    api('/v1/regions'),
    // Operators' changes: the rebalancer's moves are left out (counted below the table; the moves table lists them).
    api('/v1/audit?limit=15&moves=hide'),
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
    drawHistory((await api(`/v1/allocations/history?policy=${encodeURIComponent(state.policy)}`)).samples);
  $('status').textContent = `updated ${new Date(now).toLocaleTimeString()} · every ${POLL_MS / 1000}s`;
}

async function tick() {
  try {
    await refresh();
  } catch (error) {
    if (error instanceof Unauthorized) return signOut('The token was refused: sign in again.');
    $('status').textContent = `update failed: ${error.message}; retrying`;
  }
  state.timer = setTimeout(tick, POLL_MS);
}

// ---- sign in and out ---------------------------------------------------------------------------------------

function signOut(message = '') {
  clearTimeout(state.timer);
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  $('board').hidden = true;
  $('logout').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message;
}

async function signIn(token, saved = false) {
  state.token = token;
  try {
    await api('/v1/regions');
  } catch (error) {
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
  sessionStorage.setItem(TOKEN_KEY, token);
  $('login').hidden = true;
  $('board').hidden = false;
  $('logout').hidden = false;
  await tick();
}

$('login').addEventListener('submit', (event) => {
  event.preventDefault();
  void signIn($('token').value.trim());
});
$('logout').addEventListener('click', () => signOut());
$('policy').addEventListener('change', (event) => {
  state.policy = event.target.value;
});

if (state.token) void signIn(state.token, true);
else signOut();
