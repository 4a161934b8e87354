/**
 * The Grafana dashboard and the Prometheus alert rules of ops/: every expression parses as PromQL (the
 * Prometheus project's own lezer grammar, @prometheus-io/lezer-promql; promtool has no Debian package here),
 * the rules file has the shape Prometheus loads, the alerts the operators need are there, and every metric and
 * label they query exists in the real agents' and coordinator's /metrics.
 */
import { readFileSync } from 'node:fs';
import { parser } from '@prometheus-io/lezer-promql';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { zeroCounters } from '../../../core/lease/engine-counters.js';
import { decide, startStack, type ServiceStack } from '../../helpers/fixture/index.js';

const ROOT = new URL('../../../', import.meta.url);
const read = (path: string) => readFileSync(new URL(path, ROOT), 'utf8');

interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}
const rulesFile = parseYaml(read('ops/prometheus/alerts.yml')) as {
  groups: { name: string; rules: Rule[] }[];
};
const rules = rulesFile.groups.flatMap((g) => g.rules);

interface Panel {
  title: string;
  type: string;
  targets?: { expr: string }[];
  panels?: Panel[];
}
const dashboard = JSON.parse(read('ops/grafana/quotaplane-dashboard.json')) as {
  uid: string;
  panels: Panel[];
  templating: { list: { name: string; query?: string | { query: string } }[] };
};
const panels = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]);

/** Grafana's variables replaced by values Prometheus would see. */
function grafanaToPromql(expr: string): string {
  return expr.replace(/\$__rate_interval|\$__interval/g, '1m').replace(/\$\{?(\w+)\}?/g, '.*');
}

const expressions: { where: string; expr: string }[] = [
  ...rules.map((r) => ({ where: `alert ${r.alert ?? r.record}`, expr: r.expr })),
  ...panels.flatMap((p) =>
    (p.targets ?? []).map((t) => ({ where: `panel "${p.title}"`, expr: grafanaToPromql(t.expr) })),
  ),
  ...dashboard.templating.list
    .filter((v) => typeof v.query === 'object')
    .map((v) => ({
      where: `variable ${v.name}`,
      expr: (v.query as { query: string }).query.replace(/^label_values\((\w+),\s*\w+\)$/, '$1'),
    })),
];

interface Selector {
  metric: string;
  labels: string[];
  values: Record<string, string>;
}

/** Syntax errors and vector selectors of one PromQL expression. */
function analyse(expr: string): { errors: string[]; selectors: Selector[] } {
  const tree = parser.parse(expr);
  const errors: string[] = [];
  const selectors: Selector[] = [];
  const text = (from: number, to: number) => expr.slice(from, to);
  tree.iterate({
    enter(node) {
      if (node.type.isError) errors.push(`syntax error at ${node.from}: "${text(node.from, node.to + 10)}"`);
      if (node.name !== 'VectorSelector') return;
      const id = node.node.getChild('Identifier');
      const selector: Selector = { metric: id === null ? '' : text(id.from, id.to), labels: [], values: {} };
      const matchers = node.node.getChild('LabelMatchers');
      for (const m of matchers?.getChildren('UnquotedLabelMatcher') ?? []) {
        const name = m.getChild('LabelName')!;
        const value = m.getChild('StringLiteral')!;
        const label = text(name.from, name.to);
        selector.labels.push(label);
        selector.values[label] = JSON.parse(text(value.from, value.to)) as string;
      }
      selectors.push(selector);
    },
  });
  return { errors, selectors };
}

/** Series Prometheus makes itself, not any target: `up` per scrape target. */
const SYNTHETIC = new Set(['up']);
/** Labels a scrape adds (job, instance) or that ops/prometheus/prometheus.yml puts on every agent target. */
const TARGET_LABELS = new Set(['job', 'instance', 'region']);

describe('ops/prometheus/alerts.yml', () => {
  it('has the shape Prometheus loads: named groups of alerts with expr, for, severity and summary', () => {
    expect(rulesFile.groups.length).toBeGreaterThan(0);
    const names = new Set<string>();
    for (const g of rulesFile.groups) {
      expect(g.name).toMatch(/^[a-z][a-z-]+$/);
      for (const r of g.rules) {
        expect(Object.keys(r).sort()).toEqual(
          expect.arrayContaining(['alert', 'expr', 'labels', 'annotations']),
        );
        expect(
          Object.keys(r).every((k) => ['alert', 'expr', 'for', 'labels', 'annotations'].includes(k)),
        ).toBe(true);
        expect(r.alert).toMatch(/^Quotaplane[A-Z][A-Za-z]+$/);
        expect(names.has(r.alert!)).toBe(false);
        names.add(r.alert!);
        if (r.for !== undefined) expect(r.for).toMatch(/^\d+(ms|s|m|h)$/);
        expect(['critical', 'warning']).toContain(r.labels?.['severity']);
        expect(r.annotations?.['summary']?.length).toBeGreaterThan(10);
      }
    }
  });

  it('alerts on an open breaker, an expired lease, shares not settling, shedding, a coordinator down and unknown policies', () => {
    const names = rules.map((r) => r.alert);
    expect(names).toEqual(
      expect.arrayContaining([
        'QuotaplaneStoreBreakerOpen',
        'QuotaplaneAgentLeaseExpired',
        'QuotaplaneSharesNotSettling',
        'QuotaplaneShedRate',
        'QuotaplaneCoordinatorDown',
        'QuotaplaneUnknownPolicy',
      ]),
    );
  });
});

describe('every expression of the alerts and the dashboard', () => {
  it.each(expressions)('$where parses as PromQL', ({ expr }) => {
    const { errors, selectors } = analyse(expr);
    expect(errors).toEqual([]);
    expect(selectors.length).toBeGreaterThan(0);
    expect(selectors.every((s) => s.metric !== '')).toBe(true);
  });

  it('names only counters the coordinator engine keeps', () => {
    const known = Object.keys(zeroCounters());
    for (const { expr } of expressions) {
      for (const s of analyse(expr).selectors.filter(
        (s) => s.metric === 'quotaplane_protocol_engine_counter',
      )) {
        for (const c of s.values['counter']!.split('|')) expect(known).toContain(c);
      }
    }
  });

  it('catches a misspelt expression (the parser is not lenient)', () => {
    expect(analyse('sum by (region (rate(quotaplane_decisions_total[5m]))').errors.length).toBeGreaterThan(0);
    expect(analyse('rate(quotaplane_decisions_total{decision="allowed"[5m])').errors.length).toBeGreaterThan(
      0,
    );
  });
});

describe('every metric they query exists in /metrics', () => {
  let stack: ServiceStack;
  let exposition: Map<string, string>;
  let labels: Map<string, Set<string>>;

  beforeAll(async () => {
    stack = await startStack({ agentsPerRegion: 1 });
    await stack.putPolicy('ops-metrics', { capacity: 3, refillPerSecond: 1 });
    await stack.ready(['ops-metrics']);
    const agent = stack.agents[0]!;
    for (let i = 0; i < 2; i++) await decide(agent.url, { policy: 'ops-metrics', subject: 's', cost: 1 });
    await decide(agent.url, { policy: 'ops-metrics', subject: 'bad subject!' });
    exposition = new Map();
    labels = new Map();
    const scrape = async (
      url: string,
      registries: { getMetricsAsArray(): { name: string; labelNames?: readonly string[] }[] }[],
    ) => {
      const text = await (await fetch(`${url}/metrics`)).text();
      for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) exposition.set(m[1]!, m[2]!);
      for (const r of registries) {
        for (const metric of r.getMetricsAsArray()) labels.set(metric.name, new Set(metric.labelNames ?? []));
      }
    };
    await scrape(agent.url, [agent.running.agent.metrics.registry]);
    await scrape(stack.coordinator.url, [stack.coordinator.app.metrics.registry]);
  }, 60_000);
  afterAll(async () => {
    await stack?.[Symbol.asyncDispose]();
  });

  /** Metrics and labels of `checked` that neither service exposes, one line each. */
  function missingFrom(checked: readonly { where: string; expr: string }[]): string[] {
    const missing: string[] = [];
    for (const { where, expr } of checked) {
      for (const s of analyse(expr).selectors) {
        if (SYNTHETIC.has(s.metric)) continue;
        const histogram = /_(bucket|sum|count)$/.exec(s.metric);
        const base =
          histogram !== null && exposition.get(s.metric.slice(0, histogram.index)) === 'histogram'
            ? s.metric.slice(0, histogram.index)
            : s.metric;
        if (!exposition.has(base)) {
          missing.push(`${where}: ${s.metric}`);
          continue;
        }
        const known = labels.get(base) ?? new Set<string>();
        for (const l of s.labels) {
          if (!known.has(l) && !TARGET_LABELS.has(l)) missing.push(`${where}: ${s.metric} has no label ${l}`);
        }
      }
    }
    return missing;
  }

  it('in an agent or the coordinator, with the labels the expressions match on', () => {
    expect(missingFrom(expressions)).toEqual([]);
    // The check sees both services: one metric of each, by name.
    expect(exposition.get('quotaplane_decisions_total')).toBe('counter');
    expect(exposition.get('quotaplane_shares_issued')).toBe('gauge');
  });

  it('would notice a metric that does not exist, or a label it does not have', () => {
    const misspelt = parseYaml(`
      - alert: QuotaplaneMisspelt
        expr: sum by (region) (rate(quotaplane_decisions_totals[5m])) > 0
      - alert: QuotaplaneWrongLabel
        expr: sum by (region) (rate(quotaplane_shed_decisions_total{tenant="a"}[5m])) > 0
      - alert: QuotaplaneFine
        expr: sum by (region) (rate(quotaplane_shed_decisions_total{cause="in_flight"}[5m])) > 0
    `) as Rule[];
    expect(missingFrom(misspelt.map((r) => ({ where: `alert ${r.alert}`, expr: r.expr })))).toEqual([
      'alert QuotaplaneMisspelt: quotaplane_decisions_totals',
      'alert QuotaplaneWrongLabel: quotaplane_shed_decisions_total has no label tenant',
    ]);
  });
});
