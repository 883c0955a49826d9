// The approval inbox at /ui, driven in headless Chromium against the real gateway binary and its demo server.
//
// GATEWAY_BIN names the binary (default: $CARGO_TARGET_DIR or ../../target, then debug/toolnexus-gateway);
// CHROMIUM the browser (default /usr/bin/chromium); TEST_LOG=1 echoes the gateway's log.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createConnection, createServer } from 'node:net';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const GATEWAY_BIN =
  process.env.GATEWAY_BIN || join(resolve(ROOT, process.env.CARGO_TARGET_DIR || 'target'), 'debug/toolnexus-gateway');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SCREENSHOT_DIR = process.env.SCREENSHOT_DIR || tmpdir();

/** The tokens of the gateway with authentication: an approver's and an agent's. */
const LEAD_TOKEN = 'lead-token-0f4c9b2e';
const AGENT_TOKEN = 'agent-token-7d1e3a58';
const TOKENS = tokenConfig([
  ['lead', 'approver', LEAD_TOKEN],
  ['ci-agent', 'agent', AGENT_TOKEN],
]);
/** Another approver's token, for a gateway with a team: the lead, this approver and the agent. */
const BO_TOKEN = 'bo-token-9b41c7e2';
const TEAM = tokenConfig([
  ['lead', 'approver', LEAD_TOKEN],
  ['bo', 'approver', BO_TOKEN],
  ['ci-agent', 'agent', AGENT_TOKEN],
]);

/** `[[auth.tokens]]` entries for `[name, role, token]`, each token given as its SHA-256. */
function tokenConfig(entries) {
  return entries
    .map(([name, role, token]) => {
      const sha256 = createHash('sha256').update(token).digest('hex');
      return `[[auth.tokens]]\nname = "${name}"\nrole = "${role}"\nsha256 = "${sha256}"\n`;
    })
    .join('\n');
}

/** The gateway without tokens, and the one with them. */
let gateway;
let secured;
let browser;

before(async () => {
  assert.ok(existsSync(GATEWAY_BIN), `no gateway binary at ${GATEWAY_BIN}: run cargo build or set GATEWAY_BIN`);
  assert.ok(existsSync(CHROMIUM), `no browser at ${CHROMIUM}: apt-get install chromium, or set CHROMIUM`);
  gateway = await startGateway('[[approvals]]\nserver = "demo"\ntools = ["echo"]\n');
  secured = await startGateway(TOKENS);
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
  await secured?.stop();
});

// ---- the gateway ----------------------------------------------------------------------------------------

/** Starts the gateway with the demo server and `extra` config on `listen`, and waits until it is ready. */
async function startGateway(extra = '', listen = '127.0.0.1:0') {
  const dir = mkdtempSync(join(tmpdir(), 'toolnexus-ui-'));
  const config = join(dir, 'gateway.toml');
  const store = `[store]\nurl = "sqlite:${join(dir, 'gateway.sqlite3')}"\n`;
  writeFileSync(config, `listen = "${listen}"\n\n${store}\n[[servers]]\nname = "demo"\nbuiltin = "demo"\n\n${extra}`);
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

const bearer = (token) => (token ? { authorization: `Bearer ${token}` } : {});

/** Calls the API of `base` (the plain gateway by default), with `token` if given, and expects a 2xx. */
async function json(path, { base = gateway.base, token, ...init } = {}) {
  const response = await fetch(`${base}${path}`, {
    ...init,
    headers: { 'content-type': 'application/json', ...bearer(token), ...(init.headers || {}) },
  });
  const body = await response.json();
  assert.ok(response.ok, `${init.method || 'GET'} ${path} answered ${response.status}: ${JSON.stringify(body)}`);
  return body;
}

/**
 * Starts a tool call over REST and returns it once it waits on its Request; `args` is an object, or the JSON
 * text of one (to send numbers JavaScript cannot hold).
 */
async function startCall(tool, args = {}, as = {}) {
  const text = typeof args === 'string' ? args : JSON.stringify(args);
  const call = await json('/calls?wait=20', {
    ...as,
    method: 'POST',
    body: `{"server": "demo", "tool": ${JSON.stringify(tool)}, "arguments": ${text}}`,
  });
  assert.equal(call.status, 'input_required', JSON.stringify(call));
  assert.equal(call.requests.length, 1);
  return { call: call.id, request: call.requests[0] };
}

/** The `results` the demo tool returned once its call completed. */
async function resultsOf(call, as = {}) {
  const settled = await json(`/calls/${call}?wait=20`, as);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  return settled.result.structuredContent.results;
}

// ---- the page -------------------------------------------------------------------------------------------

/**
 * Opens the inbox in a fresh context, recording every request the browser makes and every console error, and
 * unless told not to waits until it is live (or, with `signIn`, until it asks for a token).
 */
async function openInbox(t, { viewport = { width: 1024, height: 800 }, base = gateway.base, signIn = false, route, ready = true } = {}) {
  const context = await browser.newContext({ viewport });
  t.after(() => context.close());
  const requested = [];
  const problems = [];
  const sent = [];
  context.on('request', (request) => {
    requested.push(request.url());
    sent.push(request);
  });
  const page = await context.newPage();
  page.on('console', (message) => {
    // Failed responses are recorded below with their URL; the console only says that one failed.
    if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) problems.push(message.text());
  });
  page.on('response', (response) => response.status() >= 400 && problems.push(`${response.status()} ${response.url()}`));
  page.on('pageerror', (error) => problems.push(String(error)));
  if (route) await route(page);
  await page.goto(`${base}/ui`);
  if (ready) await page.locator(signIn ? '#signin' : '#connection[data-state="live"]').waitFor();
  return { page, requested, problems, sent };
}

function card(page, request) {
  return page.locator(`li[data-request="${request}"]`);
}

/** The box of an approval's arguments. */
function argumentsOf(form) {
  return form.getByRole('figure', { name: /^Arguments/ }).locator('pre');
}

/** Waits for the card to leave the list and for its confirmation to be announced. */
async function expectResolved(page, request, outcome) {
  await card(page, request).waitFor({ state: 'detached' });
  await page.locator('#notices .notice', { hasText: outcome }).first().waitFor();
}

function assertStayedHome(requested, problems, expected = [], base = gateway.base) {
  const foreign = requested.filter((url) => new URL(url).origin !== base);
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

test('a posted Request shows who posted it, and its poster reads the Answer', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const schema = { type: 'object', properties: { reason: { type: 'string', title: 'Reason' } }, required: ['reason'] };
  const posted = await json('/requests', {
    method: 'POST',
    body: JSON.stringify({ kind: 'input', prompt: 'Why deploy on a Friday?', data: { schema } }),
  });
  const form = card(page, posted.id);
  await form.getByRole('heading', { name: 'Why deploy on a Friday?' }).waitFor();
  assert.match(await form.locator('.meta').innerText(), /Posted by\s+anonymous/);
  await form.getByLabel('Reason').pressSequentially('hotfix');
  await form.getByRole('button', { name: 'Accept' }).click();
  await expectResolved(page, posted.id, 'Accepted');
  const answered = await json(`/requests/${posted.id}?wait=20`);
  assert.equal(answered.status, 'answered');
  assert.deepEqual(answered.answer.data, { reason: 'hotfix' });
  assert.equal(answered.result, undefined);
  assertStayedHome(requested, problems);
});

test('a question shows its options, one or several, and free text where it has none', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const questions = [
    { question: 'Which color?', header: 'Color', options: ['red', 'green'] },
    { question: 'Which regions?', options: ['eu', 'us', 'ap'], multiple: true },
    { question: 'Anything else?' },
  ];
  const posted = await json('/requests', {
    method: 'POST',
    body: JSON.stringify({ kind: 'question', prompt: 'A few questions', data: { questions } }),
  });
  const form = card(page, posted.id);
  await form.getByRole('heading', { name: 'A few questions' }).waitFor();
  await form.getByRole('button', { name: 'Accept' }).click();
  await form.getByText('Please correct the 2 marked fields.').waitFor();
  await form.getByRole('radio', { name: 'green' }).check();
  await form.getByRole('checkbox', { name: 'eu' }).check();
  await form.getByRole('checkbox', { name: 'ap' }).check();
  await form.getByLabel('Anything else?').pressSequentially('not today');
  await form.getByRole('button', { name: 'Accept' }).click();
  await expectResolved(page, posted.id, 'Accepted');
  const answered = await json(`/requests/${posted.id}?wait=20`);
  assert.deepEqual(answered.answer.data, { answers: ['green', ['eu', 'ap'], 'not today'] });
  assertStayedHome(requested, problems);
});

test('the page title counts the pending Requests, and the page offers notifications until they are allowed', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const base = 'Approval inbox · toolnexus-gateway';
  // Other tests may have left Requests pending: the count starts from theirs.
  const listed = (await json('/requests?status=pending&limit=1000')).length;
  const counted = (count) => (count ? `(${count}) ${base}` : base);
  await page.waitForFunction((title) => document.title === title, counted(listed));
  const posted = [];
  for (const prompt of ['First?', 'Second?']) {
    posted.push(await json('/requests', { method: 'POST', body: JSON.stringify({ kind: 'approval', prompt }) }));
  }
  await page.waitForFunction((title) => document.title === title, counted(listed + 2));
  const ask = page.getByRole('button', { name: 'Notify me' });
  await ask.waitFor();
  await page.context().grantPermissions(['notifications']);
  await ask.click();
  await page.getByText('New Requests will raise a notification.').waitFor();
  assert.equal(await ask.isHidden(), true);
  for (const request of posted) {
    await json(`/requests/${request.id}/answer`, { method: 'POST', body: JSON.stringify({ ok: true }) });
  }
  await page.waitForFunction((title) => document.title === title, counted(listed));
  assertStayedHome(requested, problems);
});

test('an approval shows who calls which tool with what, and Approve sends exactly that call', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const { call, request } = await startCall('echo', { text: 'from the inbox \u202e' });
  const form = card(page, request);
  await form.getByRole('button', { name: 'Approve' }).waitFor();
  const facts = await form.locator('.facts').innerText();
  assert.match(facts, /Tool\s+echo/);
  assert.match(facts, /Caller\s+anonymous/);
  const args = argumentsOf(form);
  assert.equal(await args.innerText(), '{\n  "text": "from the inbox ⟨U+202E⟩"\n}');
  assert.doesNotMatch(await form.innerText(), /null/, 'nothing shows where an approval needs one person');
  await form.locator('dd[data-tool-of] bdi').waitFor();
  await form.getByRole('button', { name: 'Approve' }).click();
  await expectResolved(page, request, 'Accepted');
  const notice = page.locator('#notices .notice', { hasText: 'Accepted' }).first();
  assert.equal(await notice.innerText(), 'Accepted: echo on demo: Allow echo on demo?');
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assert.equal(settled.result.content[0].text, 'from the inbox \u202e');
  assertStayedHome(requested, problems);
});

test('declining an approval in the page fails its call, which never reaches the upstream', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const { call, request } = await startCall('echo', { text: 'never sent' });
  const form = card(page, request);
  await form.getByRole('button', { name: 'Decline' }).click();
  await expectResolved(page, request, 'Declined');
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'failed', JSON.stringify(settled));
  assert.equal(settled.error.reason, 'declined', JSON.stringify(settled));
  assert.deepEqual(settled.requests, [request], 'nothing went upstream to ask anything');
  assertStayedHome(requested, problems);
});

test('an approval shows its arguments as forwarded: a big integer whole, hidden characters as code points, isolated and named', { timeout: 60_000 }, async (t) => {
  // Read with JSON.parse, the amount shows as 12345678901234567000. Shown as sent, the right-to-left mark lays the
  // block out from the right, and the Arabic letter marks between the digits make the limit read "001".
  const hostile = '{"\u200fpayee": "mallory", "amount": 12345678901234567890, "limit": "1\u061c0\u061c0", "text": "pay"}';
  const { call, request } = await startCall('echo', hostile);
  const { page, requested, problems } = await openInbox(t);
  const form = card(page, request);
  const args = argumentsOf(form);
  await args.waitFor();

  const held = await fetch(`${gateway.base}/requests/${request}`).then((response) => response.text());
  assert.match(held, /"amount":12345678901234567890[,}]/, 'the gateway holds the integer whole');
  assert.equal(
    await args.innerText(),
    '{\n  "⟨U+200F⟩payee": "mallory",\n  "amount": 12345678901234567890,\n  "limit": "1⟨U+061C⟩0⟨U+061C⟩0",\n  "text": "pay"\n}',
  );
  assert.doesNotMatch(await args.evaluate((element) => element.textContent), /[\u061c\u200f]/);
  const warning = form.locator('.warning', { hasText: 'U+061C ARABIC LETTER MARK' });
  assert.match(await warning.innerText(), /U\+200F RIGHT-TO-LEFT MARK/);

  // Left to right and isolated: the block, and each key and string in it.
  const layout = await args.evaluate((pre) => {
    const { direction, unicodeBidi } = getComputedStyle(pre);
    const isolated = [...pre.querySelectorAll('*')].filter((element) => getComputedStyle(element).unicodeBidi === 'isolate');
    // Each line as laid out: where each of its characters is, in the order of the text.
    const lines = [[]];
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i += 1) {
        if (node.data[i] === '\n') {
          lines.push([]);
          continue;
        }
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        lines.at(-1).push([node.data[i], range.getBoundingClientRect().left]);
      }
    }
    const misordered = lines.filter((line) => line.some(([, left], i) => i > 0 && left <= line[i - 1][1]));
    return {
      direction,
      unicodeBidi,
      isolated: isolated.map((element) => element.textContent),
      misordered: misordered.map((line) => [...line].sort((a, b) => a[1] - b[1]).map(([char]) => char).join('')),
    };
  });
  assert.deepEqual([layout.direction, layout.unicodeBidi], ['ltr', 'isolate']);
  const strings = ['"⟨U+200F⟩payee"', '"mallory"', '"amount"', '"limit"', '"1⟨U+061C⟩0⟨U+061C⟩0"', '"text"', '"pay"'];
  assert.deepEqual(layout.isolated, strings, 'each key and string is isolated');
  assert.deepEqual(layout.misordered, [], 'these lines read otherwise than they are written');

  // The digest shown is the approval's, and the page found the arguments it shows hash to it.
  const { data } = await json(`/requests/${request}`);
  assert.match(await form.locator('.digest').innerText(), new RegExp(`^Digest ${data.digest}: the SHA-256 of the arguments shown`));
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-arguments.png'), fullPage: true });

  await form.getByRole('button', { name: 'Approve' }).click();
  await expectResolved(page, request, 'Accepted');
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assert.equal(settled.result.content[0].text, 'pay');
  assertStayedHome(requested, problems);
});

test('long arguments are shown whole above Approve, on a phone too, and Approve sends all of them', { timeout: 60_000 }, async (t) => {
  const long = `${'pay mallory 1000000 '.repeat(150)}and that is all`;
  const { call, request } = await startCall('echo', { text: long });
  const { page, requested, problems } = await openInbox(t, { viewport: { width: 360, height: 740 } });
  const form = card(page, request);
  const args = argumentsOf(form);
  await args.waitFor();
  assert.equal(await args.innerText(), `{\n  "text": "${long}"\n}`);
  const shown = await args.evaluate((pre) => {
    const last = document.createRange();
    const text = pre.querySelector('bdi').lastChild;
    last.setStart(text, text.length - 1);
    last.setEnd(text, text.length);
    const end = last.getBoundingClientRect();
    const box = pre.getBoundingClientRect();
    const approve = pre.closest('form').querySelector('button[type="submit"]').getBoundingClientRect();
    return {
      scrolls: pre.scrollHeight > pre.clientHeight || pre.scrollWidth > pre.clientWidth,
      endInside: end.top >= box.top && end.bottom <= box.bottom && end.left >= box.left && end.right <= box.right,
      endAboveApprove: end.bottom <= approve.top,
      fitsWidth: document.scrollingElement.scrollWidth <= window.innerWidth,
    };
  });
  assert.deepEqual(shown, { scrolls: false, endInside: true, endAboveApprove: true, fitsWidth: true });
  assert.equal(await args.isVisible(), true);

  await form.getByRole('button', { name: 'Approve' }).click();
  await expectResolved(page, request, 'Accepted');
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assert.equal(settled.result.content[0].text, long);
  assertStayedHome(requested, problems);
});

test('when the arguments the page shows do not hash to the digest, it does not offer Approve', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('echo', { text: 'pay', amount: 4711 });
  // Stands in for arguments read otherwise than the gateway holds them.
  const tamper = (page) =>
    page.route(
      (url) => url.pathname === '/requests' && url.searchParams.get('status') === 'pending',
      async (intercepted) => {
        const response = await intercepted.fetch();
        await intercepted.fulfill({ response, body: (await response.text()).replace('"amount":4711', '"amount":4712') });
      },
    );
  const { page, requested, problems } = await openInbox(t, { route: tamper });
  const form = card(page, request);
  await form.locator('.warning', { hasText: 'do not hash to this approval’s digest' }).waitFor();
  assert.equal(await argumentsOf(form).innerText(), '{\n  "text": "pay",\n  "amount": 4712\n}');
  assert.equal(await form.getByRole('button', { name: 'Approve' }).isDisabled(), true);
  await form.getByRole('button', { name: 'Decline' }).click();
  await expectResolved(page, request, 'Declined');
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.error.reason, 'declined', JSON.stringify(settled));
  assertStayedHome(requested, problems);
});

/** What the review of an edit lists: each change's operation and path. */
function reviewed(form) {
  return form.locator('.changes li').evaluateAll((all) => all.map((change) => [change.dataset.op, change.dataset.path]));
}

test('an editable approval is edited in a form of the tool’s schema, its changes reviewed, and sends exactly them', { timeout: 90_000 }, async (t) => {
  const editing = await startGateway(
    '[[approvals]]\nserver = "demo"\ntools = ["echo"]\neditable = true\n\n[[approvals]]\nserver = "demo"\ntools = ["echoes"]\n',
  );
  t.after(() => editing.stop());
  const as = { base: editing.base };
  const { call, request } = await startCall('echo', { text: 'rm -rf /', options: { force: true } }, as);
  const fixed = await startCall('echoes', { text: 'as asked' }, as);
  const { page, requested, problems } = await openInbox(t, { base: editing.base, viewport: { width: 360, height: 740 } });
  const form = card(page, request);
  const edit = form.getByRole('button', { name: 'Edit arguments' });
  await card(page, fixed.request).getByRole('button', { name: 'Approve' }).waitFor();
  assert.equal(await card(page, fixed.request).getByRole('button', { name: 'Edit arguments' }).count(), 0, 'not editable');
  await form.locator('button[aria-controls]:not([disabled])').waitFor();
  assert.doesNotMatch(await form.innerText(), /null/, 'nothing shows where an approval needs one person');

  // Opened, the form holds the arguments: the schema's property in its field, the rest as a JSON object.
  await edit.click();
  assert.equal(await edit.getAttribute('aria-expanded'), 'true');
  const text = form.getByRole('textbox', { name: /^text/ });
  const other = form.getByRole('textbox', { name: /^Other arguments/ });
  assert.equal(await text.inputValue(), 'rm -rf /');
  assert.equal(await other.inputValue(), '{\n  "options": {\n    "force": true\n  }\n}');
  const send = form.getByRole('button', { name: 'Approve with changes' });
  assert.equal(await send.isDisabled(), true, 'nothing is sent before a review');

  // A required argument removed: the review says so, and the gateway's 422 shows beside its field.
  await text.fill('');
  await form.getByRole('button', { name: 'Review changes' }).click();
  await form.locator('.changes').waitFor();
  assert.deepEqual(await reviewed(form), [['remove', '/text']]);
  await send.click();
  const error = form.locator('.editor [data-field="text"] .error');
  await error.waitFor();
  assert.match(await error.innerText(), /required/);
  assert.equal(await text.getAttribute('aria-invalid'), 'true');
  assert.equal((await json(`/requests/${request}`, as)).status, 'pending', 'a 422 leaves the approval pending');

  // A valid edit, reviewed (Enter in a field reviews, it does not approve), then sent.
  await text.fill('ls --dry-run');
  assert.equal(await send.isDisabled(), true, 'a change after the review needs another');
  await other.fill('{"options": {"force": false}, "note": "checked"}');
  await text.press('Enter');
  await form.locator('.changes li[data-path="/note"]').waitFor();
  assert.deepEqual(await reviewed(form), [['replace', '/text'], ['replace', '/options/force'], ['add', '/note']]);
  assert.equal(
    await form.locator('.changes li').first().innerText(),
    'Changed "/text"\n\nWas\n"rm -rf /"\n→\nNow\n"ls --dry-run"',
  );
  assert.equal((await json(`/requests/${request}`, as)).status, 'pending', 'a review sends nothing');
  const width = await page.evaluate(() => document.scrollingElement.scrollWidth);
  assert.ok(width <= 360, `the page is ${width}px wide`);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-edit.png'), fullPage: true });
  await send.click();
  await card(page, request).waitFor({ state: 'detached' });

  const edited = { text: 'ls --dry-run', options: { force: false }, note: 'checked' };
  const settled = await json(`/calls/${call}?wait=20`, as);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assert.deepEqual(settled.arguments, edited);
  assert.equal(settled.result.content[0].text, 'ls --dry-run');
  assert.deepEqual(settled.allowed.editedFrom, { text: 'rm -rf /', options: { force: true } });
  await json(`/requests/${fixed.request}/answer`, { ...as, method: 'POST', body: '{"ok": false, "reason": "declined"}' });
  assertStayedHome(requested, problems, [`422 ${editing.base}/requests/${request}/answer`], editing.base);
});

test('a posted Request of kind approval shows as posted, its data as data, never as a gated call', { timeout: 60_000 }, async (t) => {
  const { page, requested, problems } = await openInbox(t);
  const call = { server: 'bank', tool: 'transfer_funds', arguments: { amount: 1000000 }, caller: 'ci-agent' };
  const data = { call, digest: '0'.repeat(64) };
  const posted = await json('/requests', {
    method: 'POST',
    body: JSON.stringify({ kind: 'approval', prompt: 'Approve transfer_funds on bank?', data }),
  });
  const form = card(page, posted.id);
  await form.getByRole('heading', { name: 'Approve transfer_funds on bank?' }).waitFor();
  assert.deepEqual(await form.locator('dt').allInnerTexts(), ['Posted by', 'Kind']);
  assert.match(await form.locator('.meta').innerText(), /Posted by\s+anonymous\s+Kind\s+approval/);
  await form.getByText('not raised by a tool call').waitFor();
  assert.equal(await form.getByRole('figure', { name: 'Data' }).locator('pre').innerText(), JSON.stringify(data, null, 2));
  assert.equal(await form.getByRole('figure', { name: /^Arguments/ }).count(), 0);
  assert.equal(await form.getByRole('button', { name: 'Approve' }).count(), 0);

  await form.getByRole('button', { name: 'Accept' }).click();
  await expectResolved(page, posted.id, 'Accepted');
  const answered = await json(`/requests/${posted.id}?wait=20`);
  assert.deepEqual([answered.status, answered.answer.ok], ['answered', true]);
  assertStayedHome(requested, problems);
});

test('the history lists resolved Requests, the latest first, with who answered and how, filtered by kind', { timeout: 60_000 }, async (t) => {
  const kind = `history.${Date.now()}`;
  const post = (prompt) => json('/requests', { method: 'POST', body: JSON.stringify({ kind, prompt }) });
  const accepted = await post('Approve this?');
  const declined = await post('And this?');
  await json(`/requests/${accepted.id}/answer`, { method: 'POST', body: JSON.stringify({ ok: true }) });
  await json(`/requests/${declined.id}/answer`, { method: 'POST', body: JSON.stringify({ ok: false, reason: 'declined' }) });
  const waiting = await post('Still waiting?');
  const { page, requested, problems } = await openInbox(t);
  await page.getByLabel('Kind').fill(kind);
  await page.getByRole('button', { name: 'Show history' }).click();
  const rows = page.locator('#history-table tbody tr');
  await rows.first().waitFor();
  assert.deepEqual(await rows.evaluateAll((all) => all.map((row) => row.dataset.request)), [declined.id, accepted.id]);
  assert.match(await rows.nth(0).innerText(), /And this\?.*Declined\s+anonymous/s);
  assert.match(await rows.nth(1).innerText(), /Approve this\?.*Accepted\s+anonymous/s);
  // Other tests count what is pending.
  await json(`/requests/${waiting.id}/answer`, { method: 'POST', body: JSON.stringify({ ok: false, reason: 'cancelled' }) });
  assertStayedHome(requested, problems);
});

/** The ids of the history's rows once they are `expected`, after asking for them with the filter as it is. */
async function historyShows(page, expected) {
  await page.getByRole('button', { name: 'Show history' }).click();
  const rows = () => [...document.querySelectorAll('#history-table tbody tr')].map((row) => row.dataset.request);
  const shows = (wanted) =>
    JSON.stringify([...document.querySelectorAll('#history-table tbody tr')].map((row) => row.dataset.request)) === wanted;
  // On a timeout the assertion below says what the table shows instead.
  await page.waitForFunction(shows, JSON.stringify(expected), { timeout: 10_000 }).catch(() => {});
  assert.deepEqual(await page.evaluate(rows), expected);
}

test('the history filters by who answered, by outcome and by tool', { timeout: 90_000 }, async (t) => {
  const team = await startGateway(
    `${TEAM}\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\n\n[[approvals]]\nserver = "demo"\ntools = ["echoes"]\nttl = "1s"\n`,
  );
  t.after(() => team.stop());
  const base = team.base;
  const agent = { base, token: AGENT_TOKEN };
  const answer = (id, token, body) => json(`/requests/${id}/answer`, { base, token, method: 'POST', body: JSON.stringify(body) });
  const approved = await startCall('echo', { text: 'approved' }, agent);
  await answer(approved.request, LEAD_TOKEN, { ok: true });
  const declined = await startCall('echo', { text: 'declined' }, agent);
  await answer(declined.request, BO_TOKEN, { ok: false, reason: 'declined' });
  const cancelled = await startCall('confirm_action', { action: 'cancelled' }, agent);
  await answer(cancelled.request, BO_TOKEN, { ok: false, reason: 'cancelled' });
  const expired = await startCall('echoes', { text: 'expired' }, agent);
  assert.equal((await json(`/requests/${expired.request}?wait=20`, agent)).status, 'expired');

  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  await signIn(page, LEAD_TOKEN);
  await historyShows(page, [expired.request, cancelled.request, declined.request, approved.request]);

  await page.getByLabel('Answered by').fill('bo');
  await historyShows(page, [cancelled.request, declined.request]);
  assert.match(await page.locator('#history-table tbody tr').first().innerText(), /Cancelled\s+bo/);
  await page.getByLabel('Outcome').selectOption('Declined');
  await historyShows(page, [declined.request]);

  await page.getByLabel('Answered by').fill('');
  await page.getByLabel('Outcome').selectOption('Expired');
  await historyShows(page, [expired.request]);
  await page.getByLabel('Outcome').selectOption('Accepted');
  await historyShows(page, [approved.request]);

  await page.getByLabel('Outcome').selectOption('Any');
  await page.getByLabel('Tool').fill('confirm_action');
  await historyShows(page, [cancelled.request]);
  await page.getByLabel('Tool').fill('echo');
  await historyShows(page, [declined.request, approved.request]);
  await page.getByLabel('Answered by').fill('lead');
  await historyShows(page, [approved.request]);
  await page.getByLabel('Answered by').fill('nobody');
  await historyShows(page, []);
  assert.equal(await page.locator('#history-note').innerText(), 'Nothing resolved matches.');

  const asked = requested.filter((url) => new URL(url).pathname === '/requests').map((url) => new URL(url).search);
  assert.ok(asked.includes('?status=answered&decision=declined&limit=1000&answeredBy=bo'), asked.join('\n'));
  assert.ok(asked.includes('?status=all&limit=1000&tool=echo&answeredBy=lead'), asked.join('\n'));
  assertStayedHome(requested, problems, [`401 ${base}/events`], base);
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

/** The characters a URL must not hide: invisible ones, and those that change the direction of text. */
const HIDDEN = [
  0x061c,
  0x180e,
  ...range(0x200b, 0x200f),
  0x2028,
  0x2029,
  ...range(0x202a, 0x202e),
  ...range(0x2060, 0x2064),
  0xfeff,
  ...range(0x2066, 0x2069),
  0x3164,
  0xfe0f,
  0xe0061,
];

function range(first, last) {
  return Array.from({ length: last - first + 1 }, (_, i) => first + i);
}

const escaped = (code) => `⟨U+${code.toString(16).toUpperCase().padStart(4, '0')}⟩`;
const HIDDEN_TEXT = new RegExp(`[${HIDDEN.map((code) => String.fromCodePoint(code)).join('')}]`, 'u');

test('a URL with bidi controls shows them visibly, isolated, with the host the browser parses highlighted', { timeout: 60_000 }, async (t) => {
  // Shown as sent, the override makes the end read "https://accounts.google.com/login/", and a split at the
  // last "@" takes accounts.google.com for the host; the browser reads "\" as "/" and goes to evil.example.
  const spoof = 'https://evil.example\\@accounts.google.com/\u202e/nigol/moc.elgoog.stnuocca//:sptth\u200b';
  const { call, request } = await startCall('authorize', { service: '\u202eelgoog', url: spoof });
  const { page, requested, problems } = await openInbox(t);
  const form = card(page, request);
  await form.locator('.url').waitFor();
  const parsed = await page.evaluate((url) => {
    const { hostname, href } = new URL(url);
    return { hostname, href };
  }, spoof);
  assert.equal(parsed.hostname, 'evil.example');

  assert.equal(await form.locator('.url mark').innerText(), parsed.hostname);
  assert.equal(await form.locator('.url').innerText(), parsed.href);
  assert.equal(
    await form.locator('.sent').innerText(),
    'https://evil.example\\@accounts.google.com/⟨U+202E⟩/nigol/moc.elgoog.stnuocca//:sptth⟨U+200B⟩',
  );
  await form.locator('.warning', { hasText: 'U+202E RIGHT-TO-LEFT OVERRIDE' }).waitFor();
  assert.equal(await form.getByRole('link', { name: 'Open link' }).getAttribute('href'), parsed.href);
  for (const address of [form.locator('.url'), form.locator('.sent')]) {
    assert.equal(await address.getAttribute('dir'), 'ltr');
    const style = await address.evaluate((element) => {
      const { direction, unicodeBidi } = getComputedStyle(element);
      return { direction, unicodeBidi };
    });
    assert.deepEqual(style, { direction: 'ltr', unicodeBidi: 'isolate' });
  }

  // The prompt (with the service name in it) is isolated from the page around it, its override made visible.
  const heading = form.getByRole('heading');
  assert.equal(await heading.innerText(), 'Authorize access to ⟨U+202E⟩elgoog');
  assert.equal(await heading.locator('bdi').evaluate((element) => getComputedStyle(element).unicodeBidi), 'isolate');
  assert.doesNotMatch(await form.evaluate((element) => element.textContent), HIDDEN_TEXT);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-bidi.png'), fullPage: true });

  await form.getByRole('button', { name: 'Decline' }).click();
  await expectResolved(page, request, 'Declined');
  assert.deepEqual(await resultsOf(call), [{ action: 'decline' }]);
  assertStayedHome(requested, problems);
});

test('every invisible or direction-changing character in a URL is shown as its code point', { timeout: 60_000 }, async (t) => {
  const chars = HIDDEN.map((code) => String.fromCodePoint(code));
  const url = `https://example.com/${chars.join('-')}`;
  const { request } = await startCall('authorize', { service: 'docs', url });
  const { page, requested, problems } = await openInbox(t);
  const form = card(page, request);
  await form.locator('.sent').waitFor();

  assert.equal(await form.locator('.sent').innerText(), `https://example.com/${HIDDEN.map(escaped).join('-')}`);
  assert.equal(await form.locator('.url mark').innerText(), 'example.com');
  assert.doesNotMatch(await form.evaluate((element) => element.textContent), HIDDEN_TEXT);
  await form.getByRole('button', { name: 'Cancel' }).click();
  await expectResolved(page, request, 'Cancelled');
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
  const { page, requested, problems } = await openInbox(t, { viewport: { width: 360, height: 740 } });
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

test('after the event stream drops, the page resumes with Last-Event-ID and lists again on resync', { timeout: 60_000 }, async (t) => {
  // The first stream ends after one event (split over CRLF lines and two data lines); the second is the real one.
  const first = ': hello\r\nid: 999999\r\nevent: call.updated\r\ndata: {"id": "call-elsewhere",\r\ndata: "tool": "elsewhere"}\r\n\r\n';
  const resumed = [];
  let release;
  let listed;
  const callStarted = new Promise((done) => (release = done));
  const route = (page) => {
    listed = page.waitForResponse((response) => new URL(response.url()).pathname === '/requests');
    return page.route('**/events', async (intercepted) => {
      if (resumed.length === 0 && !intercepted.request().headers()['last-event-id']) {
        return intercepted.fulfill({ status: 200, contentType: 'text/event-stream', body: first });
      }
      resumed.push(await intercepted.request().allHeaders());
      await callStarted;
      return intercepted.continue();
    });
  };
  const { page, requested, problems } = await openInbox(t, { route, ready: false });
  await listed;

  // Started while the page is between streams: only the resync that answers the stale id can bring it in.
  const { call, request } = await startCall('confirm_action', { action: 'resume' });
  release();
  const form = card(page, request);
  await form.waitFor();
  assert.equal(resumed.length, 1);
  assert.equal(resumed[0]['last-event-id'], '999999');
  assert.equal(resumed[0].accept, 'text/event-stream');
  await form.getByRole('button', { name: 'Decline' }).click();
  await expectResolved(page, request, 'Declined');
  assert.deepEqual(await resultsOf(call), [{ action: 'decline' }]);
  assertStayedHome(requested, problems);
});

// ---- with tokens ----------------------------------------------------------------------------------------

/** Signs in on the inbox's form and waits until the inbox is live. */
async function signIn(page, token) {
  await page.getByLabel('Access token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.locator('#connection[data-state="live"]').waitFor();
}

test('with tokens, the inbox asks for one, keeps it in the tab, and answers as its principal', { timeout: 90_000 }, async (t) => {
  const base = secured.base;
  const agent = { base, token: AGENT_TOKEN };
  const { page, requested, problems, sent } = await openInbox(t, { base, signIn: true });
  const field = page.getByLabel('Access token');
  assert.equal(await field.getAttribute('type'), 'password');
  assert.ok(await field.evaluate((element) => element === document.activeElement), 'the token field has focus');
  assert.match(await page.locator('#signin-hint').innerText(), /access token.*kept only in this browser tab/s);
  assert.equal(await page.getByRole('button', { name: 'Sign out' }).count(), 0);
  assert.equal(await page.locator('#empty').isVisible(), false, 'no inbox before signing in');

  // A wrong token: an error on the form, which stays, and nothing is kept.
  await page.keyboard.type('not-the-token');
  await page.keyboard.press('Enter');
  const error = page.locator('#signin-error');
  await error.waitFor();
  assert.match(await error.innerText(), /not accepted/);
  assert.equal(await field.getAttribute('aria-invalid'), 'true');
  assert.ok((await field.getAttribute('aria-describedby')).split(' ').includes('signin-error'));
  assert.ok(await page.locator('#signin').isVisible());
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-signin.png'), fullPage: true });

  // The approver's token, with the keyboard: the inbox appears, and the token lives in session storage only.
  await field.fill('');
  await page.keyboard.type(LEAD_TOKEN);
  await page.keyboard.press('Enter');
  await page.locator('#connection[data-state="live"]').waitFor();
  assert.equal(await page.locator('#signin').isVisible(), false);
  assert.ok(await page.getByRole('button', { name: 'Sign out' }).isVisible());
  const kept = await page.evaluate(() => ({
    session: Object.values(sessionStorage),
    local: localStorage.length,
    cookie: document.cookie,
  }));
  assert.deepEqual(kept, { session: [LEAD_TOKEN], local: 0, cookie: '' });

  // The agent starts a call over REST; the approver answers it in the page.
  const { call, request } = await startCall('confirm_action', { action: 'release' }, agent);
  const form = card(page, request);
  await form.getByRole('checkbox', { name: /^Confirm/ }).check();
  await form.getByRole('textbox', { name: /^Note/ }).pressSequentially('approved by the lead');
  await form.getByRole('button', { name: 'Accept' }).click();
  await expectResolved(page, request, 'Accepted');
  assert.deepEqual(await resultsOf(call, agent), [
    { action: 'accept', content: { confirm: true, note: 'approved by the lead' } },
  ]);
  const answered = await json(`/requests/${request}`, agent);
  assert.equal(answered.answeredBy, 'lead');

  // A reload keeps the tab signed in.
  await page.reload();
  await page.locator('#connection[data-state="live"]').waitFor();
  assert.ok(await page.getByRole('button', { name: 'Sign out' }).isVisible());
  assert.equal(await page.locator('#signin').isVisible(), false);

  // Every API request sent the token as a header, none in its URL.
  const calls = [];
  for (const sentRequest of sent) {
    const url = new URL(sentRequest.url());
    if (url.pathname.startsWith('/ui')) continue;
    calls.push([url.pathname, (await sentRequest.allHeaders()).authorization]);
  }
  assert.deepEqual(calls.slice(0, 3), [
    ['/events', undefined],
    ['/events', 'Bearer not-the-token'],
    ['/events', `Bearer ${LEAD_TOKEN}`],
  ]);
  for (const [path, authorization] of calls.slice(3)) assert.equal(authorization, `Bearer ${LEAD_TOKEN}`, path);
  const paths = calls.map(([path]) => path);
  for (const path of ['/requests', `/requests/${request}/answer`]) assert.ok(paths.includes(path), path);
  for (const url of requested) assert.ok(!url.includes(LEAD_TOKEN) && !url.includes('not-the-token'), url);

  // Sign out: the token is forgotten and the form is back.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.locator('#signin').waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  assert.equal(await page.locator('#connection').innerText(), 'Signed out');
  assertStayedHome(requested, problems, [`401 ${base}/events`, `401 ${base}/events`], base);
});

test('a 403 on an answer is shown next to its Request, which stays pending', { timeout: 60_000 }, async (t) => {
  const base = secured.base;
  const agent = { base, token: AGENT_TOKEN };
  const { request } = await startCall('confirm_action', { action: 'rollback' }, agent);
  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  await signIn(page, LEAD_TOKEN);
  const form = card(page, request);
  await form.waitFor();
  // Stands in for a gateway whose policy does not let this principal answer this Request.
  const forbidden = { type: 'about:blank', title: 'Forbidden', status: 403, detail: 'lead may not answer this Request' };
  await page.route(`**/requests/${request}/answer`, (route) =>
    route.fulfill({ status: 403, contentType: 'application/problem+json', body: JSON.stringify(forbidden) }),
  );

  await form.getByRole('button', { name: 'Decline' }).click();

  const problem = form.locator('.problem');
  await problem.waitFor();
  assert.match(await problem.innerText(), /^This token may not answer this Request\./);
  assert.ok(await form.isVisible(), 'the Request stays in the list');
  assert.equal(await page.locator('#signin').isVisible(), false, 'a 403 does not sign out');
  assert.equal((await json(`/requests/${request}`, agent)).status, 'pending');
  assertStayedHome(requested, problems, [`401 ${base}/events`, `403 ${base}/requests/${request}/answer`], base);
});

test('several approvals are approved at once, each on its own: a refused one is shown as refused, the others go through', { timeout: 90_000 }, async (t) => {
  const team = await startGateway(
    `${TEAM}\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\n\n[[approvals]]\nserver = "demo"\ntools = ["echoes"]\napprovers = ["bo"]\n`,
  );
  t.after(() => team.stop());
  const base = team.base;
  const agent = { base, token: AGENT_TOKEN };
  const texts = ['first', 'second', 'third'];
  const approvals = [];
  for (const text of texts) approvals.push(await startCall('echo', { text }, agent));
  const boOnly = await startCall('echoes', { text: 'for bo' }, agent);
  const form = await startCall('confirm_action', { action: 'asks for a form' }, agent);
  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  await signIn(page, LEAD_TOKEN);
  // Each card names its tool once the page has read its call, as the report will.
  for (const { request } of [...approvals, boOnly, form]) await card(page, request).locator('dd[data-tool-of] bdi').waitFor();
  assert.equal(await page.getByRole('button', { name: 'Approve selected' }).isDisabled(), true, 'nothing selected yet');
  const pick = (request) => card(page, request).getByRole('checkbox', { name: /^Select / });
  assert.match(await pick(form.request).getAttribute('aria-labelledby'), new RegExp(`h-${form.request}$`));

  await page.getByLabel('Select all', { exact: true }).check();
  await page.getByText('5 selected').waitFor();
  // Once the page has checked each approval's arguments, only the form is left out of a bulk approval.
  await page.getByText('Approve selected leaves out one of them').waitFor();
  await page.getByRole('button', { name: 'Approve selected' }).click();

  const heading = page.locator('#bulk-report h2');
  await page.locator('#bulk-report h2:focus').waitFor();
  assert.equal(await heading.innerText(), 'Approve selected: 3 of 5 went through');
  const reported = await page.locator('#bulk-report li').evaluateAll((all) =>
    Object.fromEntries(all.map((item) => [item.dataset.reported, [item.className, item.querySelector('strong').textContent]])),
  );
  const expected = Object.fromEntries(approvals.map(({ request }) => [request, ['through', 'Done']]));
  expected[boOnly.request] = ['refused', 'Refused (403)'];
  expected[form.request] = ['refused', 'Not sent'];
  assert.deepEqual(reported, expected);
  assert.match(await page.locator(`#bulk-report li[data-reported="${boOnly.request}"]`).innerText(), /not among the approvers/);
  const first = await page.locator(`#bulk-report li[data-reported="${approvals[0].request}"]`).innerText();
  assert.match(first, /^Done echo on demo: /);
  assert.equal(await page.locator('#notices .notice').count(), 0, 'the report says what became of each, not a notice');
  for (const [i, { call, request }] of approvals.entries()) {
    await card(page, request).waitFor({ state: 'detached' });
    const settled = await json(`/calls/${call}?wait=20`, agent);
    assert.equal(settled.status, 'completed', JSON.stringify(settled));
    assert.equal(settled.result.content[0].text, texts[i]);
  }
  assert.match(await card(page, boOnly.request).locator('.problem').innerText(), /^This token may not answer this Request\./);
  assert.equal(await pick(boOnly.request).isChecked(), true, 'a refused one stays selected');
  assert.equal((await json(`/requests/${boOnly.request}`, agent)).status, 'pending');
  assert.equal((await json(`/requests/${form.request}`, agent)).status, 'pending');
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-bulk.png'), fullPage: true });

  // Declining works for any Request: the form's goes through, and bo's approval is refused again.
  await page.getByText('2 selected').waitFor();
  await page.getByRole('button', { name: 'Decline selected' }).click();
  await page.getByText('Decline selected: 1 of 2 went through').waitFor();
  await card(page, form.request).waitFor({ state: 'detached' });
  assert.deepEqual(await resultsOf(form.call, agent), [{ action: 'decline' }]);
  assert.equal((await json(`/requests/${boOnly.request}`, agent)).status, 'pending');
  const refusals = problems.filter((problem) => problem.startsWith('403 '));
  assert.deepEqual(refusals, [`403 ${base}/requests/${boOnly.request}/answer`, `403 ${base}/requests/${boOnly.request}/answer`]);
  assertStayedHome(requested, problems, [`401 ${base}/events`, ...refusals], base);
});

test('an approval that needs three people counts each one live, and the third yes sends the call', { timeout: 90_000 }, async (t) => {
  const tokens = tokenConfig([
    ['lead', 'approver', LEAD_TOKEN],
    ['second', 'approver', 'second-token-5a0e'],
    ['third', 'approver', 'third-token-c3d1'],
    ['ci-agent', 'agent', AGENT_TOKEN],
  ]);
  const quorate = await startGateway(`${tokens}\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\nquorum = 3\n`);
  t.after(() => quorate.stop());
  const base = quorate.base;
  const { call, request } = await startCall('echo', { text: 'three of us' }, { base, token: AGENT_TOKEN });
  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  await signIn(page, LEAD_TOKEN);
  const form = card(page, request);
  const count = form.locator('.approvals');
  await count.waitFor();
  assert.equal(await count.innerText(), '0 of 3 approvals');

  const approve = (token) => json(`/requests/${request}/answer`, { base, token, method: 'POST', body: '{"ok": true}' });
  await approve('second-token-5a0e');
  await page.waitForFunction((id) => document.querySelector(`li[data-request="${id}"] .approvals`)?.innerText === '1 of 3 approvals — second', request);

  await form.getByRole('button', { name: 'Approve' }).waitFor();
  await form.getByRole('button', { name: 'Approve' }).click();
  await page.locator('#notices .notice', { hasText: 'Your approval is counted' }).first().waitFor();
  await page.waitForFunction((id) => document.querySelector(`li[data-request="${id}"] .approvals`)?.innerText === '2 of 3 approvals — second, lead', request);
  assert.equal((await json(`/calls/${call}`, { base, token: LEAD_TOKEN })).status, 'input_required');

  await approve('third-token-c3d1');
  await expectResolved(page, request, 'Accepted');
  const settled = await json(`/calls/${call}?wait=20`, { base, token: LEAD_TOKEN });
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assertStayedHome(requested, problems, [`401 ${base}/events`], base);
});

// ---- standing grants ------------------------------------------------------------------------------------

/** `echo` asks for approval and may be granted for its session or an hour; `echoes` asks and offers no grant. */
const GRANTING = `${TOKENS}\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\ngrants = ["session", "1h"]\n\n` +
  '[[approvals]]\nserver = "demo"\ntools = ["echoes"]\n';

/** The labels of the durations a card's "Don't ask again" offers, in order. */
function offeredIn(choice) {
  return choice.locator('input[name$="-for"]').evaluateAll((inputs) => inputs.map((input) => input.labels[0].textContent));
}

/** Starts `tool` with `args` as `as` and waits until it stops running: the call. */
function runCall(tool, args, as) {
  return json('/calls?wait=20', { ...as, method: 'POST', body: JSON.stringify({ server: 'demo', tool, arguments: args }) });
}

test('approving with “Don’t ask again” lets the next identical call run without asking, and Revoke in the page asks again', { timeout: 90_000 }, async (t) => {
  const granting = await startGateway(GRANTING);
  t.after(() => granting.stop());
  const base = granting.base;
  const agent = { base, token: AGENT_TOKEN };
  const lead = { base, token: LEAD_TOKEN };
  const { call, request } = await startCall('echo', { text: 'deploy' }, agent);
  const { page, requested, problems } = await openInbox(t, { base, signIn: true, viewport: { width: 360, height: 740 } });
  await signIn(page, LEAD_TOKEN);
  const form = card(page, request);
  const choice = form.getByRole('group', { name: 'Don’t ask again' });
  await choice.waitFor();
  await page.locator('#grants-empty').waitFor();

  // Only what the policy offers, none chosen; the sentence under it says what Approve does.
  assert.deepEqual(await offeredIn(choice), ['No, ask every time', 'for this session', 'for 1h']);
  assert.equal(await choice.getByRole('radio', { name: 'No, ask every time' }).isChecked(), true);
  assert.equal(await choice.getByRole('radio', { name: 'these arguments' }).isDisabled(), true);
  const says = choice.locator('.consequence');
  assert.equal(await says.innerText(), 'ci-agent’s later calls of echo on demo ask again, as this one did.');
  const approve = form.getByRole('button', { name: 'Approve' });
  assert.equal(await approve.getAttribute('aria-describedby'), await says.getAttribute('id'));

  // Chosen with the keyboard: an hour, for these arguments; then Approve. Approve selected would give none.
  await form.getByRole('checkbox', { name: /^Select / }).check();
  await choice.getByRole('radio', { name: 'No, ask every time' }).focus();
  await page.keyboard.press('ArrowDown');
  await page.keyboard.press('ArrowDown');
  assert.equal(await choice.getByRole('radio', { name: 'for 1h' }).isChecked(), true);
  await page.locator('#bulk-hint', { hasText: 'Approve selected gives no standing grant' }).waitFor();
  assert.equal(
    await says.innerText(),
    'ci-agent’s later calls of echo on demo with these arguments run without asking for 1h. You can revoke it under “Standing grants”.',
  );
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.labels[0].textContent), 'these arguments');
  assert.equal(await choice.getByRole('radio', { name: 'these arguments' }).isChecked(), true);
  await approve.waitFor();
  await page.waitForFunction((id) => !document.querySelector(`li[data-request="${id}"] button[type="submit"]`).disabled, request);
  await page.keyboard.press('Tab');
  assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Approve');
  const width = await page.evaluate(() => document.scrollingElement.scrollWidth);
  assert.ok(width <= 360, `the page is ${width}px wide`);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-grant.png'), fullPage: true });
  await page.keyboard.press('Enter');
  await expectResolved(page, request, 'Accepted');
  assert.equal((await json(`/calls/${call}?wait=20`, agent)).status, 'completed');

  // The grant is listed, in the page as over the API.
  const [grant, ...others] = await json('/grants', lead);
  assert.deepEqual(others, []);
  assert.deepEqual([grant.owner, grant.tool, grant.match, grant.for, grant.by], ['ci-agent', 'echo', 'same-arguments', '1h', 'lead']);
  const { data } = await json(`/requests/${request}`, lead);
  assert.equal(grant.digest, data.digest);
  const item = page.locator(`#grants-list li[data-grant="${grant.id}"]`);
  await item.waitFor();
  assert.equal(await page.locator('#grants-empty').isVisible(), false);
  assert.equal(await item.getByRole('heading').innerText(), 'ci-agent: echo on demo');
  const facts = await item.locator('.meta').innerText();
  assert.match(facts, new RegExp(`Covers\\s+these arguments, digest ${data.digest.slice(0, 12)}…`));
  assert.match(facts, /For\s+1h, until /);
  assert.match(facts, /Given by\s+lead/);
  assert.match(facts, /Uses\s+0/);

  // The same call again runs at once, under the grant, and the page counts the use.
  const again = await runCall('echo', { text: 'deploy' }, agent);
  assert.equal(again.status, 'completed', JSON.stringify(again));
  assert.deepEqual(again.requests, [], 'nobody was asked');
  assert.equal(again.allowed.grant, grant.id);
  await page.waitForFunction((id) => document.querySelector(`li[data-grant="${id}"] [data-uses]`)?.textContent === '1', grant.id);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'toolnexus-inbox-grants.png'), fullPage: true });

  // A refusal shows beside the grant, which stays (the gateway's 403 stood in for by the test).
  const revoke = item.getByRole('button', { name: 'Revoke ci-agent: echo on demo' });
  const refuse = (intercepted) =>
    intercepted.request().method() === 'DELETE'
      ? intercepted.fulfill({ status: 403, contentType: 'application/problem+json', body: '{"detail": "not yours"}' })
      : intercepted.continue();
  await page.route(`${base}/grants/*`, refuse);
  await revoke.click();
  await item.locator('.problem', { hasText: 'This token may not revoke this grant. The gateway says: not yours' }).waitFor();
  assert.equal((await json('/grants', lead)).length, 1, 'still there');
  await page.unroute(`${base}/grants/*`, refuse);

  // Revoked in the page: it leaves the list, and the same call asks again.
  await revoke.click();
  await item.waitFor({ state: 'detached' });
  await page.locator('#notices .notice', { hasText: 'Revoked: ci-agent: echo on demo' }).waitFor();
  await page.locator('#grants-empty').waitFor();
  assert.deepEqual(await json('/grants', lead), []);
  const asked = await startCall('echo', { text: 'deploy' }, agent);
  await card(page, asked.request).getByRole('group', { name: 'Don’t ask again' }).waitFor();
  assertStayedHome(requested, problems, [`401 ${base}/events`, `403 ${base}/grants/${grant.id}`], base);
});

test('a grant the policy does not offer is not listed, and the gateway’s refusal of one shows at the choice', { timeout: 90_000 }, async (t) => {
  const granting = await startGateway(GRANTING);
  t.after(() => granting.stop());
  const base = granting.base;
  const agent = { base, token: AGENT_TOKEN };
  const lead = { base, token: LEAD_TOKEN };
  const { call, request } = await startCall('echo', { text: 'deploy' }, agent);
  const fixed = await startCall('echoes', { text: 'asks every time' }, agent);
  // Stands in for an approval that says it offers more than its policy does.
  const tamper = (page) =>
    page.route(
      (url) => url.pathname === '/requests' && url.searchParams.get('status') === 'pending',
      async (intercepted) => {
        const response = await intercepted.fetch();
        const body = (await response.text()).replace('"grants":["session","1h"]', '"grants":["session","1h","8h"]');
        await intercepted.fulfill({ response, body });
      },
    );
  const { page, requested, problems } = await openInbox(t, { base, signIn: true, route: tamper });
  await signIn(page, LEAD_TOKEN);
  const form = card(page, request);
  const choice = form.getByRole('group', { name: 'Don’t ask again' });
  await card(page, fixed.request).getByRole('button', { name: 'Approve' }).waitFor();
  assert.equal(await card(page, fixed.request).getByRole('group', { name: 'Don’t ask again' }).count(), 0, 'echoes offers none');
  assert.deepEqual(await offeredIn(choice), ['No, ask every time', 'for this session', 'for 1h', 'for 8h']);

  await choice.getByRole('radio', { name: 'for 8h' }).check();
  await form.getByRole('button', { name: 'Approve' }).click();
  const error = choice.locator('.error');
  await error.waitFor();
  assert.equal(await error.innerText(), 'this approval\'s policy offers grants for ["session","1h"]');
  assert.equal(await choice.getByRole('radio', { name: 'for 8h' }).getAttribute('aria-invalid'), 'true');
  assert.equal(await form.locator('.problem').innerText(), 'Please correct the marked field.');
  assert.equal(await page.evaluate(() => document.activeElement.labels[0].textContent), 'for 8h');
  assert.equal((await json(`/requests/${request}`, lead)).status, 'pending', 'a 422 leaves the approval pending');
  assert.deepEqual(await json('/grants', lead), []);

  // One it offers, for any arguments, goes through.
  await choice.getByRole('radio', { name: 'for 1h' }).check();
  assert.equal(await error.isVisible(), false, 'a new choice clears the error');
  await choice.getByRole('radio', { name: 'any arguments to this tool' }).check();
  assert.equal(
    await choice.locator('.consequence').innerText(),
    'ci-agent’s later calls of echo on demo with any arguments run without asking for 1h. You can revoke it under “Standing grants”.',
  );
  await form.getByRole('button', { name: 'Approve' }).click();
  await expectResolved(page, request, 'Accepted');
  assert.equal((await json(`/calls/${call}?wait=20`, agent)).status, 'completed');
  const [grant] = await json('/grants', lead);
  assert.deepEqual([grant.match, grant.for, grant.digest], ['tool', '1h', undefined]);
  const item = page.locator(`#grants-list li[data-grant="${grant.id}"]`);
  await item.waitFor();
  assert.match(await item.locator('.meta').innerText(), /Covers\s+any arguments/);
  assert.equal((await runCall('echo', { text: 'something else' }, agent)).status, 'completed');
  await json(`/requests/${fixed.request}/answer`, { ...lead, method: 'POST', body: '{"ok": false, "reason": "declined"}' });
  assertStayedHome(requested, problems, [`401 ${base}/events`, `422 ${base}/requests/${request}/answer`], base);
});

test('“Approve with changes” with “Don’t ask again” gives the grant for the changed arguments', { timeout: 90_000 }, async (t) => {
  const granting = await startGateway(
    `${TOKENS}\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\neditable = true\ngrants = ["session", "1h"]\n`,
  );
  t.after(() => granting.stop());
  const base = granting.base;
  const agent = { base, token: AGENT_TOKEN };
  const lead = { base, token: LEAD_TOKEN };
  const { call, request } = await startCall('echo', { text: 'rm -rf /' }, agent);
  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  await signIn(page, LEAD_TOKEN);
  const form = card(page, request);
  await form.locator('button[aria-controls]:not([disabled])').click();
  await form.getByRole('group', { name: 'Don’t ask again' }).getByRole('radio', { name: 'for this session' }).check();
  const send = form.getByRole('button', { name: 'Approve with changes' });
  const note = form.locator('.editor .grant-note');
  assert.equal(await send.getAttribute('aria-describedby'), await note.getAttribute('id'));
  assert.equal(
    await note.innerText(),
    'Don’t ask again (chosen above): ci-agent’s later calls of echo on demo with the changed arguments run without ' +
      'asking while the session this call ran on is open (a day at most).',
  );
  await form.getByRole('textbox', { name: /^text/ }).fill('ls');
  await form.getByRole('button', { name: 'Review changes' }).click();
  await form.locator('.changes').waitFor();
  await send.click();
  await expectResolved(page, request, 'Accepted');
  assert.deepEqual((await json(`/calls/${call}?wait=20`, agent)).arguments, { text: 'ls' });

  const answered = await json(`/requests/${request}`, lead);
  const [grant] = await json('/grants', lead);
  assert.deepEqual([grant.match, grant.for], ['same-arguments', 'session']);
  assert.equal(grant.digest, answered.answer.data.digest, 'the digest of the changed arguments');
  assert.notEqual(grant.digest, answered.data.digest);
  const item = page.locator(`#grants-list li[data-grant="${grant.id}"]`);
  assert.match(await item.locator('.meta').innerText(), /For\s+its session, until .* at most/);
  const same = await runCall('echo', { text: 'ls' }, agent);
  assert.deepEqual([same.status, same.allowed.grant], ['completed', grant.id], JSON.stringify(same));
  await startCall('echo', { text: 'rm -rf /' }, agent);
  assertStayedHome(requested, problems, [`401 ${base}/events`], base);
});

// ---- signing in at an OpenID provider -------------------------------------------------------------------

/** A free loopback port, for a gateway whose address the provider must know before it starts. */
async function freePort() {
  const server = createServer();
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address();
  await new Promise((done) => server.close(done));
  return port;
}

/** Starts panva's oidc-provider (tests/oidc) with the inbox's client sent back to `redirect`; its issuer. */
async function startProvider(redirect) {
  const dir = mkdtempSync(join(tmpdir(), 'toolnexus-oidc-'));
  const child = spawn(process.execPath, ['provider.mjs', '--keys', join(dir, 'keys.json')], {
    cwd: join(ROOT, 'tests/oidc'),
    env: { ...process.env, OIDC_INBOX_REDIRECTS: redirect },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  child.stderr.on('data', (chunk) => process.env.TEST_LOG && process.stderr.write(`oidc: ${chunk}`));
  const exited = new Promise((done) => child.once('exit', done));
  const first = await new Promise((done, fail) => {
    createInterface({ input: child.stdout }).once('line', done);
    child.once('exit', (code) => fail(new Error(`the provider exited (${code}) before serving`)));
  });
  const issuer = /^issuer (\S+)$/.exec(first)[1];
  return {
    issuer,
    async token(client) {
      const body = new URLSearchParams({ grant_type: 'client_credentials', client_id: client, client_secret: `${client}-secret` });
      const reply = await (await fetch(`${issuer}/token`, { method: 'POST', body })).json();
      assert.ok(reply.access_token, JSON.stringify(reply));
      return reply.access_token;
    },
    async stop() {
      child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

test('with an OpenID provider the inbox signs in there, and answers as the person who did', { timeout: 120_000 }, async (t) => {
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const provider = await startProvider(`${base}/ui/`);
  t.after(() => provider.stop());
  const oidc =
    `[auth.oidc]\nissuer = "${provider.issuer}"\naudience = "toolnexus-gateway"\nui_client_id = "toolnexus-inbox"\n` +
    'roles = { approver = ["sre"], agent = ["agents"] }\n\n[[approvals]]\nserver = "demo"\ntools = ["echo"]\n';
  const signing = await startGateway(oidc, `127.0.0.1:${port}`);
  t.after(() => signing.stop());
  const agent = { base, token: await provider.token('agent-1') };
  const { call, request } = await startCall('echo', { text: 'signed in' }, agent);

  const { page, requested, problems } = await openInbox(t, { base, signIn: true });
  const button = page.getByRole('button', { name: `Sign in at ${new URL(provider.issuer).host}` });
  await button.click();
  await page.locator('input[name="login"]').fill('alice');
  await page.locator('input[name="password"]').fill('any password');
  await page.getByRole('button', { name: 'Sign-in' }).click();
  await page.getByRole('button', { name: 'Continue' }).click();
  await page.locator('#connection[data-state="live"]').waitFor();
  assert.equal(page.url(), `${base}/ui/`, 'the code left the address bar');
  const kept = await page.evaluate(() => Object.keys(sessionStorage).sort());
  assert.deepEqual(kept, ['toolnexus-gateway.token'], 'only the access token is kept, in the tab');

  const form = card(page, request);
  await form.getByRole('button', { name: 'Approve' }).waitFor();
  await page.waitForFunction((id) => !document.querySelector(`li[data-request="${id}"] button[type="submit"]`).disabled, request);
  await form.getByRole('button', { name: 'Approve' }).click();
  await expectResolved(page, request, 'Accepted');
  const answered = await json(`/requests/${request}`, agent);
  assert.equal(answered.answeredBy, 'alice');
  assert.deepEqual(answered.answerer, { name: 'alice', via: 'oidc', issuer: provider.issuer, subject: 'alice' });
  assert.equal((await json(`/calls/${call}?wait=20`, agent)).status, 'completed');
  const foreign = requested.filter((url) => ![base, provider.issuer].includes(new URL(url).origin));
  assert.deepEqual(foreign.filter((url) => !url.startsWith('https://fonts.')), [], 'the page went only to the gateway and the provider');
  assert.deepEqual(problems.filter((problem) => !problem.includes(provider.issuer) && !problem.includes('fonts')), [`401 ${base}/events`]);
});

test('a sampling request shows its conversation, and the reply typed in the page goes back as the assistant', { timeout: 90_000 }, async (t) => {
  const script = join(ROOT, 'tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js');
  const everything = await startGateway(
    `[[servers]]\nname = "everything"\ncommand = "node"\nargs = ["${script}", "stdio"]\nprotocol = "2025-11-25"\n`,
  );
  t.after(() => everything.stop());
  const base = everything.base;
  const call = await json('/calls?wait=20', {
    base,
    method: 'POST',
    body: JSON.stringify({ server: 'everything', tool: 'trigger-sampling-request', arguments: { prompt: 'Ship it?' } }),
  });
  assert.equal(call.status, 'input_required', JSON.stringify(call));
  const request = call.requests[0];
  const { page, requested, problems } = await openInbox(t, { base });
  const form = card(page, request);
  await form.waitFor();
  assert.deepEqual(await form.locator('.conversation dt').allInnerTexts(), ['System', 'User']);
  assert.deepEqual(await form.locator('.conversation dd').allInnerTexts(), [
    'You are a helpful test server.',
    'Resource trigger-sampling-request context: Ship it?',
  ]);
  await form.getByRole('textbox', { name: /^Reply/ }).pressSequentially('Ship it.');
  await form.getByRole('button', { name: 'Accept' }).click();
  await expectResolved(page, request, 'Accepted');
  const done = await json(`/calls/${call.id}?wait=20`, { base });
  assert.equal(done.status, 'completed', JSON.stringify(done));
  assert.match(done.result.content[0].text, /"model": "human"[\s\S]*Ship it\./);
  assertStayedHome(requested, problems, [], base);
});

// ---- answer links ---------------------------------------------------------------------------------------

/** A link that answers `request`, made by the (anonymous) principal of the plain gateway. */
async function linkTo(request) {
  const made = await json(`/requests/${request}/links`, { method: 'POST' });
  assert.ok(made.url.startsWith(`${gateway.base}/r/`), made.url);
  return made.url;
}

test('an answer link opens a page that shows the call, reorders nothing, and Approve sends it', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('echo', { text: 'ship it \u202egnp.exe' });
  const url = await linkTo(request);
  const context = await browser.newContext({ viewport: { width: 360, height: 740 } });
  t.after(() => context.close());
  const page = await context.newPage();
  const requested = [];
  const problems = [];
  page.on('request', (sent) => requested.push(sent.url()));
  page.on('console', (message) => message.type() === 'error' && problems.push(message.text()));
  page.on('response', (response) => response.status() >= 400 && problems.push(`${response.status()} ${response.url()}`));
  await page.goto(url);
  await page.getByRole('heading', { name: 'Allow echo on demo?' }).waitFor();
  const facts = await page.locator('dl').innerText();
  assert.match(facts, /Tool\s+echo/);
  assert.match(facts, /ship it ⟨U\+202E⟩gnp\.exe/);
  await page.screenshot({ path: join(SCREENSHOT_DIR, 'link-page.png'), fullPage: true });
  // Opening the page answered nothing.
  assert.equal((await json(`/requests/${request}`)).status, 'pending');
  await page.getByRole('button', { name: 'Approve' }).click();
  await page.getByRole('heading', { name: 'Answered' }).waitFor();
  const settled = await json(`/calls/${call}?wait=20`);
  assert.equal(settled.status, 'completed', JSON.stringify(settled));
  assert.equal(settled.result.content[0].text, 'ship it \u202egnp.exe');
  assert.equal((await json(`/requests/${request}`)).answerer.via, 'link');
  // Back to the link: the page says how it ended, and offers nothing to press.
  await page.goto(url);
  await page.getByText('nothing is left to answer').waitFor();
  assert.equal(await page.getByRole('button').count(), 0);
  assert.deepEqual(requested.filter((sent) => new URL(sent).origin !== gateway.base), []);
  assert.deepEqual(problems.filter((problem) => !problem.startsWith('410')), []);
});

test('an answer link fills in a form, shows what does not fit next to it, and sends the typed values', { timeout: 60_000 }, async (t) => {
  const { call, request } = await startCall('collect_profile');
  const url = await linkTo(request);
  const context = await browser.newContext();
  t.after(() => context.close());
  const page = await context.newPage();
  await page.goto(url);
  await page.getByLabel('Name').fill('Ada');
  await page.getByLabel('Age').fill('200');
  await page.getByLabel('Favourite colour').selectOption('blue');
  await page.getByRole('checkbox', { name: 'b' }).check();
  await page.getByRole('button', { name: 'Accept' }).click();
  await page.getByText('/age').waitFor();
  assert.equal(await page.getByLabel('Name').inputValue(), 'Ada');
  await page.getByLabel('Age').fill('36');
  await page.getByRole('checkbox', { name: 'Newsletter' }).check();
  await page.getByRole('button', { name: 'Accept' }).click();
  await page.getByRole('heading', { name: 'Answered' }).waitFor();
  const results = await resultsOf(call);
  assert.deepEqual(results[0].content, { name: 'Ada', age: 36, color: 'blue', tags: ['b'], newsletter: true });
});

/** A local Slack incoming webhook: the messages POSTed to it, as they come. */
async function slackReceiver(t) {
  const messages = [];
  let arrived = () => {};
  const server = createHttpServer((request, response) => {
    let body = '';
    request.on('data', (chunk) => { body += chunk; });
    request.on('end', () => {
      messages.push(JSON.parse(body));
      arrived();
      response.end('ok');
    });
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  t.after(() => new Promise((done) => server.close(done)));
  return {
    url: `http://127.0.0.1:${server.address().port}/slack`,
    async next() {
      while (!messages.length) await new Promise((done) => { arrived = done; });
      return messages.shift();
    },
  };
}

/** The link of a Slack message's button. */
function buttonLink(message) {
  const actions = message.blocks.find((block) => block.type === 'actions');
  assert.ok(actions, JSON.stringify(message));
  return actions.elements[0].url;
}

/** Signs `who` in at the provider's own pages, from wherever the page was sent there. */
async function signInAtProvider(page, who) {
  await page.locator('input[name="login"]').fill(who);
  await page.locator('input[name="password"]').fill('any password');
  await page.getByRole('button', { name: 'Sign-in' }).click();
  await page.getByRole('button', { name: 'Continue' }).click();
}

test('with links.sign_in a chat message\'s link answers only once a person signs in, and as that person', { timeout: 120_000 }, async (t) => {
  const slack = await slackReceiver(t);
  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const provider = await startProvider(`${base}/ui/ ${base}/r/signed-in`);
  t.after(() => provider.stop());
  const config =
    `[auth.oidc]\nissuer = "${provider.issuer}"\naudience = "toolnexus-gateway"\nui_client_id = "toolnexus-inbox"\n` +
    'roles = { approver = ["sre"], agent = ["agents"] }\n\n[links]\nsign_in = true\n\n' +
    `[[notify]]\nname = "sre-slack"\nslack = { webhook = "${slack.url}" }\n\n` +
    '[[approvals]]\nserver = "demo"\ntools = ["echo"]\napprovers = ["group:sre"]\n';
  const signing = await startGateway(config, `127.0.0.1:${port}`);
  t.after(() => signing.stop());
  const agent = { base, token: await provider.token('agent-1') };
  const { call, request } = await startCall('echo', { text: 'signed by link' }, agent);
  const link = buttonLink(await slack.next());
  assert.ok(link.startsWith(`${base}/r/`), link);

  // Carol is an agent: she signs in, and the policy still refuses her.
  const refused = await browser.newContext();
  t.after(() => refused.close());
  const carol = await refused.newPage();
  await carol.goto(link);
  await carol.getByRole('link', { name: 'Sign in to answer' }).click();
  await signInAtProvider(carol, 'carol');
  await carol.getByText('Signed in as carol').waitFor();
  await carol.getByRole('button', { name: 'Approve' }).click();
  await carol.getByText(/may not see|belongs to another principal|not among the approvers/).waitFor();
  assert.equal((await json(`/requests/${request}`, agent)).status, 'pending');

  // Without signing in, the page offers no form, and a post answers nothing.
  const posted = await fetch(link, { method: 'POST', body: new URLSearchParams({ decision: 'approve' }) });
  assert.equal(posted.status, 401);

  const context = await browser.newContext();
  t.after(() => context.close());
  const page = await context.newPage();
  await page.goto(link);
  assert.equal(await page.getByRole('button', { name: 'Approve' }).count(), 0);
  await page.getByRole('link', { name: 'Sign in to answer' }).click();
  await signInAtProvider(page, 'alice');
  await page.getByText('Signed in as alice').waitFor();
  assert.equal(page.url(), link, 'back at the link, the code gone from the address bar');
  const cookies = await context.cookies();
  assert.ok(cookies.every((cookie) => cookie.httpOnly && cookie.sameSite === 'Lax'), JSON.stringify(cookies));
  await page.getByRole('button', { name: 'Approve' }).click();
  await page.getByRole('heading', { name: 'Answered' }).waitFor();
  const answered = await json(`/requests/${request}`, agent);
  assert.equal(answered.answeredBy, 'alice');
  assert.deepEqual(answered.answerer, { name: 'alice', via: 'link', issuer: provider.issuer, subject: 'alice' });
  assert.equal((await json(`/calls/${call}?wait=20`, agent)).status, 'completed');
});

/** A real mail server on loopback (aiosmtpd, as scripts/notify-checkers.sh installs it), keeping what it gets. */
async function mailServer(t) {
  const venv = process.env.AIOSMTPD_VENV ||
    join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'toolnexus-gateway/aiosmtpd');
  assert.ok(existsSync(join(venv, 'bin/python')), `no aiosmtpd in ${venv}: run scripts/notify-checkers.sh`);
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'toolnexus-mail-'));
  const child = spawn(join(venv, 'bin/python'),
    ['-m', 'aiosmtpd', '-n', '-l', `127.0.0.1:${port}`, '-c', 'aiosmtpd.handlers.Mailbox', join(dir, 'mail')],
    { stdio: 'ignore' });
  t.after(() => { child.kill(); rmSync(dir, { recursive: true, force: true }); });
  const deadline = Date.now() + 30_000;
  for (;;) {
    const connected = await new Promise((done) => {
      const socket = createConnection({ port, host: '127.0.0.1' }, () => { socket.end(); done(true); });
      socket.on('error', () => done(false));
    });
    if (connected) break;
    assert.ok(Date.now() < deadline, 'the mail server never listened');
    await new Promise((done) => setTimeout(done, 50));
  }
  const received = () => {
    const box = join(dir, 'mail/new');
    return existsSync(box) ? readdirSync(box).sort().map((file) => readFileSync(join(box, file), 'utf8')) : [];
  };
  return {
    port,
    async next() {
      while (Date.now() < deadline + 30_000) {
        const mails = received();
        if (mails.length) return mails[0].replace(/=\r?\n/g, '').replace(/=([0-9A-F]{2})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)));
        await new Promise((done) => setTimeout(done, 50));
      }
      throw new Error('no mail arrived');
    },
  };
}

test('a mailed link opens in the browser and answers as the address it was sent to', { timeout: 90_000 }, async (t) => {
  const mail = await mailServer(t);
  const config =
    `[[notify]]\nname = "sre-mail"\nemail = { to = ["alice@example.com"], from = "gateway@example.com", ` +
    `smtp = "smtp://127.0.0.1:${mail.port}", starttls = false }\n\n` +
    '[[approvals]]\nserver = "demo"\ntools = ["echo"]\n';
  const mailing = await startGateway(config);
  t.after(() => mailing.stop());
  const { call, request } = await startCall('echo', { text: 'by mail' }, { base: mailing.base });
  const text = await mail.next();
  assert.match(text, /Subject: Approval needed: Allow echo on demo\?/);
  const link = /(http:\/\/\S+\/r\/\S+)/.exec(text)[1];
  const context = await browser.newContext();
  t.after(() => context.close());
  const page = await context.newPage();
  await page.goto(link);
  await page.getByRole('button', { name: 'Approve' }).click();
  await page.getByRole('heading', { name: 'Answered' }).waitFor();
  assert.match(await page.locator('main').innerText(), /Thank you, alice@example\.com/);
  const answered = await json(`/requests/${request}`, { base: mailing.base });
  assert.equal(answered.answeredBy, 'alice@example.com');
  assert.equal((await json(`/calls/${call}?wait=20`, { base: mailing.base })).status, 'completed');
});
