/**
 * Minimal, dependency-free SVG line charts. Hand-drawn on purpose: the charts are a few polylines and axes, a
 * charting library (vega and its canvas fallbacks) would outweigh the simulator, and fixed number formatting keeps
 * every byte of the output a function of the seed.
 */

export interface Series {
  label: string;
  color: string;
  points: readonly (readonly [number, number])[];
  dashed?: boolean;
  /** Stroke width (default 1.5): wider lines drawn first stay visible under narrower ones they coincide with. */
  width?: number;
  /** Draw a dot and this label at each point (sweeps). */
  pointLabels?: readonly string[];
  /** Draw a dot at each point (and in the legend), labelled or not. */
  dots?: boolean;
}

export interface ChartOptions {
  title: string;
  xLabel: string;
  yLabel: string;
  series: readonly Series[];
  width?: number;
  height?: number;
  /** Span the data with a margin instead of starting y at 0. */
  tight?: boolean;
  /** Force the y range to include these values. */
  yInclude?: readonly number[];
  xInclude?: readonly number[];
  /** Text size, px (default 11); margins and rows grow with it. */
  fontSize?: number;
}

const BASE_FONT = 11;
const BASE_PAD = { left: 64, right: 16, top: 34, bottom: 46 };
const BASE_LEGEND_ROW = 16;
const LEGEND_COLUMNS = 3;

/** Fixed, locale-free number text. */
export function fmt(x: number): string {
  if (x === 0) return '0';
  const a = Math.abs(x);
  if (a >= 1e6 || a < 1e-3) return x.toExponential(2);
  return String(Math.round(x * 1000) / 1000);
}

function esc(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** About five round ticks covering [lo, hi]. */
export function niceTicks(lo: number, hi: number): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / 5;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const ticks: number[] = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push(Math.round(t / step) * step);
  return ticks;
}

function extent(values: readonly number[]): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo === Infinity) return [0, 1];
  if (lo === hi) return [lo - 1, hi + 1];
  return [lo, hi];
}

/** One chart as an SVG `<g>` of the given size (place it with a transform). */
export function chartGroup(o: ChartOptions): { svg: string; width: number; height: number } {
  const font = o.fontSize ?? BASE_FONT;
  const k = font / BASE_FONT;
  /** A length scaled with the font, whole pixels. */
  const px = (n: number) => Math.round(n * k);
  const PAD = {
    left: px(BASE_PAD.left),
    right: px(BASE_PAD.right),
    top: px(BASE_PAD.top),
    bottom: px(BASE_PAD.bottom),
  };
  const LEGEND_ROW = px(BASE_LEGEND_ROW);
  const width = o.width ?? 760;
  const legendRows = Math.ceil(o.series.length / LEGEND_COLUMNS);
  const height = (o.height ?? 300) + legendRows * LEGEND_ROW;
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom - legendRows * LEGEND_ROW;
  const xs = o.series.flatMap((s) => s.points.map((p) => p[0])).concat(o.xInclude ?? []);
  const ys = o.series
    .flatMap((s) => s.points.map((p) => p[1]))
    .concat(o.yInclude ?? (o.tight === true ? [] : [0]));
  const [xLo, xHi] = extent(xs);
  const [yLo, yHi] = extent(ys);
  // A tight chart spans its data (and what it must include) with a margin; the others start y at 0.
  const margin = o.tight === true ? 0.06 : 0;
  const x0 = xLo - (xHi - xLo) * margin;
  const x1 = xHi + (xHi - xLo) * margin;
  const y0 = o.tight === true ? yLo - (yHi - yLo) * margin : Math.min(0, yLo);
  const y1 = yHi + (yHi - y0) * 0.05;
  const sx = (x: number) => PAD.left + ((x - x0) / (x1 - x0)) * plotW;
  const sy = (y: number) => PAD.top + plotH - ((y - y0) / (y1 - y0)) * plotH;
  const out: string[] = [];
  out.push(
    `<text x="${width / 2}" y="${px(18)}" text-anchor="middle" font-weight="bold">${esc(o.title)}</text>`,
  );
  out.push(
    `<rect x="${PAD.left}" y="${PAD.top}" width="${plotW}" height="${plotH}" fill="none" stroke="#999" stroke-width="0.5"/>`,
  );
  for (const t of niceTicks(x0, x1)) {
    const x = sx(t).toFixed(1);
    out.push(`<line x1="${x}" y1="${PAD.top + plotH}" x2="${x}" y2="${PAD.top + plotH + 4}" stroke="#666"/>`);
    out.push(`<text x="${x}" y="${PAD.top + plotH + px(16)}" text-anchor="middle">${fmt(t)}</text>`);
  }
  for (const t of niceTicks(y0, y1)) {
    const y = sy(t).toFixed(1);
    out.push(`<line x1="${PAD.left}" y1="${y}" x2="${PAD.left + plotW}" y2="${y}" stroke="#eee"/>`);
    out.push(
      `<text x="${PAD.left - 6}" y="${y}" text-anchor="end" dominant-baseline="middle">${fmt(t)}</text>`,
    );
  }
  out.push(
    `<text x="${PAD.left + plotW / 2}" y="${PAD.top + plotH + px(34)}" text-anchor="middle">${esc(o.xLabel)}</text>`,
  );
  out.push(
    `<text transform="translate(${px(14)} ${PAD.top + plotH / 2}) rotate(-90)" text-anchor="middle">${esc(o.yLabel)}</text>`,
  );
  for (const s of o.series) {
    if (s.points.length === 0) continue;
    const d = s.points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(' ');
    const dash = s.dashed === true ? ' stroke-dasharray="6 4"' : '';
    out.push(
      `<polyline fill="none" stroke="${s.color}" stroke-width="${s.width ?? 1.5}"${dash} points="${d}"/>`,
    );
    // Points that land on the same spot share one dot and one label.
    const labelled = new Map<string, string[]>();
    s.pointLabels?.forEach((label, i) => {
      const p = s.points[i];
      if (p === undefined) return;
      const at = `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`;
      labelled.set(at, [...(labelled.get(at) ?? []), label]);
    });
    if (s.dots === true && s.pointLabels === undefined) {
      const at = new Set(s.points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`));
      for (const p of at) {
        const [cx, cy] = p.split(',') as [string, string];
        out.push(`<circle cx="${cx}" cy="${cy}" r="${px(4)}" fill="${s.color}"/>`);
      }
    }
    let nth = 0;
    for (const [at, labels] of labelled) {
      const [cx, cy] = at.split(',') as [string, string];
      const right = Number(cx) > PAD.left + plotW * 0.75;
      // Alternate above and below the line, so neighbouring labels do not overprint.
      const dy = nth++ % 2 === 0 ? -6 : 14;
      out.push(`<circle cx="${cx}" cy="${cy}" r="3" fill="${s.color}"/>`);
      out.push(
        `<text x="${cx}" y="${cy}" dx="${right ? -5 : 5}" dy="${dy}" text-anchor="${right ? 'end' : 'start'}" fill="${s.color}">${esc(labels.join(', '))}</text>`,
      );
    }
  }
  o.series.forEach((s, i) => {
    const lx = PAD.left + (i % LEGEND_COLUMNS) * (plotW / LEGEND_COLUMNS);
    const ly = height - 8 - (legendRows - 1 - Math.floor(i / LEGEND_COLUMNS)) * LEGEND_ROW;
    const dash = s.dashed === true ? ' stroke-dasharray="6 4"' : '';
    out.push(
      `<line x1="${lx}" y1="${ly - px(4)}" x2="${lx + px(18)}" y2="${ly - px(4)}" stroke="${s.color}" stroke-width="2"${dash}/>`,
    );
    if (s.dots === true)
      out.push(`<circle cx="${lx + px(9)}" cy="${ly - px(4)}" r="${px(4)}" fill="${s.color}"/>`);
    out.push(`<text x="${lx + px(22)}" y="${ly}">${esc(s.label)}</text>`);
  });
  const svg = out.join('\n');
  return { svg: font === BASE_FONT ? svg : `<g font-size="${font}">\n${svg}\n</g>`, width, height };
}

/** Charts stacked vertically in one standalone SVG document. */
export function svgDocument(charts: readonly ChartOptions[]): string {
  const groups = charts.map(chartGroup);
  const width = Math.max(...groups.map((g) => g.width));
  let y = 0;
  const body = groups.map((g) => {
    const part = `<g transform="translate(0 ${y})">\n${g.svg}\n</g>`;
    y += g.height + 10;
    return part;
  });
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}" font-family="sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    ...body,
    '</svg>',
    '',
  ].join('\n');
}
