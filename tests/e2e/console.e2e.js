// End to end in Debian's headless Chromium (never a downloaded browser):
// sign in, create an 8-GPU instance and see it RUNNING, see the balance fall
// after a (simulated) minute, stop the instance, see the revenue on the
// admin dashboard, approve another operator's credit and suspend the tenant
// there, and see the tenant's banner and refused create; a volume row keeps
// its chosen instance across refreshes, charts write exact amounts, and a
// sign-out leaves nothing for the next key. Screenshots go to --out. Run by console_e2e_test (ctest
// label e2e), which starts PostgreSQL and svd; see docs/web.md.
'use strict';

const { chromium } = require('playwright-core');
const fs = require('fs');
const path = require('path');

function args() {
  const out = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) out[argv[i].replace(/^--/, '')] = argv[i + 1];
  for (const k of ['base', 'key', 'admin-key', 'out']) {
    if (!out[k]) throw new Error(`missing --${k}`);
  }
  return out;
}

const opts = args();
const results = [];
fs.mkdirSync(opts.out, { recursive: true });
for (const f of fs.readdirSync(opts.out)) if (f.endsWith('.png')) fs.unlinkSync(path.join(opts.out, f));

async function step(name, fn) {
  const started = Date.now();
  try {
    await fn();
    results.push({ name, ok: true, ms: Date.now() - started });
    console.log(`ok   ${name} (${Date.now() - started} ms)`);
  } catch (e) {
    results.push({ name, ok: false, ms: Date.now() - started });
    console.log(`FAIL ${name}: ${e.stack || e}`);
    throw e;
  }
}

async function rest(method, urlPath, key, body) {
  const res = await fetch(opts.base + urlPath, {
    method,
    headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.status, body: await res.json().catch(() => null) };
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(opts.out, name + '.png'), fullPage: true });
}

// Signing in stores the key and reloads the page, which signs in at load
// (web/common.js setupSignIn).
async function signIn(page, key) {
  await page.getByLabel(/API key/).fill(key);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#whoami').filter({ hasText: '@' }).waitFor({ timeout: 10000 });
}

// Signing out reloads the page: waits for the fresh one, so that the next
// sign-in is typed into it.
async function signOut(page) {
  await Promise.all([page.waitForEvent('load'), page.locator('#signout').click()]);
  await page.locator('#signin-form').waitFor({ timeout: 10000 });
}

async function availableMicros(page) {
  const value = await page.locator('#available').getAttribute('data-micros');
  return value === null ? null : BigInt(value);
}

(async () => {
  const browser = await chromium.launch({
    executablePath: process.env.SV_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const consoleErrors = [];
  // Script errors fail the test; an HTTP error answer the page handles
  // itself ("Failed to load resource") does not.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) consoleErrors.push(m.text());
  });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  let exitCode = 0;
  try {
    await step('sign in with an API key', async () => {
      await page.goto(opts.base + '/');
      // Every form control has a label (accessibility smoke check).
      const unlabeled = await page.evaluate(() => [...document.querySelectorAll('input, select')]
        .filter((e) => !e.labels || e.labels.length === 0).map((e) => e.id || e.name));
      if (unlabeled.length) throw new Error('controls without a label: ' + unlabeled.join(', '));
      await signIn(page, opts.key);
      await shot(page, '01-signed-in');
    });

    await step('create an 8-GPU instance and see it RUNNING', async () => {
      await page.getByLabel('Name').fill('e2e-train');
      await page.getByLabel('GPUs').selectOption('8');
      await page.getByRole('button', { name: 'Create instance' }).click();
      await page.getByRole('status').filter({ hasText: 'Created' }).waitFor({ timeout: 10000 });
      const row = page.locator('#instances-table tbody tr', { hasText: 'e2e-train' });
      await row.locator('[data-state="RUNNING"]').waitFor({ timeout: 30000 });
      await page.locator('#burn').filter({ hasNotText: '¥0.00' }).waitFor({ timeout: 10000 });
      await shot(page, '02-running');
    });

    await step('see the balance fall after a simulated minute', async () => {
      await page.locator('#available[data-micros]').waitFor();
      const before = await availableMicros(page);
      const clock = await rest('GET', '/v1/admin/clock', opts['admin-key']);
      const simulated = clock.status === 200;
      if (simulated) {
        // In steps, so that agents' heartbeats keep up with the clock.
        for (let i = 0; i < 7; i++) {
          const advanced = await rest('POST', '/v1/admin/clock:advance', opts['admin-key'], { by: '10s' });
          if (advanced.status !== 200) throw new Error('advance clock: ' + JSON.stringify(advanced.body));
          await page.waitForTimeout(400);
        }
      }
      console.log(`     minute: ${simulated ? 'fake clock advanced 70 s' : 'real time (no fake clock in this svd)'}`);
      const deadline = Date.now() + (simulated ? 20000 : 75000);
      let after = before;
      while (Date.now() < deadline) {
        after = await availableMicros(page);
        if (after < before) break;
        await page.waitForTimeout(250);
      }
      if (!(after < before)) throw new Error(`available stayed ${before}`);
      // 8 GPUs x 33,000 µ¥ per GPU-minute for each minute charged.
      if ((before - after) % 264000n !== 0n) throw new Error(`fell by ${before - after}, not whole minutes`);
      console.log(`     available ${before} -> ${after} µ¥`);
      await page.locator('#transfers-table tbody tr', { hasText: 'charge' }).first()
        .waitFor({ timeout: 15000 });
      await shot(page, '03-balance-fell');
    });

    await step('lists follow every page (apiAll)', async () => {
      // One item per page: the console's helper must walk all pages and
      // find what one big page holds (the trial grant and the charges).
      const counts = await page.evaluate(async () => {
        const paged = await apiAll('/v1/transfers?pageSize=1', 'transfers');
        const whole = await api('GET', '/v1/transfers?pageSize=1000');
        return { paged: paged.items.length, whole: (whole.transfers || []).length, truncated: paged.truncated };
      });
      if (counts.whole < 2 || counts.paged !== counts.whole || counts.truncated) {
        throw new Error('paging: ' + JSON.stringify(counts));
      }
      console.log(`     ${counts.paged} transfers over ${counts.paged} pages`);
    });

    await step('charts write amounts exactly (BigInt micros)', async () => {
      // 1,005,000 µ¥ is ¥1.01 (half away from zero); floats printed 1.00.
      const text = await page.evaluate(() => {
        const box = document.createElement('div');
        barChart(box, { title: 'Usage per day', unit: 'CNY', money: true, labels: ['2026-01-01'],
          series: [{ label: 'Usage', color: '#3b6fd8', values: [1005000n] }] });
        const svg = box.querySelector('svg');
        return { aria: svg.getAttribute('aria-label'), bar: svg.querySelector('rect.bar title').textContent };
      });
      if (!text.aria.includes('1.01') || !text.bar.includes('1.01')) {
        throw new Error('chart text not exact: ' + JSON.stringify(text));
      }
    });

    await step('stop the instance', async () => {
      await page.getByRole('button', { name: 'Stop e2e-train' }).click();
      const row = page.locator('#instances-table tbody tr', { hasText: 'e2e-train' });
      await row.locator('[data-state="STOPPED"]').waitFor({ timeout: 30000 });
      await page.getByRole('button', { name: 'Start e2e-train' }).waitFor();
      await shot(page, '04-stopped');
    });

    await step('let a 1-GPU instance move, then keep it in place', async () => {
      await page.getByLabel('Name').fill('e2e-small');
      await page.getByLabel('GPUs').selectOption('1');
      await page.getByRole('button', { name: 'Create instance' }).click();
      const row = page.locator('#instances-table tbody tr', { hasText: 'e2e-small' });
      await row.locator('[data-state="RUNNING"]').waitFor({ timeout: 30000 });
      await page.getByRole('button', { name: 'Allow moves of e2e-small' }).click();
      await page.getByRole('button', { name: 'Keep e2e-small in place' }).waitFor({ timeout: 10000 });
      const shown = await page.evaluate(async () => (await apiAll('/v1/instances?pageSize=500', 'instances'))
        .items.find((i) => i.name === 'e2e-small').movable);
      if (shown !== true) throw new Error('movable not set: ' + shown);
      await shot(page, '04b-movable');
      await page.getByRole('button', { name: 'Keep e2e-small in place' }).click();
      await page.getByRole('button', { name: 'Allow moves of e2e-small' }).waitFor({ timeout: 10000 });
    });

    await step('a create whose answer was lost is made once when clicked again', async () => {
      let lost = 0;
      await page.route('**/v1/instances', async (route) => {
        if (route.request().method() !== 'POST' || lost > 0) return route.fallback();
        lost += 1;
        await route.fetch();          // svd makes the instance ...
        await route.abort('failed');  // ... and its answer never arrives.
      });
      await page.getByLabel('Name').fill('e2e-lost');
      await page.getByLabel('GPUs').selectOption('1');
      await page.getByRole('button', { name: 'Create instance' }).click();
      await page.locator('#create-status.error').waitFor({ timeout: 10000 });
      await page.getByRole('button', { name: 'Create instance' }).click();
      await page.getByRole('status').filter({ hasText: 'Created e2e-lost' }).waitFor({ timeout: 10000 });
      await page.unroute('**/v1/instances');
      const made = await page.evaluate(async () => (await apiAll('/v1/instances?pageSize=500', 'instances'))
        .items.filter((i) => i.name === 'e2e-lost').length);
      if (made !== 1) throw new Error(`the create clicked again made ${made} instances`);
    });

    await step('add an SSH key, see the ssh command of port 22, delete the key; set and delete a webhook', async () => {
      await page.goto(opts.base + '/storage.html');
      await page.locator('#ssh-keys-table tbody').filter({ hasText: 'No SSH keys yet.' })
        .waitFor({ timeout: 15000 });
      const unlabeled = await page.evaluate(() => [...document.querySelectorAll('input, select, textarea')]
        .filter((e) => !e.labels || e.labels.length === 0).map((e) => e.id || e.name));
      if (unlabeled.length) throw new Error('controls without a label: ' + unlabeled.join(', '));
      // A private key is refused with the reason.
      await page.getByLabel('Public key').fill('-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n');
      await page.getByRole('button', { name: 'Add SSH key' }).click();
      await page.locator('#ssh-key-status.error').filter({ hasText: 'INVALID_SSH_KEY' }).waitFor({ timeout: 10000 });
      await page.getByLabel('Public key').fill(
        'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP70Y+xCt5EzReeUR50s3jvnEg4Zp0K69t/uLvsMIhiw e2e@laptop\n');
      await page.getByRole('button', { name: 'Add SSH key' }).click();
      const row = page.locator('#ssh-keys-table tbody tr', { hasText: 'e2e-laptop' });
      await row.filter({ hasText: 'SHA256:' }).waitFor({ timeout: 10000 });
      const created = await rest('POST', '/v1/instances', opts.key,
        { instance: { gpuCount: 1, name: 'e2e-ssh', ports: [{ containerPort: 22 }] }, requestId: 'e2e-ssh-1' });
      if (created.status !== 200) throw new Error('create: ' + JSON.stringify(created));
      await page.locator('#ports-table tbody tr', { hasText: 'e2e-ssh' })
        .locator('code', { hasText: /^ssh -p \d+ root@/ }).waitFor({ timeout: 30000 });
      await shot(page, '04c-ssh-keys');
      page.once('dialog', (d) => d.accept());
      await page.getByRole('button', { name: 'Delete e2e-laptop' }).click();
      await page.locator('#ssh-keys-table tbody').filter({ hasText: 'No SSH keys yet.' })
        .waitFor({ timeout: 10000 });
      // The webhook: saved with its secret shown once, then deleted.
      await page.locator('#webhook-state').filter({ hasText: 'No webhook' }).waitFor({ timeout: 15000 });
      await page.getByLabel('URL').fill('http://203.0.113.10/sv-hook');
      await page.getByRole('button', { name: 'Save webhook' }).click();
      await page.locator('#webhook-status').filter({ hasText: 'whsec_' }).waitFor({ timeout: 10000 });
      await page.locator('#webhook-state').filter({ hasText: 'Sending to http://203.0.113.10/sv-hook' })
        .waitFor({ timeout: 10000 });
      await shot(page, '04d-webhook');
      await page.getByRole('button', { name: 'Delete webhook' }).click();
      await page.locator('#webhook-state').filter({ hasText: 'No webhook' }).waitFor({ timeout: 10000 });
      await page.goto(opts.base + '/');
      await page.locator('#instances-table tbody tr').first().waitFor({ timeout: 10000 });
    });

    await step('a volume row keeps the chosen instance across its 2 s refreshes', async () => {
      await page.goto(opts.base + '/storage.html');
      const made = await rest('POST', '/v1/volumes', opts.key,
        { volume: { name: 'e2e-vol', sizeGib: 10, kind: 'NETWORK' }, requestId: 'e2e-vol-1' });
      if (made.status !== 200) throw new Error('create volume: ' + JSON.stringify(made));
      const row = page.locator('#volumes-table tbody tr', { hasText: 'e2e-vol' });
      const chooser = row.getByLabel('Instance for e2e-vol');
      await chooser.waitFor({ timeout: 15000 });
      const options = await chooser.locator('option').count();
      if (options < 2) throw new Error(`the chooser lists ${options} instance(s), not 2 or more`);
      // The second instance, not the one a rebuilt chooser would start on.
      const second = await chooser.locator('option').nth(1).getAttribute('value');
      await chooser.selectOption(second);
      await chooser.focus();
      const chosen = await chooser.elementHandle();
      await page.waitForTimeout(2500);
      await page.waitForFunction((n) => !n.isConnected, chosen, { timeout: 5000 });  // the row was rebuilt
      const shown = await chooser.inputValue();
      if (shown !== second) throw new Error(`the rebuilt chooser shows ${shown}, not ${second}`);
      const focused = await page.evaluate(() => document.activeElement.getAttribute('aria-label'));
      if (focused !== 'Instance for e2e-vol') throw new Error(`focus went to ${focused}`);
      await row.getByRole('button', { name: 'Attach', exact: true }).click();
      await page.locator('#volume-status').filter({ hasText: 'Attach: e2e-vol' }).waitFor({ timeout: 10000 });
      const volume = await rest('GET', `/v1/volumes/${made.body.id}`, opts.key);
      const attached = ((volume.body && volume.body.attachments) || []).map((a) => a.instanceId);
      if (attached.length !== 1 || attached[0] !== second) {
        throw new Error(`attached to ${JSON.stringify(attached)}, not ${second}`);
      }
      await page.goto(opts.base + '/');
      await page.locator('#instances-table tbody tr').first().waitFor({ timeout: 10000 });
    });

    let admin = null;
    await step('open the admin dashboard and see the revenue', async () => {
      admin = await context.newPage();
      await admin.goto(opts.base + '/admin');
      await signIn(admin, opts['admin-key']);
      await admin.locator('#kpi-charged[data-micros]').waitFor({ timeout: 15000 });
      const charged = BigInt(await admin.locator('#kpi-charged').getAttribute('data-micros'));
      if (charged <= 0n) throw new Error('no revenue shown');
      // Some bar of the revenue chart has a height (paid or trial part).
      await admin.waitForFunction(() => [...document.querySelectorAll('#revenue-day-chart svg rect.bar')]
        .some((r) => Number(r.getAttribute('height')) > 0), null, { timeout: 10000 });
      await admin.locator('#fleet-heatmap svg rect.cell').first().waitFor();
      // Utilization from the simulated agents' telemetry: some node shows a
      // percentage (not the no-samples dash) once a flush has landed.
      await admin.locator('#fleet-util-heatmap svg rect.cell').first().waitFor();
      await admin.waitForFunction(() => /\d+%/.test(document.getElementById('kpi-util').textContent),
        null, { timeout: 30000 });
      await admin.locator('#balances-table tbody tr', { hasText: 'e2e' }).first().waitFor();
      // Every tenant's invoices (GET /v1/admin/invoices): none yet, and totals of zero.
      await admin.waitForFunction(() => /^0 invoices: ¥0\.00 invoiced, ¥0\.00 due/.test(
        document.getElementById('invoice-totals').textContent), null, { timeout: 15000 });
      console.log(`     dashboard shows ${charged} µ¥ charged`);
      await shot(admin, '05-admin');
    });

    await step('approve another operator\'s credit on the dashboard', async () => {
      const me = await rest('GET', '/v1/account', opts.key);
      const added = await rest('POST', '/v1/admin/operators', opts['admin-key'], { email: 'second@ops.e2e' });
      if (added.status !== 200) throw new Error('add operator: ' + JSON.stringify(added));
      const asked = await rest('POST', `/v1/admin/tenants/${me.body.tenantId}/creditRequests`, added.body.apiKey,
        { creditId: 'e2e-goodwill', amountMicros: '1500000000', reason: 'e2e: outage goodwill' });
      if (asked.status !== 200 || asked.body.state !== 'CREDIT_PENDING_APPROVAL') {
        throw new Error('request credit: ' + JSON.stringify(asked));
      }
      const row = admin.locator('#credits-table tbody tr', { hasText: 'e2e-goodwill' });
      await row.waitFor({ timeout: 15000 });
      await shot(admin, '05b-credit-pending');
      await row.getByRole('button', { name: 'Approve credit e2e-goodwill' }).click();
      await admin.locator('#credit-status').filter({ hasText: 'approved and posted' }).waitFor({ timeout: 10000 });
      await admin.locator('#credits-table tbody tr', { hasText: 'e2e-goodwill' }).waitFor({ state: 'detached', timeout: 10000 });
    });

    await step('see the suspension banner and a refused create, then resume', async () => {
      const me = await rest('GET', '/v1/account', opts.key);
      const tenant = me.body.tenantId;
      // Suspended from the dashboard's form.
      await admin.locator('#standing-tenant').selectOption(tenant);
      await admin.getByLabel('Reason', { exact: true }).fill('e2e: unpaid invoice');
      await admin.getByRole('button', { name: 'Suspend' }).click();
      await admin.locator('#standing-status').filter({ hasText: 'suspended;' }).waitFor({ timeout: 10000 });
      await shot(admin, '05c-suspended-from-dashboard');
      await page.reload();
      await page.locator('#suspended').filter({ hasText: 'e2e: unpaid invoice' }).waitFor({ timeout: 10000 });
      const row = page.locator('#instances-table tbody tr', { hasText: 'e2e-small' });
      await row.locator('[data-state="STOPPED"]').waitFor({ timeout: 10000 });
      await page.getByLabel('Name').fill('e2e-refused');
      await page.getByLabel('GPUs').selectOption('1');
      await page.getByRole('button', { name: 'Create instance' }).click();
      await page.locator('#create-status.error').filter({ hasText: 'TENANT_SUSPENDED' })
        .waitFor({ timeout: 10000 });
      await page.locator('#notices .notice-suspension').first().waitFor({ timeout: 10000 });
      await shot(page, '06-suspended');
      const resumed = await rest('POST', `/v1/admin/tenants/${tenant}:resume`, opts['admin-key'],
        { reason: 'e2e: paid' });
      if (resumed.status !== 200 || !resumed.body.wasSuspended) {
        throw new Error('resume: ' + JSON.stringify(resumed));
      }
      await page.reload();
      await page.locator('#whoami').filter({ hasText: '@' }).waitFor({ timeout: 10000 });
      if (!(await page.locator('#suspended').isHidden())) throw new Error('banner still shown');
    });

    await step('sign out of the dashboard: a tenant key signed in next sees none of it', async () => {
      await admin.locator('#balances-table tbody tr', { hasText: 'e2e' }).first().waitFor({ timeout: 10000 });
      await signOut(admin);
      await signIn(admin, opts.key);  // every dashboard call is refused (403)
      await admin.locator('#admin-error').filter({ hasText: 'not an operator key' }).waitFor({ timeout: 15000 });
      const rows = await admin.evaluate(() => ['#balances-table', '#credits-table']
        .map((t) => document.querySelectorAll(`${t} tbody tr`).length));
      if (rows[0] !== 0 || rows[1] !== 0) throw new Error(`balance and credit rows left: ${rows}`);
      if ((await admin.locator('#kpi-charged').getAttribute('data-micros')) !== null) {
        throw new Error('the operator\'s revenue is still shown');
      }
      await shot(admin, '07-admin-signed-out');
    });

    await step('sign out of /storage.html: the next key does not see the webhook secret', async () => {
      await page.goto(opts.base + '/storage.html');
      await page.locator('#whoami').filter({ hasText: '@' }).waitFor({ timeout: 10000 });
      await page.getByLabel('URL').fill('http://203.0.113.10/sv-hook-2');
      await page.getByRole('button', { name: 'Save webhook' }).click();
      await page.locator('#webhook-status').filter({ hasText: 'whsec_' }).waitFor({ timeout: 10000 });
      await signOut(page);
      await signIn(page, opts['admin-key']);
      const line = await page.locator('#webhook-status').textContent();
      if (line.includes('whsec_')) throw new Error('the last tenant\'s secret is shown: ' + line);
      // Back to the tenant, whose webhook goes.
      await signOut(page);
      await signIn(page, opts.key);
      const deleted = await rest('DELETE', '/v1/webhook', opts.key);
      if (deleted.status !== 200) throw new Error('delete webhook: ' + JSON.stringify(deleted));
    });
    if (consoleErrors.length) throw new Error('browser console errors: ' + consoleErrors.join(' | '));
  } catch (e) {
    exitCode = 1;
    await shot(page, '99-failure').catch(() => {});
  } finally {
    await browser.close();
  }
  const passed = results.filter((r) => r.ok).length;
  console.log(`${passed} passed, ${results.length - passed + (exitCode && passed === results.length ? 1 : 0)} failed`);
  fs.writeFileSync(path.join(opts.out, 'results.json'), JSON.stringify(results, null, 1));
  process.exit(exitCode);
})();
