// The operator's billing dashboard: revenue, SLA refunds, the fleet, and
// every tenant's balance, trial credit and top-ups; and two operator actions:
// suspending or resuming a tenant, and deciding credits that wait for a
// second operator. Refreshes every 5 s.
'use strict';

let stopAdmin = null;

const COLORS = { paid: '#2f7d4f', trial: '#a7c957', refund: '#c0392b' };

function showError(e) {
  document.getElementById('admin-error').textContent =
    e ? (e.status === 403 ? 'This key is not an operator key.' : `Could not load: ${e.message}`) : '';
  if (e && (e.status === 401 || e.status === 403)) clearDashboard();
}

// Empties every figure the dashboard shows: a key that may not read them
// (revoked, or not an operator's) must not go on seeing the last answers.
function clearDashboard() {
  const main = document.getElementById('main');
  main.querySelectorAll('table.data tbody').forEach((tbody) => tbody.replaceChildren());
  main.querySelectorAll('.kpi-value').forEach((kpi) => { kpi.textContent = '—'; delete kpi.dataset.micros; });
  main.querySelectorAll('.chart-box, .heatmap').forEach((box) => box.replaceChildren());
  for (const id of ['trial-totals', 'topup-totals', 'invoice-totals', 'credit-limit']) {
    document.getElementById(id).textContent = '';
  }
  document.getElementById('standing-tenant').replaceChildren();
}

// What ran but was not paid in a period: GPU rent, storage and app fees.
function unpaidOf(p) {
  return BigInt(p.shortfallMicros || 0) + BigInt(p.storageShortfallMicros || 0) +
    BigInt(p.appFeeShortfallMicros || 0);
}

async function refreshRevenue() {
  const [days, months] = await Promise.all([
    api('GET', '/v1/admin/dashboard/revenue?granularity=REVENUE_GRANULARITY_DAY'),
    api('GET', '/v1/admin/dashboard/revenue?granularity=REVENUE_GRANULARITY_MONTH'),
  ]);
  // BigInt micros, written exactly by the chart (barChart `money`).
  const trial = (p) => BigInt(p.trialChargedMicros || 0);
  const draw = (id, points) => barChart(document.getElementById(id), {
    title: 'Revenue', unit: 'CNY', money: true, labels: points.map((p) => p.period),
    series: [
      { label: 'Paid charges', color: COLORS.paid,
        values: points.map((p) => BigInt(p.chargedMicros || 0) - trial(p)) },
      { label: 'Trial credit used', color: COLORS.trial, values: points.map(trial) },
    ],
  });
  const dayPoints = days.points || [];
  draw('revenue-day-chart', dayPoints);
  draw('revenue-month-chart', months.points || []);
  let charged = 0n, net = 0n, refunds = 0n, unpaid = 0n;
  for (const p of dayPoints) {
    charged += BigInt(p.chargedMicros);
    net += BigInt(p.netRevenueMicros);
    refunds += BigInt(p.slaRefundsMicros);
    unpaid += unpaidOf(p);
  }
  const kpi = document.getElementById('kpi-charged');
  kpi.textContent = formatMoney(charged);
  kpi.dataset.micros = charged.toString();
  document.getElementById('kpi-net').textContent = formatMoney(net);
  document.getElementById('kpi-refunds').textContent = formatMoney(refunds);
  document.getElementById('kpi-unpaid').textContent = formatMoney(unpaid);
  fillTable(document.querySelector('#revenue-table tbody'), dayPoints.slice().reverse(), (p) => [
    p.period, formatMoney(p.chargedMicros), formatMoney(p.trialChargedMicros),
    formatMoney(p.appFeesMicros || 0), formatMoney(p.storageMicros || 0),
    formatMoney(p.slaRefundsMicros), formatMoney(unpaidOf(p)),
    formatMoney(p.topupsMicros), formatMoney(p.topupRefundsMicros || 0),
    formatMoney(p.creditsMicros || 0), formatMoney(p.netRevenueMicros)]);
}

async function refreshRefunds() {
  const data = await api('GET', '/v1/admin/dashboard/slaRefunds');
  const metrics = data.metrics || [];
  const box = document.getElementById('refunds-chart');
  if (!metrics.length) {
    box.replaceChildren(el('p', { class: 'help', text: 'No SLA refunds in the last 30 days.' }));
    return;
  }
  barChart(box, {
    title: 'SLA refunds by metric', unit: 'CNY', money: true,
    labels: metrics.map((m) => `${m.metric} (${m.refundCount})`),
    series: [{ label: 'Refunded', color: COLORS.refund, values: metrics.map((m) => BigInt(m.amountMicros || 0)) }],
  });
}

// Blue (0) to red (1) by a share; grey for down nodes, white for no data.
function shareColor(node, share) {
  if (node.state === 'down') return '#8a8a8a';
  if (share === null) return '#ffffff';
  const hue = 210 - Math.round(share * 170);
  return `hsl(${hue}, 65%, ${88 - Math.round(share * 40)}%)`;
}

// Proto3 JSON leaves out zero values, so a missing field is 0.
const num = (v) => Number(v || 0);
const utilText = (pct) => (num(pct) < 0 ? '–' : `${num(pct)}%`);

// One row per leaf switch, one cell per node; `view` gives a node's share
// (0..1 or null), its label and its tooltip.
function heatmap(container, nodes, ariaLabel, view) {
  const byLeaf = new Map();
  for (const n of nodes) {
    const key = `${n.pod} / ${n.leafSwitch}`;
    if (!byLeaf.has(key)) byLeaf.set(key, []);
    byLeaf.get(key).push(n);
  }
  const cell = 34, labelW = 150;
  const cols = Math.max(1, ...[...byLeaf.values()].map((l) => l.length));
  const height = byLeaf.size * (cell + 4) + 4;
  const width = labelW + cols * (cell + 4);
  const svg = svgEl('svg', { viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', class: 'chart heat',
    'aria-label': ariaLabel });
  [...byLeaf.entries()].forEach(([key, list], row) => {
    const y = 4 + row * (cell + 4);
    svg.append(svgEl('text', { x: 0, y: y + cell / 2 + 4, class: 'axis' }, document.createTextNode(key)));
    list.forEach((n, col) => {
      const x = labelW + col * (cell + 4);
      const v = view(n);
      const rect = svgEl('rect', { x, y, width: cell, height: cell, rx: 4, fill: shareColor(n, v.share), class: 'cell' });
      rect.append(svgEl('title', {}, document.createTextNode(v.title)));
      svg.append(rect);
      svg.append(svgEl('text', { x: x + cell / 2, y: y + cell / 2 + 4, 'text-anchor': 'middle', class: 'cell-text' },
        document.createTextNode(v.label)));
    });
  });
  container.replaceChildren(svg);
}

async function refreshFleet() {
  const data = await api('GET', '/v1/admin/dashboard/fleet');
  const nodes = data.nodes || [];
  const leaves = data.leaves || [];
  heatmap(document.getElementById('fleet-heatmap'), nodes,
    'Fleet allocation heatmap: ' + leaves.map((l) =>
      `${l.leafSwitch} ${num(l.allocatedGpuCount)} of ${num(l.gpuCount)} GPUs allocated`).join('; '),
    (n) => ({
      share: num(n.gpuCount) ? num(n.allocatedGpuCount) / num(n.gpuCount) : 0,
      label: `${num(n.allocatedGpuCount)}/${num(n.gpuCount)}`,
      title: `${n.nodeName} (${n.state}): ${num(n.allocatedGpuCount)}/${num(n.gpuCount)} GPUs allocated, ` +
        `${num(n.instanceCount)} instances`,
    }));
  heatmap(document.getElementById('fleet-util-heatmap'), nodes,
    'Fleet utilization heatmap, last hour: ' + leaves.map((l) =>
      `${l.leafSwitch} ${utilText(l.gpuUtilizationPct)}`).join('; '),
    (n) => ({
      share: num(n.gpuUtilizationPct) < 0 ? null : num(n.gpuUtilizationPct) / 100,
      label: utilText(n.gpuUtilizationPct),
      title: `${n.nodeName} (${n.state}): GPU utilization ${utilText(n.gpuUtilizationPct)} over the last hour`,
    }));
  const series = data.utilizationSeries || [];
  const chart = document.getElementById('fleet-util-chart');
  if (!series.length) {
    chart.replaceChildren(el('p', { class: 'help', text: 'No GPU telemetry in the last 48 hours.' }));
  } else {
    barChart(chart, {
      title: 'Fleet GPU utilization per hour', unit: '%',
      labels: series.map((p) => p.hourStartTime.slice(5, 13).replace('T', ' ') + 'h'),
      series: [{ label: 'Utilization', color: '#2b6cb0', values: series.map((p) => num(p.gpuUtilizationPct)) }],
    });
  }
  document.getElementById('kpi-gpus').textContent = `${num(data.allocatedGpuCount)} / ${num(data.gpuCount)}`;
  document.getElementById('kpi-util').textContent = utilText(data.gpuUtilizationPct);
  fillTable(document.querySelector('#leaves-table tbody'), leaves, (l) => [
    l.pod, l.leafSwitch, String(num(l.nodeCount)), String(num(l.downNodeCount)),
    `${num(l.allocatedGpuCount)} / ${num(l.gpuCount)}`, `${num(l.allocatedPct)}%`, utilText(l.gpuUtilizationPct)]);
}

async function refreshTenants() {
  const [balances, trials, topups, invoices] = await Promise.all([
    apiAll('/v1/admin/balances?pageSize=500', 'balances'),
    api('GET', '/v1/admin/dashboard/trialGrants?pageSize=500'),
    api('GET', '/v1/admin/dashboard/topups?pageSize=100'),
    api('GET', '/v1/admin/invoices?pageSize=100'),
  ]);
  fillTenantChooser(balances.items);
  fillTable(document.querySelector('#balances-table tbody'), balances.items, (t) => [
    t.suspended ? `${t.tenantName} (suspended)` : t.tenantName, t.balance.mode, formatMoney(t.balance.paidMicros), formatMoney(t.balance.trialMicros),
    formatMoney(t.balance.receivableMicros), formatMoney(t.balance.burnMicrosPerMinute)]);
  document.getElementById('trial-totals').textContent =
    `${trials.grantCount} grants: ${formatMoney(trials.grantedMicros)} issued, ${formatMoney(trials.burnedMicros)} burned, ` +
    `${formatMoney(trials.expiredMicros)} expired, ${formatMoney(trials.remainingMicros)} left.`;
  fillTable(document.querySelector('#trials-table tbody'), trials.tenants || [], (t) => [
    t.tenantName, formatMoney(t.grantedMicros), formatMoney(t.burnedMicros), formatMoney(t.expiredMicros),
    formatMoney(t.remainingMicros), formatTime(t.expireTime)]);
  document.getElementById('topup-totals').textContent =
    `${topups.totalCount} top-ups, ${formatMoney(topups.totalMicros)} in all, ` +
    `${formatMoney(topups.refundedMicros || '0')} of it refunded.`;
  fillTable(document.querySelector('#topups-table tbody'), topups.topups || [], (t) => [
    formatTime(t.createTime), t.tenantName, t.paymentId, formatMoney(t.amountMicros),
    formatMoney(t.refundedMicros || '0')], 'No top-ups yet.');
  // The newest 100 invoices; the totals are of all of them.
  document.getElementById('invoice-totals').textContent =
    `${num(invoices.invoiceCount)} invoices: ${formatMoney(invoices.totalMicros || '0')} invoiced, ` +
    `${formatMoney(invoices.amountDueMicros || '0')} due as of their issue.`;
  fillTable(document.querySelector('#invoices-table tbody'), invoices.invoices || [], (t) => [
    t.invoice.period, t.tenantName, el('code', { text: t.invoice.id }), formatMoney(t.invoice.totalMicros || '0'),
    t.invoice.amountDueMicros !== undefined ? formatMoney(t.invoice.amountDueMicros) : '—',
    formatTime(t.invoice.issueTime)], 'No invoices yet (postpaid tenants get one a month).');
}

// The tenant chooser of the suspend/resume form, kept as chosen across
// refreshes.
function fillTenantChooser(balances) {
  const select = document.getElementById('standing-tenant');
  const chosen = select.value;
  const options = balances.map((t) => el('option', { value: t.tenantId,
    text: t.suspended ? `${t.tenantName} (suspended)` : t.tenantName }));
  select.replaceChildren(...options);
  if (balances.some((t) => t.tenantId === chosen)) select.value = chosen;
}

async function changeStanding(action) {
  const tenant = document.getElementById('standing-tenant');
  const reason = document.getElementById('standing-reason').value.trim();
  if (!tenant.value || !reason) {
    status('standing-status', 'Choose a tenant and give a reason.', true);
    return;
  }
  const name = tenant.selectedOptions[0].textContent;
  try {
    const r = await api('POST', `/v1/admin/tenants/${encodeURIComponent(tenant.value)}:${action}`, { reason });
    status('standing-status', action === 'suspend'
      ? `${name}: ${r.newlySuspended ? 'suspended' : 'was already suspended'}; ` +
        `${num(r.instancesStopped)} instance(s) stopped.`
      : `${name}: ${r.wasSuspended ? 'resumed' : 'was not suspended'}.`);
    await refreshTenants();
  } catch (e) { status('standing-status', failText(action === 'suspend' ? 'Suspend' : 'Resume', e), true); }
}

async function decideCredit(creditId, approve) {
  const reason = document.getElementById('credit-reject-reason').value.trim();
  if (!approve && !reason) {
    status('credit-status', 'Give a reason for the rejection first.', true);
    return;
  }
  try {
    const r = await api('POST', `/v1/admin/creditRequests/${encodeURIComponent(creditId)}:${approve ? 'approve' : 'reject'}`,
      approve ? {} : { reason });
    status('credit-status', `Credit ${creditId} (${formatMoney(r.amountMicros)}): ${approve ? 'approved and posted' : 'rejected'}.`);
    await refreshCredits();
  } catch (e) { status('credit-status', failText(approve ? 'Approve' : 'Reject', e), true); }
}

async function refreshCredits() {
  const data = await api('GET', '/v1/admin/creditRequests?pendingOnly=true&pageSize=200');
  const limit = BigInt(data.approvalAboveMicros || 0);
  document.getElementById('credit-limit').textContent = limit < 0n
    ? 'Every credit is posted at once (no approval limit is set).'
    : `Credits above ${formatMoney(limit)} (or that take one operator's credits of 24 hours above it) ` +
      'wait here for another operator than the one who asked; requests expire after 7 days.';
  fillTable(document.querySelector('#credits-table tbody'), data.creditRequests || [], (c) => [
    formatTime(c.requestTime), el('code', { text: c.creditId }), c.tenantId, formatMoney(c.amountMicros),
    c.requestedBy, c.reason, formatTime(c.expireTime),
    el('span', {},
      el('button', { type: 'button', text: 'Approve', 'aria-label': `Approve credit ${c.creditId}`,
        onclick: () => decideCredit(c.creditId, true) }),
      ' ',
      el('button', { type: 'button', class: 'danger', text: 'Reject', 'aria-label': `Reject credit ${c.creditId}`,
        onclick: () => decideCredit(c.creditId, false) }))],
  'No credit awaits approval.');
}

// Waits for every part, so that a refused key's clearing (showError) comes
// after any part that still drew; an auth refusal is the error shown.
async function refreshAll() {
  const results = await Promise.allSettled([refreshRevenue(), refreshRefunds(), refreshFleet(),
    refreshTenants(), refreshCredits()]);
  const errors = results.filter((r) => r.status === 'rejected').map((r) => r.reason);
  showError(errors.find((e) => e && (e.status === 401 || e.status === 403)) || errors[0] || null);
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('suspend-button').addEventListener('click', () => changeStanding('suspend'));
  document.getElementById('resume-button').addEventListener('click', () => changeStanding('resume'));
  setupSignIn({
    onSignedIn: async () => { if (stopAdmin) stopAdmin(); stopAdmin = poll(refreshAll, 5000); },
    onSignedOut: () => { if (stopAdmin) stopAdmin(); stopAdmin = null; },
  });
});
