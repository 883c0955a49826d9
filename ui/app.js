// The approval inbox: lists pending Requests live from the gateway's REST API and answers them.
// Every element is built with the DOM API (no HTML strings), so nothing a server sends is parsed as markup,
// and each piece of a server's text is shown as display.js says. Pending Requests are read with display.js's
// JSON reader, which keeps their data as written.

import { address, canonicalJson, h, isolated, readJson, sha256, shownJson } from './display.js';
import { argumentEditor, isEditable } from './edit.js';
import { clearErrors, field, pointer, showErrors, showProblem } from './fields.js';
import { grantChoice, grantList, offeredGrants } from './grants.js';
import * as signInAt from './signin.js';

const API = new URL('../', document.baseURI);
const NOTICE_MS = 8000;
const RETRY_MS = 3000;
/** Where the access token is kept: this tab's session storage, never a cookie, local storage or a URL. */
const TOKEN_KEY = 'toolnexus-gateway.token';

const list = document.getElementById('requests');
const empty = document.getElementById('empty');
const notices = document.getElementById('notices');
const connection = document.getElementById('connection');
const inbox = document.getElementById('inbox');
const signin = document.getElementById('signin');
const tokenInput = document.getElementById('token');
const signinError = document.getElementById('signin-error');
const signout = document.getElementById('signout');
const alerts = document.getElementById('alerts');
const historyFilter = document.getElementById('history-filter');
const historyNote = document.getElementById('history-note');
const historyTable = document.getElementById('history-table');
const bulk = document.getElementById('bulk');
const selectAll = document.getElementById('select-all');
const bulkCount = document.getElementById('bulk-count');
const bulkHint = document.getElementById('bulk-hint');
const bulkApprove = document.getElementById('bulk-approve');
const bulkDecline = document.getElementById('bulk-decline');
const bulkReport = document.getElementById('bulk-report');
/** Pages of 1000 Requests the History reads at most, and rows it shows at most. */
const HISTORY_PAGES = 20;
const HISTORY_ROWS = 200;
/** The page's title without the pending count. */
const baseTitle = document.title;

/** Pending Requests on the page, by id: `{request, item, clock}`. */
const shown = new Map();
/** Ids already resolved, so a late list or event does not bring them back. */
const resolved = new Set();
/** Ids of the pending Requests selected for a bulk answer. */
const selected = new Set();
/** Ids of those a bulk answer is being sent for: its report says what became of them, not a notice each. */
const reporting = new Set();
/** Whether a bulk answer is being sent. */
let bulkBusy = false;
/** Calls by id, for their tool names. */
const calls = new Map();
/** Server clock minus ours, in milliseconds, from the `Date` header of the last listing. */
let skew = 0;
/** Stops the event stream of the current sign-in. */
let streaming = null;
/** The id of the last event seen, sent as `Last-Event-ID` when the stream reconnects. */
let lastEventId = null;
/** The access token in use: the tab's stored one at start, then whatever signing in or out leaves. */
let accessToken = readStoredToken();
/** The OpenID provider the inbox signs in at, when the gateway names one (see signin.js). */
const provider = await signInAt.provider();

/** The gateway answered 401: the sign-in form has taken over, so the caller has nothing to show. */
class SignInNeeded extends Error {}

/**
 * Calls the API with the access token, if there is one. On a `401` a token from the provider is refreshed once
 * when it can be; otherwise the sign-in form shows and this throws.
 */
async function api(path, options = {}, renewed = false) {
  const token = storedToken();
  const response = await fetch(new URL(path, API), {
    cache: 'no-store',
    ...options,
    headers: {
      accept: 'application/json',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...(options.headers || {}),
    },
  });
  if (response.status === 401) {
    // Another call may have renewed the token since this one was sent: that one is tried first.
    if (token && storedToken() && storedToken() !== token && !renewed) return api(path, options, true);
    const fresh = token && provider && !renewed ? await signInAt.refresh(provider) : null;
    if (fresh) {
      storeToken(fresh);
      return api(path, options, true);
    }
    requireToken(token ? 'That token was not accepted (it may have expired). Check it, or sign in again.' : '');
    throw new SignInNeeded();
  }
  return response;
}

// ---- the access token -----------------------------------------------------------------------------------

function readStoredToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

function storedToken() {
  return accessToken;
}

function storeToken(token) {
  accessToken = token;
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Without session storage the token lasts until the page is reloaded.
  }
}

function setConnection(name, text) {
  connection.dataset.state = name;
  connection.textContent = text;
}

/** Stops everything that used the token, forgets it, and shows the sign-in form with `message` (if any). */
function requireToken(message) {
  if (streaming) streaming.abort();
  streaming = null;
  lastEventId = null;
  storeToken(null);
  for (const id of [...shown.keys()]) remove(id);
  grants.clear();
  bulkReport.hidden = true;
  setConnection('signed-out', 'Signed out');
  signout.hidden = true;
  inbox.hidden = true;
  signin.hidden = false;
  signin.removeAttribute('aria-busy');
  signin.querySelector('button').disabled = false;
  signinError.textContent = message;
  signinError.hidden = !message;
  tokenInput.setAttribute('aria-describedby', message ? 'signin-hint signin-error' : 'signin-hint');
  if (message) tokenInput.setAttribute('aria-invalid', 'true');
  else tokenInput.removeAttribute('aria-invalid');
  if (message || document.activeElement === document.body) tokenInput.focus();
  if (message) tokenInput.select();
}

/** The stream answered with this token (or none was needed): show the inbox. */
function signedIn() {
  signout.hidden = !storedToken();
  if (signin.hidden) return;
  signin.hidden = true;
  signin.removeAttribute('aria-busy');
  signin.querySelector('button').disabled = false;
  tokenInput.value = '';
  tokenInput.setAttribute('aria-describedby', 'signin-hint');
  tokenInput.removeAttribute('aria-invalid');
  signinError.hidden = true;
  inbox.hidden = false;
  if (signin.contains(document.activeElement)) document.getElementById('title').focus();
}

signin.addEventListener('submit', (event) => {
  event.preventDefault();
  const token = tokenInput.value.trim();
  // A bearer token is visible ASCII; anything else could not even be sent as a header.
  if (!/^[\x21-\x7e]+$/.test(token)) {
    requireToken(token ? 'An access token has only letters, digits and punctuation.' : 'Enter an access token.');
    return;
  }
  signin.setAttribute('aria-busy', 'true');
  signin.querySelector('button').disabled = true;
  signInAt.forget();
  storeToken(token);
  connect();
});

if (provider) {
  const button = document.getElementById('sign-in-at-provider');
  button.textContent = `Sign in at ${new URL(provider.issuer).host}`;
  button.hidden = false;
  document.getElementById('signin-hint').textContent =
    'Sign in at your organisation’s identity provider, or paste an access token. What signing in gives this ' +
    'page is kept only in this browser tab, and is forgotten when you sign out or close the tab.';
  button.addEventListener('click', () => signInAt.begin(provider));
}

signout.addEventListener('click', () => {
  signInAt.forget();
  requireToken('');
  notify('Signed out.');
});

// A new Request can raise a browser notification, once the person allows it; the button asks.
if ('Notification' in window && Notification.permission === 'default') {
  alerts.hidden = false;
  alerts.addEventListener('click', async () => {
    const permission = await Notification.requestPermission();
    alerts.hidden = permission !== 'default';
    notify(permission === 'granted' ? 'New Requests will raise a notification.' : 'No notifications, then.');
  });
}

// ---- standing grants -----------------------------------------------------------------------------------

/** The standing grants that hold, each with Revoke, kept current from the event stream (see grants.js). */
const grants = grantList({
  list: document.getElementById('grants-list'),
  empty: document.getElementById('grants-empty'),
  home: document.getElementById('grants-title'),
  api,
  notify,
  quiet: (error) => error instanceof SignInNeeded,
});

// ---- the history ----------------------------------------------------------------------------------------

/** What each outcome the history filters by asks the API for: a status, and for an answer its decision. */
const OUTCOMES = {
  '': { status: 'all' },
  accepted: { status: 'answered', decision: 'accepted' },
  declined: { status: 'answered', decision: 'declined' },
  cancelled: { status: 'answered', decision: 'cancelled' },
  expired: { status: 'expired' },
  withdrawn: { status: 'cancelled' },
};

// Resolved Requests with who answered, when and how, the latest first; read when asked, filtered by the API.
historyFilter.addEventListener('submit', async (event) => {
  event.preventDefault();
  const byOutcome = OUTCOMES[historyFilter.elements.outcome.value] || OUTCOMES[''];
  const params = new URLSearchParams({ ...byOutcome, limit: '1000' });
  for (const name of ['server', 'tool', 'kind', 'answeredBy']) {
    const value = historyFilter.elements[name].value.trim();
    if (value) params.set(name, value);
  }
  let path = `requests?${params}`;
  const done = [];
  let pages = 0;
  try {
    // Oldest first, page by page, as the API lists them.
    while (path && pages < HISTORY_PAGES) {
      const response = await api(path);
      if (!response.ok) throw new Error(`GET /requests answered ${response.status}`);
      for (const request of await response.json()) if (request.status !== 'pending') done.push(request);
      const next = /<\/([^>]*)>;\s*rel="next"/.exec(response.headers.get('link') || '');
      path = next ? next[1] : null;
      pages += 1;
    }
  } catch (error) {
    if (!(error instanceof SignInNeeded)) notify(`Could not read the history: ${error.message}`, 'error');
    return;
  }
  const when = (request) => Date.parse(request.resolvedAt || request.createdAt);
  // Listed oldest first: reversed, a stable sort keeps the later of two resolved in the same millisecond first.
  done.reverse().sort((a, b) => when(b) - when(a));
  const rows = done.slice(0, HISTORY_ROWS).map((request) =>
    h(
      'tr',
      { 'data-request': request.id },
      h('td', { text: new Date(when(request)).toLocaleString() }),
      h('td', {}, isolated(request.prompt || request.id)),
      h('td', {}, isolated(request.kind)),
      h('td', {}, request.server === undefined ? ['posted by ', isolated(poster(request))] : isolated(request.server)),
      h('td', { text: outcome(request) }),
      h('td', {}, request.answeredBy ? answeredBy(request) : '—'),
    ),
  );
  historyTable.tBodies[0].replaceChildren(...rows);
  historyTable.hidden = rows.length === 0;
  const notes = [];
  if (!rows.length) notes.push('Nothing resolved matches.');
  if (done.length > rows.length) notes.push(`Showing the latest ${rows.length} of ${done.length}.`);
  if (path) notes.push(`Only the oldest ${pages * 1000} Requests kept were read; narrow the filter to see later ones.`);
  historyNote.textContent = notes.join(' ');
  historyNote.hidden = !notes.length;
});

// ---- the live list --------------------------------------------------------------------------------------

async function relist() {
  // Only what was shown when the listing was asked for can be gone from it: a card an event added since is
  // newer than the listing, which would otherwise take it away again.
  const before = new Set(shown.keys());
  try {
    const response = await api('requests?status=pending&limit=1000');
    if (!response.ok) throw new Error(`GET /requests answered ${response.status}`);
    const date = Date.parse(response.headers.get('date') || '');
    if (!Number.isNaN(date)) skew = date - Date.now();
    const pending = readJson(await response.text());
    const ids = new Set(pending.map((request) => request.id));
    for (const id of before) if (!ids.has(id)) remove(id);
    for (const request of pending) add(request);
  } catch (error) {
    if (!(error instanceof SignInNeeded)) notify(`Could not list the Requests: ${error.message}`, 'error');
  }
}

/** What each event of `GET /events` does to the page. */
const HANDLERS = {
  resync: () => {
    relist();
    grants.relist();
  },
  'request.created': (data) => alert(add(readJson(data))),
  'request.resolved': (data) => settle(JSON.parse(data)),
  'request.updated': (data) => recount(readJson(data)),
  'call.updated': (data) => learnCall(JSON.parse(data)),
  'session.updated': (data) => grants.session(JSON.parse(data)),
  'grant.created': (data) => grants.changed(JSON.parse(data)),
  'grant.used': (data) => grants.used(JSON.parse(data)),
  'grant.revoked': (data) => grants.changed(JSON.parse(data)),
};

/** Follows `GET /events` until signed out, reconnecting after a drop from the last event seen. */
function connect() {
  if (streaming) streaming.abort();
  const controller = new AbortController();
  streaming = controller;
  follow(controller.signal);
}

async function follow(signal) {
  while (!signal.aborted) {
    try {
      const resumeFrom = lastEventId;
      const headers = { accept: 'text/event-stream' };
      if (resumeFrom !== null) headers['last-event-id'] = resumeFrom;
      const response = await api('events', { headers, signal });
      if (!response.ok || !response.body) throw new Error(`GET /events answered ${response.status}`);
      signedIn();
      setConnection('live', 'Live');
      // Resuming, the gateway replays what was missed (or says `resync`); a fresh stream needs a listing.
      if (resumeFrom === null) {
        relist();
        grants.relist();
      }
      await read(response.body, (event) => {
        if (event.id !== null) lastEventId = event.id;
        const handler = HANDLERS[event.type];
        if (handler && event.data !== null) handler(event.data);
      });
    } catch (error) {
      if (error instanceof SignInNeeded || signal.aborted) return;
    }
    setConnection('offline', 'Disconnected, retrying…');
    await new Promise((done) => setTimeout(done, RETRY_MS));
  }
}

/** Reads a `text/event-stream` body to its end, calling `dispatch({id, type, data})` for each event. */
async function read(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const parse = sseParser(dispatch);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    parse(value);
  }
}

/**
 * A parser of the Server-Sent Events format: feed it text as it arrives. Lines end with CR, LF or CRLF; a
 * blank line ends an event; `:` starts a comment. `id` persists across events as the spec says, and an
 * event without `data` still moves it (`data` is then null).
 */
function sseParser(dispatch) {
  let pending = '';
  let id = null;
  let type = '';
  let data = [];
  const line = (text) => {
    if (text === '') {
      dispatch({ id, type: type || 'message', data: data.length ? data.join('\n') : null });
      type = '';
      data = [];
      return;
    }
    if (text.startsWith(':')) return;
    const colon = text.indexOf(':');
    const field = colon < 0 ? text : text.slice(0, colon);
    let value = colon < 0 ? '' : text.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data.push(value);
    else if (field === 'event') type = value;
    else if (field === 'id' && !value.includes('\0')) id = value;
  };
  return (chunk) => {
    pending += chunk;
    // A CR at the very end may be the first half of a CRLF: keep it until the next chunk.
    const cut = pending.endsWith('\r') ? pending.length - 1 : pending.length;
    const lines = pending.slice(0, cut).split(/\r\n|\r|\n/);
    pending = lines.pop() + pending.slice(cut);
    for (const text of lines) line(text);
  };
}

/** Shows a pending Request; returns it when it is new on the page. */
function add(request) {
  if (request.status !== 'pending' || shown.has(request.id) || resolved.has(request.id)) return null;
  const clock = h('span', { class: 'clock' });
  const item = h('li', { class: 'request', id: `r-${request.id}`, 'data-request': request.id });
  item.append(card(request, clock));
  item.addEventListener('change', (event) => {
    if (event.target.closest('.grant')) refreshBulk();
  });
  const created = Date.parse(request.createdAt);
  const after = [...list.children].find((other) => {
    const entry = shown.get(other.dataset.request);
    return entry && Date.parse(entry.request.createdAt) < created;
  });
  list.insertBefore(item, after || null);
  shown.set(request.id, { request, item, clock });
  tick();
  refreshEmpty();
  refreshBulk();
  if (request.call) describeCall(request.call);
  return request;
}

/** A browser notification of a Request that just arrived, when allowed and the page is not in view. */
function alert(request) {
  if (!request || !('Notification' in window) || Notification.permission !== 'granted' || !document.hidden) return;
  const from = request.server === undefined ? `Posted by ${poster(request)}` : request.server;
  const notification = new Notification(`A Request waits for an answer (${from})`, {
    body: request.prompt || request.kind,
    tag: request.id,
  });
  notification.addEventListener('click', () => {
    window.focus();
    const entry = shown.get(request.id);
    if (entry) entry.item.querySelector('h2').focus();
  });
}

/** A Request left the pending state (here or elsewhere): remove it, with a short confirmation unless `quiet`. */
function settle(request, quiet = reporting.has(request.id)) {
  if (resolved.has(request.id)) return;
  resolved.add(request.id);
  const entry = shown.get(request.id);
  if (!entry) return;
  if (!quiet) notify([`${outcome(request)}: `, title(entry.request)]);
  remove(request.id);
}

/** Who answered: the name, and for an OpenID principal the subject behind it. */
function answeredBy(request) {
  const answerer = request.answerer;
  const subject = answerer && answerer.via === 'oidc' && answerer.subject;
  return subject
    ? [isolated(request.answeredBy), h('small', { class: 'subject' }, ' (OpenID subject ', isolated(subject), ')')]
    : isolated(request.answeredBy);
}

/** A pending approval that needs several people took one more: the page shows the count as it is now. */
function recount(request) {
  const entry = shown.get(request.id);
  if (!entry || request.status !== 'pending') return;
  entry.request = request;
  const before = entry.item.querySelector('.approvals');
  const count = approvalCount(request);
  if (before && count) before.replaceWith(count);
}

function remove(id) {
  const entry = shown.get(id);
  if (!entry) return;
  const hadFocus = entry.item.contains(document.activeElement);
  const next = entry.item.nextElementSibling || entry.item.previousElementSibling;
  entry.item.remove();
  shown.delete(id);
  selected.delete(id);
  refreshEmpty();
  refreshBulk();
  if (hadFocus) (next ? next.querySelector('h2') : document.getElementById('title')).focus();
}

function outcome(request) {
  switch (request.status) {
    case 'answered':
      if (request.answer && request.answer.ok) return 'Accepted';
      return request.answer && request.answer.reason === 'declined' ? 'Declined' : 'Cancelled';
    case 'expired':
      return 'Expired';
    default:
      return request.detail ? `Withdrawn (${request.detail})` : 'Withdrawn';
  }
}

/** What a Request is about, as nodes: its tool, server (or poster) and prompt, each isolated. */
function title(request) {
  const entry = request.call && calls.get(request.call);
  const kind = request.kind === 'authorization' ? 'Authorization' : 'Request';
  const what = request.prompt ? isolated(request.prompt) : kind;
  if (request.server === undefined) return ['Posted by ', isolated(poster(request)), ': ', what];
  const where = [isolated(request.server), ': ', what];
  return entry ? [isolated(entry.tool), ' on ', where] : where;
}

/** Shows a notice for a while: `content` is a string or nodes. */
function notify(content, tone = 'ok') {
  const notice = h('p', { class: `notice ${tone}` }, content);
  notices.append(notice);
  setTimeout(() => notice.remove(), NOTICE_MS);
}

function refreshEmpty() {
  empty.hidden = shown.size > 0;
  document.title = shown.size ? `(${shown.size}) ${baseTitle}` : baseTitle;
}

async function describeCall(id) {
  if (calls.has(id)) return learnCall(calls.get(id));
  try {
    const response = await api(`calls/${encodeURIComponent(id)}`);
    if (response.ok) learnCall(await response.json());
  } catch {
    // The tool name is a nicety; the Request stays answerable without it.
  }
}

function learnCall(call) {
  calls.set(call.id, call);
  for (const element of list.querySelectorAll(`[data-tool-of="${CSS.escape(call.id)}"]`)) {
    element.replaceChildren(isolated(call.tool));
  }
}

// ---- time -----------------------------------------------------------------------------------------------

function tick() {
  const now = Date.now() + skew;
  grants.tick(now);
  for (const { request, clock } of shown.values()) {
    const age = `received ${duration(now - Date.parse(request.createdAt))} ago`;
    if (!request.expiresAt) {
      clock.textContent = age;
      continue;
    }
    const left = Date.parse(request.expiresAt) - now;
    clock.textContent = left > 0 ? `${age} · expires in ${duration(left)}` : `${age} · expiring now`;
    clock.classList.toggle('soon', left < 60_000);
  }
}

function duration(ms) {
  const seconds = Math.max(0, Math.floor(ms / 1000));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes}:${String(seconds % 60).padStart(2, '0')} min`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

// ---- one Request ----------------------------------------------------------------------------------------

/** The form each kind of Request is answered in. */
const FORMS = { url: urlForm, approval: approvalForm, schema: schemaForm, question: questionForm, plain: plainForm };

/** Which of `FORMS` a Request is answered in. */
function formOf(request) {
  if (request.url !== undefined) return 'url';
  if (request.kind === 'approval' && request.server !== undefined && request.data && request.data.call) return 'approval';
  if (request.data && request.data.schema) return 'schema';
  if (request.kind === 'question' && request.data && Array.isArray(request.data.questions)) return 'question';
  return 'plain';
}

/** Who posted a Request that no server raised (POST /requests). */
function poster(request) {
  return request.owner || 'unknown';
}

function card(request, clock) {
  const heading = `h-${request.id}`;
  const known = request.call && calls.get(request.call);
  const posted = h(
    'dl',
    { class: 'meta' },
    h('div', {}, h('dt', { text: 'Posted by' }), h('dd', {}, isolated(poster(request)))),
    h('div', {}, h('dt', { text: 'Kind' }), h('dd', {}, isolated(request.kind))),
  );
  const meta = request.server === undefined ? posted : h(
    'dl',
    { class: 'meta' },
    h('div', {}, h('dt', { text: 'Server' }), h('dd', {}, isolated(request.server))),
    h(
      'div',
      {},
      h('dt', { text: 'Tool' }),
      h('dd', { 'data-tool-of': request.call }, known ? isolated(known.tool) : request.call ? '…' : 'unknown'),
    ),
    h('div', {}, h('dt', { text: 'Call' }), h('dd', { class: 'id', text: request.call || 'not attributed' })),
  );
  const body = FORMS[formOf(request)](request);
  return h(
    'article',
    { 'aria-labelledby': heading },
    pickBox(request),
    h(
      'h2',
      { id: heading, tabindex: -1 },
      request.prompt ? isolated(request.prompt) : request.url ? 'Visit a link' : 'A request',
    ),
    meta,
    h('p', { class: 'time' }, clock),
    request.kind === 'sampling' ? conversation(request) : null,
    body,
  );
}

/**
 * The conversation a sampling Request asks a reply to (`data.systemPrompt`, `data.messages`): each message's
 * role and its text, isolated; content that is not text is named, not shown.
 */
function conversation(request) {
  const data = request.data || {};
  const said = (role, text) => h('div', { class: 'message' }, h('dt', { text: role }), h('dd', {}, isolated(text)));
  const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value);
  const messages = (Array.isArray(data.messages) ? data.messages : []).filter(isObject).map((message) => {
    const blocks = (Array.isArray(message.content) ? message.content : [message.content]).filter(isObject);
    const text = blocks
      .map((block) => (block.type === 'text' ? String(block.text ?? '') : `[${String(block.type)} content]`))
      .join('\n');
    return said(message.role === 'assistant' ? 'Assistant' : 'User', text);
  });
  const system = typeof data.systemPrompt === 'string' ? [said('System', data.systemPrompt)] : [];
  return h('dl', { class: 'conversation', 'aria-label': 'Conversation' }, system, messages);
}

/** The form of a form-mode Request, generated from its requested schema. */
function schemaForm(request) {
  const schema = request.data.schema;
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const fields = Object.entries(schema.properties || {}).map(([name, property], index) =>
    field(`f-${request.id}-${index}`, name, property || {}, required.has(name)),
  );
  return fieldsForm(request, fields, () => {
    const data = {};
    const local = [];
    for (const f of fields) {
      const read = f.read();
      if (read.error) local.push({ path: `/${pointer(f.name)}`, message: read.error });
      else if (read.present) data[f.name] = read.value;
    }
    return { data, local };
  });
}

/**
 * A form of generated fields with Accept, Decline and Cancel. On Accept, `collect()` gives the answer's
 * `data`, or in `local` the problems to show beside the fields before anything is sent; the gateway's `422`
 * is shown the same way.
 */
function fieldsForm(request, fields, collect) {
  const form = h('form', { novalidate: true, 'aria-labelledby': `h-${request.id}` });
  const problem = h('p', { class: 'problem', role: 'alert', hidden: true, id: `p-${request.id}` });
  form.append(...fields.map((f) => f.element), problem, buttons(request, 'Accept'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearErrors(fields, problem);
    const { data, local } = collect();
    if (local.length) return showErrors(local, fields, problem);
    await answer(request, { ok: true, data }, form, (errors) => showErrors(errors, fields, problem));
  });
  wireButtons(request, form, problem);
  return form;
}

/**
 * An approval (an approval policy held a tool call for it): who called which tool on which server, and the
 * arguments that go upstream if it is approved, whole and as written. Approve waits until the page has found
 * that the arguments it shows hash to the approval's digest, which the gateway checks before it forwards them,
 * and stays off when they do not; so does editing them, for an editable policy's approval (see edit.js).
 */
function approvalForm(request) {
  const call = request.data.call;
  const fact = (name, value) => h('div', {}, h('dt', { text: name }), h('dd', {}, isolated(String(value ?? ''))));
  const facts = h('dl', { class: 'meta facts' }, fact('Tool', call.tool), fact('Server', call.server), fact('Caller', call.caller));
  const args = call.arguments === undefined ? {} : call.arguments;
  const digest = h('p', { class: 'digest', text: 'Checking the arguments against the approval’s digest…' });
  const form = h('form', { novalidate: true, 'aria-labelledby': `h-${request.id}` });
  const problem = h('p', { class: 'problem', role: 'alert', hidden: true });
  const shown = jsonFigure('Arguments, sent to the tool exactly as shown if you approve', args);
  const offered = offeredGrants(request);
  const choice = offered.length ? grantChoice(request, offered) : null;
  const parts = [facts, approvalCount(request), shown, digest, choice && choice.element, problem, buttons(request, 'Approve')];
  form.append(...parts.filter(Boolean));
  acceptOnSubmit(request, form, problem, choice);
  const approve = form.querySelector('button[type="submit"]');
  if (choice) approve.setAttribute('aria-describedby', choice.says.id);
  const held = [approve];
  let body = form;
  if (isEditable(request)) {
    body = h('div', { class: 'approval' }, form);
    const withChanges = (text, shownAt, invalid) => {
      const grant = choice && choice.read();
      if (choice) choice.setError(null);
      const sent = `{"ok":true,"data":{"arguments":${text}}${grant ? `,"grant":${JSON.stringify(grant)}` : ''}}`;
      return answer(request, sent, body, (errors) => {
        // A grant the gateway refuses is shown at the choice, above; the rest beside the edited arguments.
        const atGrant = choice ? errors.filter(isAtGrant) : [];
        const rest = errors.filter((error) => !atGrant.includes(error));
        if (atGrant.length && !rest.length) return showErrors(atGrant, [choice], shownAt);
        if (atGrant.length) choice.setError(atGrant.map((error) => error.message).join('; '));
        invalid(rest);
      }, shownAt);
    };
    const editor = argumentEditor(request, args, withChanges, choice && choice.note);
    approve.after(editor.toggle);
    body.append(editor.form);
    held.push(editor.toggle);
  }
  for (const button of held) {
    button.dataset.held = '';
    button.disabled = true;
  }
  checkDigest(args, request.data.digest, digest, held);
  return body;
}

/**
 * For an approval that needs several people (`data.quorum`): how many approved so far, and who; null for one
 * that needs one.
 */
function approvalCount(request) {
  const quorum = Number(request.data && request.data.quorum) || 1;
  if (quorum < 2) return null;
  const given = (request.decisions || []).filter((decision) => decision.ok);
  const names = given.flatMap((decision, index) => [index ? ', ' : ' — ', isolated(decision.by)]);
  return h('p', { class: 'approvals' }, `${given.length} of ${quorum} approvals`, names);
}

/** Says whether `args`, as the page read them, hash to `expected`; the `held` buttons go on only when they do. */
async function checkDigest(args, expected, line, held) {
  const actual = await sha256(canonicalJson(args));
  const code = h('code', { text: String(expected ?? 'none') });
  if (actual !== null && actual !== expected) {
    line.className = 'warning';
    line.replaceChildren(
      'The arguments shown do not hash to this approval’s digest (',
      code,
      '), so the page does not offer Approve: decline it, or look at it over the REST API.',
    );
    return;
  }
  line.replaceChildren(
    ...(actual === null
      ? ['Digest ', code, ' (not checked: this browser computes SHA-256 only over https or on localhost).']
      : ['Digest ', code, ': the SHA-256 of the arguments shown, which the gateway checks again before it forwards them.']),
  );
  for (const button of held) {
    delete button.dataset.held;
    button.disabled = Boolean(button.closest('[aria-busy]'));
  }
  refreshBulk();
}

/** JSON under a caption, whole and as written (see display.js `shownJson`), with its warnings. */
function jsonFigure(caption, value) {
  const { nodes, warnings } = shownJson(value);
  return h(
    'figure',
    { class: 'json' },
    h('figcaption', { text: caption }),
    h('pre', { dir: 'ltr' }, nodes),
    warnings.map((text) => h('p', { class: 'warning', text })),
  );
}

/**
 * The form of a `question` Request (toolnexus `data.questions`): each question a choice among its options
 * (several when `multiple`), or free text where it has none, its `header` shown under it. Accept answers
 * `{answers: [...]}`, one per question in order: the option chosen, the options chosen, or the text.
 */
function questionForm(request) {
  const fields = request.data.questions.map((question, index) => {
    const options = Array.isArray(question.options) && question.options.length ? question.options.map(String) : null;
    const shown = { title: String(question.question ?? ''), description: question.header ? String(question.header) : undefined };
    const schema = !options
      ? { type: 'string', ...shown }
      : question.multiple
        ? { type: 'array', items: { enum: options }, ...shown }
        : { type: 'string', enum: options, ...shown };
    const many = Boolean(options && question.multiple);
    return { ...field(`f-${request.id}-${index}`, String(index), schema, !many), many };
  });
  return fieldsForm(request, fields, () => {
    const answers = [];
    const local = [];
    for (const f of fields) {
      const read = f.read();
      // Nothing on the server checks a question's answers: one is needed here, but for a multiple choice.
      const missing = !f.many && (!read.present || read.value === '');
      if (read.error || missing) local.push({ path: `/${pointer(f.name)}`, message: read.error || 'An answer is needed.' });
      else answers.push(read.present ? read.value : []);
    }
    return { data: { answers }, local };
  });
}

/**
 * The controls of a URL-mode Request: the URL as the browser reads it and, when that differs, as the server
 * sent it; warnings; an explicit link to what is shown; and the answers.
 */
function urlForm(request) {
  const problem = h('p', { class: 'problem', role: 'alert', hidden: true });
  const { shown, sent, href, warnings } = address(request.url);
  const open = href
    ? h('a', {
        class: 'button link',
        href,
        target: '_blank',
        rel: 'noopener noreferrer',
        referrerpolicy: 'no-referrer',
        'aria-describedby': `u-${request.id}`,
        text: 'Open link',
      })
    : h('p', { class: 'warning', text: 'This is not a web address, so it is not offered as a link.' });
  const form = h(
    'form',
    { novalidate: true, 'aria-labelledby': `h-${request.id}` },
    h('p', { class: 'hint', text: 'The server asks you to visit this address. Check the highlighted host, open it yourself, then answer:' }),
    h('p', { class: 'url', dir: 'ltr', id: `u-${request.id}` }, shown),
    sent && [h('p', { class: 'hint', text: 'As the server sent it:' }), h('p', { class: 'sent', dir: 'ltr' }, sent)],
    warnings.map((text) => h('p', { class: 'warning', text })),
    h('p', { class: 'open' }, open),
    problem,
    buttons(request, 'Done'),
  );
  acceptOnSubmit(request, form, problem);
  return form;
}

/**
 * A Request of a kind this page has no special form for: its data, if any, and accept, decline or cancel. A
 * posted one says that its answer goes to whoever posted it, whatever its kind or prompt claims.
 */
function plainForm(request) {
  const form = h('form', { novalidate: true, 'aria-labelledby': `h-${request.id}` });
  const problem = h('p', { class: 'problem', role: 'alert', hidden: true });
  if (request.server === undefined) {
    const note = 'Posted to the gateway over its REST API, not raised by a tool call: ' +
      'the answer goes back to whoever posted it.';
    form.append(h('p', { class: 'hint', text: note }));
  }
  if (request.data !== undefined && request.data !== null && Object.keys(request.data).length) {
    form.append(jsonFigure('Data', request.data));
  }
  form.append(problem, buttons(request, 'Accept'));
  acceptOnSubmit(request, form, problem);
  return form;
}

/** Whether a violation the gateway found is in the answer's standing grant. */
function isAtGrant(error) {
  const path = String(error.path || '');
  return path === '/grant' || path.startsWith('/grant/');
}

/**
 * Submitting a form without fields accepts with no data, with the standing grant `choice` (see grants.js) gives,
 * if any; its other buttons decline or cancel.
 */
function acceptOnSubmit(request, form, problem, choice = null) {
  const fields = choice ? [choice] : [];
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    if (form.querySelector('button[type="submit"][data-held]')) return;
    clearErrors(fields, problem);
    const grant = choice && choice.read();
    await answer(request, grant ? { ok: true, grant } : { ok: true }, form, (errors) => showErrors(errors, fields, problem));
  });
  wireButtons(request, form, problem);
}

function buttons(request, accept) {
  return h(
    'div',
    { class: 'actions' },
    h('button', { type: 'submit', class: 'primary', text: accept }),
    h('button', { type: 'button', 'data-reason': 'declined', text: 'Decline' }),
    h('button', { type: 'button', 'data-reason': 'cancelled', text: 'Cancel' }),
  );
}

function wireButtons(request, form, problem) {
  for (const button of form.querySelectorAll('button[data-reason]')) {
    button.addEventListener('click', async () => {
      clearErrors([], problem);
      await answer(request, { ok: false, reason: button.dataset.reason }, form, () => {});
    });
  }
}

/**
 * Posts an Answer (`body` an object, or its JSON text) with the buttons of `form` off meanwhile; on success the
 * Request leaves the list, on a 422 `invalid` gets the violations, and any other refusal shows in `problem`.
 */
async function answer(request, body, form, invalid, problem = form.querySelector('.problem')) {
  form.setAttribute('aria-busy', 'true');
  for (const button of form.querySelectorAll('button')) button.disabled = true;
  try {
    const { response, reply } = await post(request, body);
    if (response.ok) return kept(request, reply);
    if (response.status === 422 && Array.isArray(reply.errors)) return invalid(reply.errors);
    showProblem(problem, refusal(response, reply));
  } catch (error) {
    if (!(error instanceof SignInNeeded)) showProblem(problem, `The answer was not sent: ${error.message}`);
  } finally {
    form.removeAttribute('aria-busy');
    for (const button of form.querySelectorAll('button')) button.disabled = 'held' in button.dataset;
  }
}

/** Posts an Answer (`body` an object, or its JSON text): `{response, reply}`, the reply's JSON (or `{}`). */
async function post(request, body) {
  const response = await api(`requests/${encodeURIComponent(request.id)}/answer`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { response, reply: await response.json().catch(() => ({})) };
}

/** The gateway kept an answer: the Request resolved, or counts one more (with a confirmation, unless reported). */
function kept(request, reply) {
  if (reply.status !== 'pending') return settle(reply);
  recount(reply);
  if (!reporting.has(request.id)) notify(['Your approval is counted: ', title(request)]);
}

/** What the page says of an answer the gateway refused. */
function refusal(response, reply) {
  if (response.status === 403) {
    const why = reply.detail ? ` The gateway says: ${reply.detail}` : '';
    return `This token may not answer this Request.${why}`;
  }
  return reply.detail || `The gateway answered ${response.status}.`;
}

// ---- answering several at once --------------------------------------------------------------------------

/** The checkbox that selects a Request for a bulk answer, named by the word and the Request's heading. */
function pickBox(request) {
  const box = h('input', { type: 'checkbox', id: `s-${request.id}`, 'aria-labelledby': `sl-${request.id} h-${request.id}` });
  box.addEventListener('change', () => {
    if (box.checked) selected.add(request.id);
    else selected.delete(request.id);
    refreshBulk();
  });
  return h('div', { class: 'pick' }, h('label', { for: box.id, class: 'option' }, box, h('span', { id: `sl-${request.id}`, text: 'Select' })));
}

/**
 * Whether a Request can be approved from outside its card, with no data: an approval whose arguments the page
 * checked against its digest, or a Request without a form.
 */
function approvable(entry) {
  const form = formOf(entry.request);
  if (form === 'plain') return true;
  const approve = entry.item.querySelector('button[type="submit"].primary');
  return form === 'approval' && Boolean(approve) && !('held' in approve.dataset);
}

/** Shows the bulk controls while anything is pending, and what they would act on. */
function refreshBulk() {
  const count = selected.size;
  const left = [...selected].filter((id) => !approvable(shown.get(id))).length;
  bulk.hidden = shown.size === 0;
  selectAll.checked = count > 0 && count === shown.size;
  selectAll.indeterminate = count > 0 && count < shown.size;
  bulkCount.textContent = count ? `${count} selected` : 'None selected';
  // A grant chosen on a card is that card's Approve's to give: answered in bulk, the card gives none.
  const granting = [...selected].some((id) => shown.get(id).item.querySelector('.grant[data-chosen]'));
  bulkApprove.disabled = bulkBusy || count === left;
  bulkDecline.disabled = bulkBusy || count === 0;
  const hints = [];
  if (left === 1) hints.push('Approve selected leaves out one of them: it asks for an answer in its own form, or its arguments were not checked.');
  if (left > 1) hints.push(`Approve selected leaves out ${left} of them: they ask for answers in their own forms, or their arguments were not checked.`);
  if (granting) hints.push('Approve selected gives no standing grant: to give the one chosen on a card, approve it there.');
  bulkHint.textContent = hints.join(' ');
  bulkHint.hidden = hints.length === 0;
}

selectAll.addEventListener('change', () => {
  for (const [id, entry] of shown) {
    entry.item.querySelector('.pick input').checked = selectAll.checked;
    if (selectAll.checked) selected.add(id);
    else selected.delete(id);
  }
  refreshBulk();
});
bulkApprove.addEventListener('click', () => answerSelected(true));
bulkDecline.addEventListener('click', () => answerSelected(false));
bulkReport.querySelector('button').addEventListener('click', () => {
  bulkReport.hidden = true;
  selectAll.focus();
});

/**
 * Approves (`ok`) or declines each selected Request with an answer of its own, one after another, and reports
 * which went through and which the gateway refused, and why; a refused one stays selected, its reason on its card.
 */
async function answerSelected(ok) {
  const entries = [...selected].map((id) => shown.get(id)).filter(Boolean);
  bulkBusy = true;
  bulk.setAttribute('aria-busy', 'true');
  refreshBulk();
  const results = [];
  try {
    for (const entry of entries) {
      if (!shown.has(entry.request.id)) results.push({ entry, done: false, said: 'Resolved meanwhile, elsewhere.' });
      else if (ok && !approvable(entry)) results.push({ entry, done: false, said: 'Left out: answer it in its own card.' });
      else results.push(await answerOne(entry, ok ? { ok: true } : { ok: false, reason: 'declined' }));
    }
  } catch (error) {
    if (!(error instanceof SignInNeeded)) throw error;
    return;
  } finally {
    bulkBusy = false;
    bulk.removeAttribute('aria-busy');
    refreshBulk();
  }
  report(ok ? 'Approve selected' : 'Decline selected', results);
}

/** Sends one Request's part of a bulk answer: `{entry, done, said}`; a refusal shows on its card too. */
async function answerOne(entry, body) {
  const { request } = entry;
  reporting.add(request.id);
  try {
    const { response, reply } = await post(request, body);
    if (response.ok) {
      kept(request, reply);
      return { entry, done: true, said: reply.status === 'pending' ? 'Your approval is counted.' : `${outcome(reply)}.` };
    }
    const text = response.status === 422 ? reply.detail || 'The answer does not fit.' : refusal(response, reply);
    showProblem(entry.item.querySelector('.problem'), text);
    return { entry, done: false, status: response.status, said: text };
  } catch (error) {
    if (error instanceof SignInNeeded) throw error;
    return { entry, done: false, said: `Not sent: ${error.message}` };
  } finally {
    reporting.delete(request.id);
  }
}

/** Lists what a bulk answer did to each Request, and moves focus there. */
function report(action, results) {
  const through = results.filter((result) => result.done).length;
  const items = results.map(({ entry, done, status, said }) =>
    h(
      'li',
      { class: done ? 'through' : 'refused', 'data-reported': entry.request.id },
      h('strong', { text: done ? 'Done' : status ? `Refused (${status})` : 'Not sent' }),
      ' ',
      h('span', {}, title(entry.request)),
      h('p', { class: 'said', text: said }),
    ),
  );
  const heading = bulkReport.querySelector('h2');
  heading.textContent = `${action}: ${through} of ${results.length} went through`;
  bulkReport.querySelector('ul').replaceChildren(...items);
  bulkReport.hidden = false;
  heading.focus();
}

refreshEmpty();
refreshBulk();
setInterval(tick, 1000);
try {
  const token = provider && (await signInAt.complete(provider));
  if (token) storeToken(token);
  connect();
} catch (error) {
  requireToken(`Signing in did not work: ${error.message}`);
}
