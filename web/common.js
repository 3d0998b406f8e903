// Shared by the console (/) and the admin dashboard (/admin): the API
// client, money formatting, small DOM helpers and SVG charts. Plain ES2020,
// no framework; svd serves these files from its binary.
'use strict';

const KEY_STORAGE = 'sv.apiKey';

// Thrown for a non-2xx answer; carries the REST error body (docs/rest.md).
class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
    this.reason = body && body.reason;
  }
}

async function api(method, path, body) {
  const headers = { 'Accept': 'application/json' };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers['Authorization'] = 'Bearer ' + key;
  const init = { method, headers };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

// A create that may be tried again without making a second one: its
// request id is kept while an attempt ended without a definite answer (no
// answer, a 5xx, 504 or COMMIT_IN_DOUBT: the server may have made it) and
// the same request is sent again, so the retry is answered with what the
// first made. A new id once an answer is definite or the request differs.
// `slot` names the form. (Each click used to send a new id: a create that
// timed out and was clicked again made and billed two instances.)
const pendingCreates = new Map();
async function createOnce(slot, path, request) {
  const text = JSON.stringify(request);
  let pending = pendingCreates.get(slot);
  if (!pending || pending.text !== text) {
    pending = { text, requestId: 'web-' + crypto.randomUUID() };
    pendingCreates.set(slot, pending);
  }
  try {
    const made = await api('POST', path, { ...request, requestId: pending.requestId });
    pendingCreates.delete(slot);
    return made;
  } catch (e) {
    const definite = e instanceof ApiError && e.status < 500 && e.reason !== 'COMMIT_IN_DOUBT';
    if (definite) pendingCreates.delete(slot);
    throw e;
  }
}

// Every item of a paged list: follows nextPageToken until the last page or
// `max` items, so a long list is never silently cut at the first page.
// Returns { items, truncated }.
async function apiAll(path, field, max = 5000) {
  const items = [];
  let token = '';
  for (;;) {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', token ? `${path}${sep}pageToken=${encodeURIComponent(token)}` : path);
    items.push(...(page[field] || []));
    token = page.nextPageToken || '';
    if (!token) return { items, truncated: false };
    if (items.length >= max) return { items, truncated: true };
  }
}

// Micro-yuan (canonical JSON sends int64 as a string) to "¥1,234.57":
// rounded to fen half away from zero, as invoices are (docs/billing.md).
function formatMoney(micros) {
  let v = BigInt(micros || 0);
  const negative = v < 0n;
  if (negative) v = -v;
  const fen = (v + 5000n) / 10000n;
  const yuan = (fen / 100n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const cents = (fen % 100n).toString().padStart(2, '0');
  return (negative ? '-' : '') + '¥' + yuan + '.' + cents;
}

function microsToNumber(micros) { return Number(BigInt(micros || 0)) / 1e6; }

function formatTime(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString();
}

// el('td', {class: 'x', text: 'y'}, child...) builds an element.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') node.textContent = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

// Sets a status line (an element with role="status"); errors get the
// `error` class.
function status(id, text, isError) {
  const line = document.getElementById(id);
  line.textContent = text;
  line.classList.toggle('error', !!isError);
}

function failText(label, e) { return `${label} failed: ${e.message} (${e.reason || e.code || e.status})`; }

function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

// Replaces a table body's rows; `cells` maps an item to a list of cell
// contents (text or nodes).
function fillTable(tbody, items, cells, emptyText) {
  tbody.replaceChildren();
  if (!items.length) {
    const cols = tbody.closest('table').querySelectorAll('thead th').length || 1;
    tbody.append(el('tr', {}, el('td', { colspan: cols, class: 'empty', text: emptyText || 'Nothing yet.' })));
    return;
  }
  for (const item of items) {
    const tr = el('tr');
    for (const c of cells(item)) tr.append(el('td', {}, c));
    tbody.append(tr);
  }
}

// How a chart reads its values: plain numbers, or (`money`) BigInt
// micro-yuan, summed exactly and written with formatMoney, so the chart says
// what the tables say (a float sum of 1,005,000 µ¥ printed 1.00 where
// formatMoney gives ¥1.01). Only the bars' heights use Numbers.
function chartScale(money, unit) {
  return money
    ? { zero: 0n, of: (v) => { const m = BigInt(v || 0); return m > 0n ? m : 0n; },
      toNumber: microsToNumber, text: formatMoney }
    : { zero: 0, of: (v) => Math.max(0, Number(v || 0)),
      toNumber: (v) => v, text: (v) => `${v.toFixed(2)} ${unit}` };
}

// A bar chart in SVG. series: [{label, values, color}] stacked, values as
// chartScale reads them; labels: x labels. The figure also gets a text
// summary for screen readers.
function barChart(container, { labels, series, unit, title, money }) {
  const width = 640, height = 220, left = 64, bottom = 36, top = 12;
  const scale = chartScale(money, unit);
  const totals = labels.map((_, i) => series.reduce((sum, s) => sum + scale.of(s.values[i]), scale.zero));
  const max = Math.max(1e-9, ...totals.map(scale.toNumber));
  const plotW = width - left - 8, plotH = height - top - bottom;
  const band = plotW / Math.max(1, labels.length);
  const svg = svgEl('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', class: 'chart',
    'aria-label': `${title}: ` + labels.map((l, i) => `${l} ${scale.text(totals[i])}`).join(', ') });
  for (let g = 0; g <= 4; g++) {
    const y = top + plotH - (plotH * g) / 4;
    svg.append(svgEl('line', { x1: left, x2: width - 8, y1: y, y2: y, class: 'grid' }));
    svg.append(svgEl('text', { x: left - 6, y: y + 4, 'text-anchor': 'end', class: 'axis' },
      document.createTextNode(((max * g) / 4).toFixed(max < 10 ? 2 : 0))));
  }
  labels.forEach((label, i) => {
    let y = top + plotH;
    const w = Math.max(1, Math.min(56, band * 0.7)), x = left + i * band + (band - w) / 2;
    for (const s of series) {
      const v = scale.of(s.values[i]);
      const h = (plotH * scale.toNumber(v)) / max;
      y -= h;
      const rect = svgEl('rect', { x, y, width: w, height: Math.max(0, h), fill: s.color, class: 'bar' });
      rect.append(svgEl('title', {}, document.createTextNode(`${label} · ${s.label}: ${scale.text(v)}`)));
      svg.append(rect);
    }
    if (labels.length <= 16 || i % Math.ceil(labels.length / 12) === 0) {
      svg.append(svgEl('text', { x: x + w / 2, y: height - bottom + 16, 'text-anchor': 'middle', class: 'axis' },
        document.createTextNode(label)));
    }
  });
  container.replaceChildren(svg);
  if (series.length > 1) {
    const legend = el('ul', { class: 'legend' });
    for (const s of series) {
      const swatch = svgEl('svg', { width: 12, height: 12, 'aria-hidden': 'true' },
        svgEl('rect', { width: 12, height: 12, fill: s.color }));
      legend.append(el('li', {}, swatch, ' ' + s.label));
    }
    container.append(legend);
  }
}

// Sign-in flow shared by both pages: a form with #api-key, a status line,
// and the callback run with the account once the key works. A key stored
// in this tab signs in when the page loads (tryKey below), so signing in
// and out store or remove the key and reload: the next key starts on a
// fresh page. (They used to keep the page: the last user's tables, webhook
// secret, pending creates and in-flight polls stayed, and a next key
// refused those calls, e.g. a tenant key on /admin, saw them.)
function setupSignIn({ onSignedIn, onSignedOut }) {
  const form = document.getElementById('signin-form');
  const errorLine = document.getElementById('signin-error');
  const signOut = document.getElementById('signout');
  async function tryKey() {
    try {
      const account = await api('GET', '/v1/account');
      document.body.classList.add('signed-in');
      document.getElementById('whoami').textContent =
        `${account.userEmail} · ${account.tenantName} (${account.role})`;
      // Only the console has the banner: an operator suspended the tenant.
      const suspended = document.getElementById('suspended');
      if (suspended) {
        suspended.hidden = !account.tenantSuspended;
        suspended.textContent = account.tenantSuspended
          ? `This tenant is suspended by the operator: ${account.suspensionReason}. ` +
            'New instances, starts and volumes are refused until it is resumed.'
          : '';
      }
      errorLine.textContent = '';
      await onSignedIn(account);
    } catch (e) {
      sessionStorage.removeItem(KEY_STORAGE);
      document.body.classList.remove('signed-in');
      errorLine.textContent = e.status === 401 ? 'That API key was not accepted.' : `Sign-in failed: ${e.message}`;
      document.getElementById('api-key').focus();
    }
  }
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const input = document.getElementById('api-key');
    sessionStorage.setItem(KEY_STORAGE, input.value.trim());
    input.value = '';
    onSignedOut();  // no poll of this page runs with the new key
    location.reload();
  });
  signOut.addEventListener('click', () => {
    sessionStorage.removeItem(KEY_STORAGE);
    document.body.classList.remove('signed-in');
    onSignedOut();
    location.reload();
  });
  if (sessionStorage.getItem(KEY_STORAGE)) tryKey();
  else document.getElementById('api-key').focus();  // e.g. after a sign-out
}

// Runs fn now and every `ms` while the page is visible; returns a stopper.
function poll(fn, ms) {
  let timer = null, stopped = false;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden) { try { await fn(); } catch (e) { console.warn(e); } }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}
