// The approval inbox at /ui, driven in headless Chromium against the real gateway binary and its demo server.
//
// GATEWAY_BIN names the binary (default: $CARGO_TARGET_DIR or ../../target, then debug/toolnexus-gateway);
// CHROMIUM the browser (default /usr/bin/chromium); TEST_LOG=1 echoes the gateway's log.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const GATEWAY_BIN =
  process.env.GATEWAY_BIN || join(resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug/toolnexus-gateway');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SCREENSHOT_DIR = process.env.SCREENSHOT_DIR || tmpdir();

let gateway;
let browser;

before(async () => {
  assert.ok(existsSync(GATEWAY_BIN), `no gateway binary at ${GATEWAY_BIN}: run cargo build or set GATEWAY_BIN`);
  assert.ok(existsSync(CHROMIUM), `no browser at ${CHROMIUM}: apt-get install chromium, or set CHROMIUM`);
  gateway = await startGateway();
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
});

after(async () => {
  await browser?.close();
  await gateway?.stop();
});

// ---- the gateway ----------------------------------------------------------------------------------------

async function startGateway() {
  const dir = mkdtempSync(join(tmpdir(), 'toolnexus-ui-'));
  const config = join(dir, 'gateway.toml');
  writeFileSync(config, 'listen = "127.0.0.1:0"\n\n[[servers]]\nname = "demo"\nbuiltin = "demo"\n');
  const child = spawn(GATEWAY_BIN, ['--config', config], { stdio: ['ignore', 'pipe', 'pipe'] });
  const log = [];
  createInterface({ input: child.stderr }).on('line', (line) => {
    log.push(line);
    if (process.env.TEST_LOG) process.stderr.write(`gateway: ${line}\n`);
  });
  const exited = new Promise((done) => child.once('exit', done));
  const first = await new Promise((done, fail) => {
    const lines = createInterface({ input: child.stdout });
    lines.once('line', done);
    child.once('exit', (code) => fail(new Error(`the gateway exited (${code}) before listening:\n${log.join('\n')}`)));
  });
  const match = /^listening on (http:\/\/\S+)$/.exec(first);
  assert.ok(match, `unexpected first line from the gateway: ${first}`);
  const base = match[1];
  const ready = await fetch(`${base}/readyz?wait=30`);
  assert.equal(ready.status, 200, `the gateway is not ready: ${await ready.text()}`);
  return {
    base,
    log,
    async stop() {
      child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

async function json(path, init = {}) {
  const response = await fetch(`${gateway.base}${path}`, {
    ...init,
    headers: { 'content-type': 'application/json', ...(init.headers || {}) },
  });
  const body = await response.json();
  assert.ok(response.ok, `${init.method || 'GET'} ${path} answered ${response.status}: ${JSON.stringify(body)}`);
  return body;
}

/** Starts a tool call over REST and returns it once it waits on its Request. */
async function startCall(tool, args = {}) {
  const call = await json('/calls?wait=20', {
    method: 'POST',
    body: JSON.stringify({ server: 'demo', tool, arguments: args }),
  });
  assert.equal(call.status, 'input_required', JSON.stringify(call));
  assert.equal(call.requests.length, 1);
  return { call: call.id, request: call.requests[0] };
}

/** The `results` the demo tool returned once its call completed. */
async function resultsOf(call) {
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  return settled.result.structuredContent.results;
}

// ---- the page -------------------------------------------------------------------------------------------

/** Opens the inbox in a fresh context, recording every URL the browser asks for and every console error. */
async function openInbox(t, viewport = { width: 1024, height: 800 }) {
  const context = await browser.newContext({ viewport });
  t.after(() => context.close());
  const requested = [];
  const problems = [];
  context.on('request', (request) => requested.push(request.url()));
  const page = await context.newPage();
  page.on('console', (message) => {
    // Failed responses are recorded below with their URL; the console only says that one failed.
    if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) problems.push(message.text());
  });
  page.on('response', (response) => response.status() >= 400 && problems.push(`${response.status()} ${response.url()}`));
  page.on('pageerror', (error) => problems.push(String(error)));
  await page.goto(`${gateway.base}/ui`);
  await page.locator('#connection[data-state="live"]').waitFor();
  return { page, requested, problems };
}

function card(page, request) {
  return page.locator(`li[data-request="${request}"]`);
}

/** Waits for the card to leave the list and for its confirmation to be announced. */
async function expectResolved(page, request, outcome) {
  await card(page, request).waitFor({ state: 'detached' });
  await page.locator('#notices .notice', { hasText: outcome }).first().waitFor();
}

function assertStayedHome(requested, problems, expected = []) {
  const foreign = requested.filter((url) => new URL(url).origin !== gateway.base);
  assert.deepEqual(foreign, [], 'the page requested something outside the gateway');
  assert.deepEqual(problems, expected, 'the page logged errors or got error responses');
}

// ---- tests ----------------------------------------------------------------------------------------------

test('the inbox is served with security headers and no inline script', async () => {
  const redirect = await fetch(`${gateway.base}/ui`, { redirect: 'manual' });
  assert.equal(redirect.headers.get('location'), '/ui/');
  const page = await fetch(`${gateway.base}/ui/`);
  assert.equal(page.status, 200);
  const csp = page.headers.get('content-security-policy');
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'(;|$)/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
  assert.equal(page.headers.get('referrer-policy'), 'no-referrer');
  assert.equal(page.headers.get('x-frame-options'), 'DENY');
  const html = await page.text();
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)/, 'inline <script>');
  assert.doesNotMatch(html, /\son[a-z]+=/i, 'inline event handler');
  assert.doesNotMatch(html, /\sstyle=/i, 'inline style');
});

test('a form-mode Request is filled in the page and the call completes with exactly the typed values', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const { call, request } = await startCall('collect_profile');
  const form = card(page, request);
  await form.waitFor();
  await assert.doesNotReject(form.getByText('collect_profile', { exact: true }).waitFor());
  assert.equal(await form.getByLabel('Newsletter').isChecked(), false, 'the default is pre-filled');
  assert.match(await form.locator('[data-field="name"]').innerText(), /required/);

  await form.getByLabel('Name').pressSequentially('Ada Lovelace');
  await form.getByLabel('Email').pressSequentially('ada at example');
  await form.getByRole('button', { name: 'Accept' }).click();
  const email = form.getByLabel('Email');
  const error = form.locator('[data-field="email"] .error');
  await error.waitFor();
  assert.match(await error.innerText(), /email/);
  assert.equal(await email.getAttribute('aria-invalid'), 'true');
  assert.ok((await email.getAttribute('aria-describedby')).split(' ').includes(await error.getAttribute('id')));
  assert.equal((await json(`/requests/${request}`)).status, 'pending', 'a 422 leaves the Request pending');
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-form.png'), fullPage: true });

  await email.fill('');
  await email.pressSequentially('ada@example.com');
  await form.getByLabel('Age').pressSequentially('36');
  await form.getByLabel('Score').pressSequentially('9.5');
  await form.getByLabel('green').check();
  await form.getByLabel('a', { exact: true }).check();
  await form.getByLabel('c', { exact: true }).check();
  await form.getByRole('button', { name: 'Accept' }).click();

  await expectResolved(page, request, 'Accepted');
  assert.deepEqual(await resultsOf(call), [
    {
      action: 'accept',
      content: {
        name: 'Ada Lovelace',
        email: 'ada@example.com',
        age: 36,
        score: 9.5,
        newsletter: false,
        color: 'green',
        tags: ['a', 'c'],
      },
    },
  ]);
  assertStayedHome(requested, problems, [`422 ${gateway.base}/requests/${request}/answer`]);
});

test('Decline sends decline upstream', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('confirm_action', { action: 'deploy' });
  const { page, requested, problems } = await openInbox(t);
  const form = card(page, request);
  await form.getByRole('heading', { name: 'Confirm: deploy?' }).waitFor();
  await form.getByRole('button', { name: 'Decline' }).click();
  await expectResolved(page, request, 'Declined');
  assert.deepEqual(await resultsOf(call), [{ action: 'decline' }]);
  assertStayedHome(requested, problems);
});

test('a URL-mode Request shows the whole URL, fetches nothing, and Done accepts', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('authorize', { service: 'docs' });
  const { page, requested, problems } = await openInbox(t);
  const form = card(page, request);
  const url = 'https://example.com/authorize?service=docs';
  await form.locator('.url').waitFor();
  assert.equal(await form.locator('.url').innerText(), url);
  assert.equal(await form.locator('.url mark').innerText(), 'example.com');
  const link = form.getByRole('link', { name: 'Open link' });
  assert.equal(await link.getAttribute('href'), url);
  assert.equal(await link.getAttribute('target'), '_blank');
  assert.equal(await link.getAttribute('rel'), 'noopener noreferrer');
  await form.getByRole('button', { name: 'Done' }).click();
  await expectResolved(page, request, 'Accepted');
  assert.deepEqual(await resultsOf(call), [{ action: 'accept' }]);
  assertStayedHome(requested, problems);
});

test('a Request can be answered with the keyboard alone', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('confirm_action', { action: 'ship' });
  const { page, requested, problems } = await openInbox(t);
  await card(page, request).waitFor();
  const focused = () =>
    page.evaluate(() => {
      const element = document.activeElement;
      const label = element?.labels?.[0]?.textContent || element?.textContent || '';
      return `${element?.closest('[data-request]')?.dataset.request} ${element?.tagName} ${label.trim()}`;
    });
  const tabTo = async (wanted) => {
    for (let presses = 0; presses < 40; presses++) {
      await page.keyboard.press('Tab');
      if ((await focused()).startsWith(`${request} ${wanted}`)) return;
    }
    assert.fail(`Tab never reached ${wanted}`);
  };
  await tabTo('INPUT Confirm');
  await page.keyboard.press('Space');
  await tabTo('INPUT Note');
  await page.keyboard.type('on Friday');
  await tabTo('BUTTON Accept');
  await page.keyboard.press('Enter');
  await expectResolved(page, request, 'Accepted');
  assert.deepEqual(await resultsOf(call), [{ action: 'accept', content: { confirm: true, note: 'on Friday' } }]);
  assertStayedHome(requested, problems);
});

test('the inbox fits a 360px-wide screen, and Cancel sends cancel', { timeout: 60_000 }, async (t) => {
  const first = await startCall('authorize', { service: 'a-service-with-a-rather-long-name-that-must-wrap' });
  const second = await startCall('collect_profile');
  const { page, requested, problems } = await openInbox(t, { width: 360, height: 740 });
  await card(page, first.request).waitFor();
  await card(page, second.request).waitFor();
  const order = await page.locator('li[data-request]').evaluateAll((items) => items.map((i) => i.dataset.request));
  assert.deepEqual(order, [second.request, first.request], 'newest on top');
  const width = await page.evaluate(() => document.scrollingElement.scrollWidth);
  assert.ok(width <= 360, `the page is ${width}px wide`);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-360.png'), fullPage: true });

  await card(page, second.request).getByRole('button', { name: 'Cancel' }).click();
  await expectResolved(page, second.request, 'Cancelled');
  assert.deepEqual(await resultsOf(second.call), [{ action: 'cancel' }]);
  await card(page, first.request).getByRole('button', { name: 'Cancel' }).click();
  await expectResolved(page, first.request, 'Cancelled');
  assert.deepEqual(await resultsOf(first.call), [{ action: 'cancel' }]);
  assertStayedHome(requested, problems);
});
