// Volumes, the app marketplace, the public library, published ports, SSH
// keys and publisher earnings (docs/storage.md, docs/marketplace.md,
// docs/security.md).
'use strict';

let stoppers = [];
let instanceCache = [];
// Volume id -> the instance id chosen in its row. The rows are rebuilt
// every 2 s; without this each rebuild reset the chooser to the first
// instance, and Attach or Move clicked just after acted on that one.
const chosenInstances = new Map();

async function loadInstances() {
  const all = await apiAll('/v1/instances?pageSize=500', 'instances');
  instanceCache = all.items.filter((i) => i.state !== 'DELETED');
  return instanceCache;
}

// The instance chooser of a volume's row, showing the instance last chosen
// there while it is still listed.
function instanceChooser(volumeId, label) {
  const select = el('select', { 'aria-label': label, 'data-focus-key': `${volumeId}/instance`,
    onchange: () => chosenInstances.set(volumeId, select.value) });
  for (const i of instanceCache) {
    select.append(el('option', { value: i.id, text: `${i.name || i.id} (${i.state})` }));
  }
  const chosen = chosenInstances.get(volumeId);
  if (instanceCache.some((i) => i.id === chosen)) select.value = chosen;
  return select;
}

// Rebuilds `container`'s content with `rebuild` and gives keyboard focus
// back to the control that had it (same data-focus-key), so a refresh does
// not throw a keyboard user out of the row.
function keepingFocus(container, rebuild) {
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.focusKey : undefined;
  rebuild();
  if (!key) return;
  const again = [...container.querySelectorAll('[data-focus-key]')].find((n) => n.dataset.focusKey === key);
  if (again) again.focus();
}

function volumeActions(v) {
  const box = el('div', { class: 'actions' });
  const run = async (label, fn) => {
    try { await fn(); status('volume-status', `${label}: ${v.name || v.id}`); await refreshVolumes(); }
    catch (e) { status('volume-status', failText(label, e), true); }
  };
  const chooser = instanceChooser(v.id, `Instance for ${v.name || v.id}`);
  box.append(chooser);
  box.append(el('button', { type: 'button', 'data-focus-key': `${v.id}/attach`, onclick: () => run('Attach', () =>
    api('POST', `/v1/volumes/${encodeURIComponent(v.id)}:attach`, { instanceId: chooser.value })) }, 'Attach'));
  box.append(el('button', { type: 'button', 'data-focus-key': `${v.id}/move`, onclick: () => run('Move', () =>
    api('POST', `/v1/volumes/${encodeURIComponent(v.id)}:move`, { toInstanceId: chooser.value })) }, 'Move'));
  for (const a of v.attachments || []) {
    box.append(el('button', { type: 'button', 'data-focus-key': `${v.id}/detach/${a.instanceId}`,
      onclick: () => run('Detach', () =>
        api('POST', `/v1/volumes/${encodeURIComponent(v.id)}:detach`, { instanceId: a.instanceId })) },
      `Detach from ${a.instanceId}`));
  }
  box.append(el('button', { type: 'button', class: 'danger', 'data-focus-key': `${v.id}/delete`, onclick: () => {
    if (confirm(`Delete volume ${v.name || v.id}?`)) run('Delete', () => api('DELETE', `/v1/volumes/${encodeURIComponent(v.id)}`));
  } }, 'Delete'));
  return box;
}

async function refreshVolumes() {
  await loadInstances();
  const volumes = (await apiAll('/v1/volumes?pageSize=200', 'volumes')).items;
  for (const id of chosenInstances.keys()) if (!volumes.some((v) => v.id === id)) chosenInstances.delete(id);
  const tbody = document.querySelector('#volumes-table tbody');
  keepingFocus(tbody, () => fillTable(tbody, volumes, (v) => [
    v.name || '—', el('code', { text: v.id }), `${v.sizeGib} GiB`,
    v.kind === 'NODE_LOCAL' ? `node-local${v.nodeId ? ' on ' + v.nodeId : ''}` : 'network',
    v.unpaidSinceTime
      ? el('span', { class: 'state state-FAILED', text: `${v.state}, unpaid` +
          (v.unpaidDeleteTime ? `: deleted ${v.unpaidDeleteTime} unless storage is paid` : '') })
      : el('span', { class: `state state-${v.state}`, text: v.state }),
    (v.attachments || []).map((a) => `${a.instanceId} at ${a.mountPath} ${a.readOnly ? '(ro)' : '(rw)'} ` +
      `${(a.state || '').replace('ATTACHMENT_', '')}${a.reason ? ': ' + a.reason : ''}`).join('; ') || '—',
    volumeActions(v),
  ], 'No volumes yet.'));
  const rows = [];
  for (const i of instanceCache) for (const p of i.ports || []) rows.push({ i, p });
  fillTable(document.querySelector('#ports-table tbody'), rows, ({ i, p }) => [
    i.name || i.id, `${p.containerPort}/${p.protocol || 'tcp'}`,
    portLink(p.url),
  ], 'No published ports.');
}

// An ssh://root@host:port URL is shown as the command that opens it.
function portLink(url) {
  if (!url) return 'not placed yet';
  const ssh = /^ssh:\/\/root@\[?([^\]]+?)\]?:(\d+)$/.exec(url);
  if (ssh) return el('code', { text: `ssh -p ${ssh[2]} root@${ssh[1]}` });
  return el('a', { href: url, text: url, target: '_blank', rel: 'noopener' });
}

async function refreshSshKeys() {
  const keys = (await api('GET', '/v1/sshKeys')).keys || [];
  fillTable(document.querySelector('#ssh-keys-table tbody'), keys, (k) => [
    k.name, el('code', { text: k.fingerprint }), formatTime(k.createTime),
    el('button', { type: 'button', class: 'danger', onclick: async () => {
      if (!confirm(`Delete SSH key ${k.name}? Running instances stop accepting it.`)) return;
      try {
        await api('DELETE', `/v1/sshKeys/${encodeURIComponent(k.id)}`);
        status('ssh-key-status', `Deleted ${k.name}`);
        await refreshSshKeys();
      } catch (e) { status('ssh-key-status', failText('Delete', e), true); }
    } }, `Delete ${k.name}`),
  ], 'No SSH keys yet.');
}

async function refreshCatalog() {
  const apps = (await apiAll('/v1/images?pageSize=200', 'images')).items;
  fillTable(document.querySelector('#apps-table tbody'), apps, (img) => [
    img.name, img.version, String(img.gpuCount || 1), (img.ports || []).join(', ') || '—',
    formatMoney(img.pricePerHourMicros || 0),
    el('button', { type: 'button', onclick: async () => {
      try {
        const inst = await createOnce('app', '/v1/apps:launch', { app: img.id });
        status('app-status', `Launched ${img.name} as ${inst.id}; its URLs appear under Ports.`);
        await refreshVolumes();
      } catch (e) { status('app-status', failText('Launch', e), true); }
    } }, `Launch ${img.name}`),
  ], 'No apps offered yet.');
  const library = (await apiAll('/v1/library?pageSize=200', 'items')).items;
  fillTable(document.querySelector('#library-table tbody'), library, (item) => [
    item.name, (item.kind || '').toLowerCase(), `/public/${item.name}`, item.source,
  ], 'The library is empty.');
  const earnings = await api('GET', '/v1/marketplace/earnings');
  document.getElementById('fees').textContent = formatMoney(earnings.feesMicros || 0);
  document.getElementById('share').textContent = formatMoney(earnings.publisherShareMicros || 0);
  document.getElementById('paid-out').textContent = formatMoney(earnings.paidOutMicros || 0);
  document.getElementById('owed').textContent = formatMoney(earnings.payableBalanceMicros || 0);
}

async function refreshWebhook() {
  let hook = null;
  try {
    hook = await api('GET', '/v1/webhook');
  } catch (e) {
    if (e.status !== 404) throw e;
  }
  const state = document.getElementById('webhook-state');
  state.dataset.url = hook ? hook.url : '';
  if (!hook) {
    state.textContent = 'No webhook: notices are shown on the Money page and by svctl balance.';
  } else {
    state.textContent = hook.disabled
      ? `Turned off ${formatTime(hook.disableTime)} after ${hook.disabledReason}. ${hook.pendingCount || 0} ` +
        'notice(s) wait: save the webhook again to turn it back on and send them.'
      : `Sending to ${hook.url}: ${hook.pendingCount || 0} notice(s) pending, ` +
        `last delivery ${formatTime(hook.lastDeliveryTime)}` +
        (hook.failedAttempts ? `; failing since ${formatTime(hook.failingSinceTime)} after ` +
          `${hook.failedAttempts} tries: ${hook.lastError}` : '.');
  }
  document.getElementById('webhook-test').disabled = !hook;
  document.getElementById('webhook-delete').disabled = !hook;
}

document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('volume-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const v = await createOnce('volume', '/v1/volumes', {
        volume: {
          name: document.getElementById('volume-name').value.trim(),
          sizeGib: Number(document.getElementById('volume-size').value),
          kind: document.getElementById('volume-kind').value,
          readMany: document.getElementById('volume-read-many').checked,
        },
      });
      status('volume-status', `Created ${v.name || v.id}`);
      await refreshVolumes();
    } catch (e) { status('volume-status', failText('Create', e), true); }
  });
  document.getElementById('ssh-key-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const k = await api('POST', '/v1/sshKeys', {
        name: document.getElementById('ssh-key-name').value.trim(),
        publicKey: document.getElementById('ssh-key-text').value,
      });
      status('ssh-key-status', `Added ${k.name} (${k.fingerprint})`);
      document.getElementById('ssh-key-text').value = '';
      document.getElementById('ssh-key-name').value = '';
      await refreshSshKeys();
    } catch (e) { status('ssh-key-status', failText('Add', e), true); }
  });
  document.getElementById('webhook-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const hook = await api('PUT', '/v1/webhook', { url: document.getElementById('webhook-url').value.trim() });
      status('webhook-status', `Saved. Secret (shown once; verify signatures with it): ${hook.secret}`);
      await refreshWebhook();
    } catch (e) { status('webhook-status', failText('Save', e), true); }
  });
  document.getElementById('webhook-test').addEventListener('click', async () => {
    status('webhook-status', 'Sending a test…');
    try {
      const r = await api('POST', '/v1/webhook:test', {});
      status('webhook-status', r.error ? `Test failed: ${r.error}` : `Test delivered: HTTP ${r.httpStatus}`, !!r.error);
    } catch (e) { status('webhook-status', failText('Test', e), true); }
  });
  document.getElementById('webhook-delete').addEventListener('click', async () => {
    try {
      await api('DELETE', '/v1/webhook');
      status('webhook-status', 'Webhook deleted.');
      await refreshWebhook();
    } catch (e) { status('webhook-status', failText('Delete', e), true); }
  });
  setupSignIn({
    onSignedIn: async () => {
      stoppers.forEach((s) => s());
      stoppers = [poll(refreshVolumes, 2000), poll(refreshCatalog, 10000),
        poll(refreshSshKeys, 10000), poll(refreshWebhook, 10000)];
    },
    onSignedOut: () => { stoppers.forEach((s) => s()); stoppers = []; },
  });
});
