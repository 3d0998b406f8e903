// The tenant console: instances with live state, money, SLA windows.
'use strict';

const ACTIVE = new Set(['PENDING', 'SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING']);
let stopPolling = [];
let knownInstances = [];

function stateBadge(instance) {
  const badge = el('span', { class: `state state-${instance.state}`, 'data-state': instance.state,
    text: instance.state });
  return instance.stateReason
    ? el('span', {}, badge, el('span', { class: 'reason', text: ' ' + instance.stateReason }))
    : badge;
}

function actionButtons(instance) {
  const box = el('div', { class: 'actions' });
  const act = async (verb, label, body = {}) => {
    try {
      if (verb === 'delete') {
        if (!confirm(`Delete ${instance.name || instance.id}? This releases its GPUs.`)) return;
        await api('DELETE', `/v1/instances/${encodeURIComponent(instance.id)}`);
      } else {
        await api('POST', `/v1/instances/${encodeURIComponent(instance.id)}:${verb}`, body);
      }
      setStatus(`${label}: ${instance.name || instance.id}`);
      await refreshInstances();
    } catch (e) {
      setStatus(`${label} failed: ${e.message} (${e.reason || e.code})`, true);
    }
  };
  const name = instance.name || instance.id;
  if (instance.state === 'RUNNING' || instance.state === 'PENDING' || instance.state === 'SCHEDULED' ||
      instance.state === 'STARTING') {
    box.append(el('button', { type: 'button', 'aria-label': `Stop ${name}`, onclick: () => act('stop', 'Stop') }, 'Stop'));
  }
  if (instance.state === 'STOPPED') {
    box.append(el('button', { type: 'button', 'aria-label': `Start ${name}`, onclick: () => act('start', 'Start') }, 'Start'));
  }
  // A 1-7 GPU instance may let svd restart it on another node to free whole
  // nodes (docs/scheduler.md, "Moving instances"); off by default.
  if (ACTIVE.has(instance.state) && instance.gpuCount < 8) {
    box.append(instance.movable
      ? el('button', { type: 'button', 'aria-label': `Keep ${name} in place`,
        title: 'svd will not move it', onclick: () => act('setMovable', 'Kept in place', { movable: false }) },
      'Keep in place')
      : el('button', { type: 'button', 'aria-label': `Allow moves of ${name}`,
        title: 'svd may restart it on another node to free whole nodes; the minutes of a move are not charged',
        onclick: () => act('setMovable', 'Moves allowed', { movable: true }) }, 'Allow moves'));
  }
  if (instance.state !== 'DELETED') {
    box.append(el('button', { type: 'button', class: 'danger', 'aria-label': `Delete ${name}`,
      onclick: () => act('delete', 'Delete') }, 'Delete'));
  }
  return box;
}

function setStatus(text, isError) {
  const line = document.getElementById('create-status');
  line.textContent = text;
  line.classList.toggle('error', !!isError);
}

async function refreshInstances() {
  knownInstances = (await apiAll('/v1/instances?pageSize=500', 'instances')).items;
  const tbody = document.querySelector('#instances-table tbody');
  fillTable(tbody, knownInstances, (i) => [
    i.name || '—',
    el('code', { text: i.id }),
    String(i.gpuCount),
    stateBadge(i),
    (i.placement || []).map((p) => `${p.nodeName} (${p.leafSwitch})`).join(', ') || '—',
    formatTime(i.createTime),
    actionButtons(i),
  ], 'No instances yet. Create one above.');
  tbody.querySelectorAll('tr').forEach((tr, idx) => {
    if (knownInstances[idx]) tr.dataset.instanceId = knownInstances[idx].id;
  });
  const select = document.getElementById('sla-instance');
  const chosen = select.value;
  select.replaceChildren(el('option', { value: '', text: 'Choose an instance' }),
    ...knownInstances.map((i) => el('option', { value: i.id, text: `${i.name || i.id} (${i.state})` })));
  select.value = chosen;
}

async function refreshBalance() {
  const b = await api('GET', '/v1/balance');
  document.getElementById('paid').textContent = formatMoney(b.paidMicros);
  document.getElementById('trial').textContent = formatMoney(b.trialMicros);
  document.getElementById('available').textContent = formatMoney(b.availableMicros);
  document.getElementById('available').dataset.micros = b.availableMicros;
  document.getElementById('burn').textContent = formatMoney(b.burnMicrosPerMinute);
  document.getElementById('trial-expiry').textContent =
    b.trialExpireTime ? `expires ${formatTime(b.trialExpireTime)}` : '';
  const notices = document.getElementById('notices');
  notices.replaceChildren(...(b.notices || []).slice(0, 5).map((n) =>
    el('li', { class: `notice notice-${n.kind}`, text: `${formatTime(n.createTime)} — ${n.message}` })));
}

async function refreshMoneyTables() {
  const [usage, transfers, invoices, prices] = await Promise.all([
    api('GET', '/v1/usage'), api('GET', '/v1/transfers?pageSize=50&newestFirst=true'), api('GET', '/v1/invoices'),
    api('GET', '/v1/prices')]);
  const rows = usage.rows || [];
  // Summed in BigInt micros: the chart writes them exactly (barChart `money`).
  const byDay = new Map();
  for (const r of rows) byDay.set(r.day, (byDay.get(r.day) || 0n) + BigInt(r.amountMicros || 0));
  const days = [...byDay.keys()].sort();
  barChart(document.getElementById('usage-chart'), {
    title: 'Usage per day', unit: 'CNY', money: true, labels: days,
    series: [{ label: 'Usage', color: '#3b6fd8', values: days.map((d) => byDay.get(d)) }],
  });
  fillTable(document.querySelector('#usage-table tbody'), rows, (r) => [
    r.day, el('code', { text: r.instanceId }), String(r.gpuMinutes), formatMoney(r.amountMicros)]);
  // The newest 50, newest first.
  const list = transfers.transfers || [];
  fillTable(document.querySelector('#transfers-table tbody'), list, (t) => [
    formatTime(t.createTime), t.reason ? `${t.kind}: ${t.reason}` : t.kind, t.instanceId ? el('code', { text: t.instanceId }) : '—',
    t.usageMinuteTime ? formatTime(t.usageMinuteTime) : '—', formatMoney(t.tenantDeltaMicros)]);
  fillTable(document.querySelector('#invoices-table tbody'), invoices.invoices || [], (inv) => [
    inv.period, el('code', { text: inv.id }), formatTime(inv.issueTime), formatMoney(inv.totalMicros),
    inv.amountDueMicros !== undefined ? formatMoney(inv.amountDueMicros) : '—'],
  'No invoices (postpaid tenants get one a month).');
  // Per GPU-hour and per GiB-month (30 days); scheduled changes show their start.
  const since = (iso) => (!iso || Date.parse(iso) <= 0 ? '—' : formatTime(iso));
  fillTable(document.querySelector('#prices-table tbody'), prices.prices || [], (p) => {
    const gpu = p.itemKind === 'gpu_minute';
    const unit = BigInt(p.unitPriceMicros || 0);
    const item = gpu ? (p.item === '*' ? 'Any other GPU' : p.item)
      : (p.item === '*' ? 'Any other volume' : `${p.item} volume`);
    const price = gpu ? `${formatMoney(unit * 60n)} per GPU-hour` : `${formatMoney(unit * 720n)} per GiB-month`;
    return [item, price, since(p.effectiveTime), since(p.untilTime)];
  });
}

function verdictText(v) {
  const metric = (v.definition && v.definition.metric) || 'metric';
  const parts = [metric, v.missingTelemetry ? 'no telemetry' : `observed ${v.observed}`,
    v.breached ? 'BREACHED' : 'met'];
  if (v.refundMicros && v.refundMicros !== '0') parts.push(`refund ${formatMoney(v.refundMicros)}`);
  if (v.explanation) parts.push(v.explanation);
  return parts.join(' · ');
}

async function refreshSla() {
  const id = document.getElementById('sla-instance').value;
  const box = document.getElementById('sla-windows');
  if (!id) { box.replaceChildren(el('p', { class: 'help', text: 'Choose an instance to see its hours.' })); return; }
  let data;
  try {
    data = await api('GET', `/v1/sla/windows?instanceId=${encodeURIComponent(id)}&pageSize=48`);
  } catch (e) {
    box.replaceChildren(el('p', { class: 'error', text: `SLA windows: ${e.message}` }));
    return;
  }
  const windows = data.windows || [];
  if (!windows.length) { box.replaceChildren(el('p', { class: 'help', text: 'No SLA hours yet: an hour appears once the instance\'s telemetry arrives.' })); return; }
  box.replaceChildren(...windows.map((w) => {
    const evidence = el('dl', { class: 'evidence' });
    const add = (k, v) => { evidence.append(el('dt', { text: k }), el('dd', { text: v })); };
    add('State', w.state);
    add(w.state === 'OPEN' ? 'Rent so far' : 'Rent', formatMoney(w.rentMicros));
    add('GPU slots usable', `${w.slotsUsable} of ${w.slots} (reported ${w.slotsReported})`);
    add('Storage probes', `${w.storageProbeCount}, mean ${(Number(w.storageMeanBytesPerSecond) / 1e9).toFixed(2)} GB/s, min ${(Number(w.storageMinBytesPerSecond) / 1e9).toFixed(2)} GB/s`);
    add('Latency', `${w.latencySampleCount} samples, p99 ${(Number(w.latencyP99Ns) / 1000).toFixed(2)} µs`);
    add('Nodes', (w.nodeNames || []).join(', ') || '—');
    const verdicts = el('ul', { class: 'verdicts' }, ...(w.verdicts || []).map((v) =>
      el('li', { class: v.breached ? 'breached' : 'met', text: verdictText(v) })));
    return el('details', { class: 'window' },
      el('summary', {}, `${formatTime(w.hourStartTime)} — ${w.state}`,
        w.refundMicrosTotal && w.refundMicrosTotal !== '0' ? ` — refund ${formatMoney(w.refundMicrosTotal)}` : ''),
      verdicts, evidence);
  }));
}

function start() {
  stopPolling.forEach((s) => s());
  stopPolling = [
    poll(refreshInstances, 2000),
    poll(refreshBalance, 2000),
    poll(refreshMoneyTables, 10000),
    poll(refreshSla, 30000),
  ];
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('create-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = document.getElementById('create-button');
    button.disabled = true;
    const instance = {
      name: document.getElementById('create-name').value.trim(),
      gpuCount: Number(document.getElementById('create-gpus').value),
      image: document.getElementById('create-image').value.trim(),
    };
    try {
      const created = await createOnce('instance', '/v1/instances', { instance });
      setStatus(`Created ${created.name || created.id} (${created.state}).`);
      await refreshInstances();
    } catch (e) {
      setStatus(`Create failed: ${e.message} (${e.reason || e.code})`, true);
    } finally {
      button.disabled = false;
    }
  });
  document.getElementById('sla-instance').addEventListener('change', refreshSla);
  setupSignIn({
    onSignedIn: async () => start(),
    onSignedOut: () => { stopPolling.forEach((s) => s()); stopPolling = []; },
  });
});
