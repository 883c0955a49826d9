// Standing grants in the inbox: the "Don't ask again" choice an approval offers beside Approve, and the list of
// the grants that hold, each with Revoke. Each piece of a server's text is shown as display.js says.

import { h, isolated } from './display.js';
import { showProblem } from './fields.js';

/** What each `match` a grant may have covers, as the choice names it and as a sentence says it. */
const MATCHES = [
  { value: 'same-arguments', label: 'these arguments', says: 'with these arguments', changed: 'with the changed arguments' },
  { value: 'tool', label: 'any arguments to this tool', says: 'with any arguments', changed: 'with any arguments' },
];
/** How many hex digits of a `same-arguments` grant's digest the list shows. */
const DIGEST_SHOWN = 12;
/** How a grant's end is written: date and time, to the minute. */
const WHEN = { dateStyle: 'medium', timeStyle: 'short' };

/**
 * The standing grants an approval offers (`data.grants`): `"session"` or durations such as `"1h"`, each once.
 * None on one that needs several people, where the gateway offers none.
 */
export function offeredGrants(request) {
  const data = request.data || {};
  if (!Array.isArray(data.grants) || Number(data.quorum) > 1) return [];
  return [...new Set(data.grants.filter((lasting) => typeof lasting === 'string' && lasting !== ''))];
}

/** How long a grant lasts, after "run without asking": nodes. */
function lastingSays(lasting) {
  return lasting === 'session' ? 'while the session this call ran on is open (a day at most)' : ['for ', isolated(lasting)];
}

/**
 * The "Don't ask again" choice of an approval offering the standing grants `offered`, as a field of the form
 * (`{name: 'grant', element, note, read(), setError(text), focus()}`): no grant (the default), or one of those
 * for these arguments or any. `read()` gives the answer's `grant`, or null. Under the choice a sentence says
 * what it does; `note` says the same for "Approve with changes", which binds the changed arguments.
 */
export function grantChoice(request, offered) {
  const id = `g-${request.id}`;
  const call = request.data.call;
  const radio = (name, index, checked) => {
    const input = h('input', { type: 'radio', id: `${id}-${name}-${index}`, name: `${id}-${name}`, value: String(index) });
    input.checked = checked;
    return input;
  };
  const option = (input, ...label) => h('label', { for: input.id, class: 'option' }, input, h('span', {}, label));
  const none = radio('for', 'none', true);
  const lastings = offered.map((lasting, index) => radio('for', index, false));
  const matches = MATCHES.map((match, index) => radio('match', index, index === 0));
  const which = h(
    'fieldset',
    { class: 'grant-match', disabled: true },
    h('legend', { text: 'Calls with' }),
    h('div', { class: 'options' }, matches.map((input, index) => option(input, MATCHES[index].label))),
  );
  const says = h('p', { class: 'consequence', id: `${id}-says`, 'aria-live': 'polite' });
  const note = h('p', { class: 'hint grant-note', id: `${id}-note` });
  const error = h('p', { class: 'error', id: `${id}-error`, hidden: true });
  const element = h(
    'fieldset',
    { class: 'field group grant', 'data-field': 'grant' },
    h('legend', { text: 'Don’t ask again' }),
    h(
      'div',
      { class: 'options' },
      option(none, 'No, ask every time'),
      lastings.map((input, index) => option(input, offered[index] === 'session' ? 'for this session' : ['for ', isolated(offered[index])])),
    ),
    which,
    says,
    error,
  );

  const setError = (text) => {
    error.textContent = text || '';
    error.hidden = !text;
    element.classList.toggle('invalid', Boolean(text));
    for (const input of [none, ...lastings]) {
      if (text) {
        input.setAttribute('aria-invalid', 'true');
        input.setAttribute('aria-describedby', error.id);
      } else {
        input.removeAttribute('aria-invalid');
        input.removeAttribute('aria-describedby');
      }
    }
  };
  const read = () => {
    const chosen = lastings.findIndex((input) => input.checked);
    if (chosen < 0) return null;
    const match = MATCHES[Math.max(0, matches.findIndex((input) => input.checked))];
    return { for: offered[chosen], match: match.value };
  };
  const whose = () => [isolated(call.caller ?? 'the caller'), '’s later calls of ', isolated(call.tool), ' on ', isolated(call.server)];
  const write = (line, ...content) => line.replaceChildren(...content.flat(Infinity));
  const describe = () => {
    const grant = read();
    which.disabled = !grant;
    if (grant) element.dataset.chosen = '';
    else delete element.dataset.chosen;
    if (!grant) {
      write(says, whose(), ' ask again, as this one did.');
      write(note, 'Don’t ask again (chosen above): no, later calls ask again.');
      return;
    }
    const match = MATCHES.find((m) => m.value === grant.match);
    const rest = (scope) => [' ', scope, ' run without asking ', lastingSays(grant.for), '.'];
    write(says, whose(), rest(match.says), ' ', h('span', { class: 'aside', text: 'You can revoke it under “Standing grants”.' }));
    write(note, 'Don’t ask again (chosen above): ', whose(), rest(match.changed));
  };
  element.addEventListener('change', () => {
    setError(null);
    describe();
  });
  describe();

  const focus = () => [none, ...lastings].find((input) => input.checked).focus();
  return { name: 'grant', element, note, says, read, setError, focus };
}

// ---- the grants that hold -------------------------------------------------------------------------------

/**
 * The list of the standing grants that hold, in `list` (with `empty` shown when there are none), newest first,
 * each with Revoke. `api(path, options)` calls the gateway, `notify(content, tone)` shows a notice, `quiet(error)`
 * says whether an error needs no word (the sign-in form took over), and `home` takes the focus when a grant
 * that had it leaves. Events and listings feed it through the verbs it returns.
 */
export function grantList({ list, empty, home, api, notify, quiet }) {
  /** The grants shown, by id: `{grant, item, uses}`. */
  const shown = new Map();
  /** Ids of grants that ended, so a late listing does not bring them back. */
  const ended = new Set();

  const refreshEmpty = () => {
    empty.hidden = shown.size > 0;
  };

  /** Shows `grant` as it is now, or its uses if it is shown already; an ended one leaves. */
  const put = (grant) => {
    if (!grant || typeof grant.id !== 'string' || ended.has(grant.id)) return;
    if (grant.revokedAt) return end(grant.id);
    const entry = shown.get(grant.id);
    if (entry) {
      if (Number(grant.uses) > Number(entry.grant.uses)) {
        entry.grant = grant;
        entry.uses.textContent = String(grant.uses);
      }
      return;
    }
    const made = item(grant);
    const created = Date.parse(grant.createdAt);
    const after = [...list.children].find((other) => Date.parse(shown.get(other.dataset.grant)?.grant.createdAt) < created);
    list.insertBefore(made.item, after || null);
    shown.set(grant.id, made);
    refreshEmpty();
  };

  /** Takes a grant off the list for good. */
  const end = (id) => {
    ended.add(id);
    const entry = shown.get(id);
    if (!entry) return;
    const hadFocus = entry.item.contains(document.activeElement);
    const next = entry.item.nextElementSibling || entry.item.previousElementSibling;
    entry.item.remove();
    shown.delete(id);
    refreshEmpty();
    if (hadFocus) (next ? next.querySelector('button') : home).focus();
  };

  /** Who a grant covers, and for which tool: nodes. */
  const what = (grant) => [isolated(grant.owner), ': ', isolated(grant.tool), ' on ', isolated(grant.server)];

  const item = (grant) => {
    const id = `gr-${grant.id}`;
    const uses = h('dd', { 'data-uses': '', text: String(grant.uses ?? 0) });
    const fact = (name, ...value) => h('div', {}, h('dt', { text: name }), h('dd', {}, value));
    const digest = typeof grant.digest === 'string' ? grant.digest : '';
    const covers = grant.match === 'tool'
      ? 'any arguments'
      : ['these arguments, digest ', h('code', { dir: 'ltr', title: digest, text: `${digest.slice(0, DIGEST_SHOWN)}…` })];
    const until = grant.expiresAt ? new Date(grant.expiresAt).toLocaleString(undefined, WHEN) : null;
    const lasting = grant.for === 'session'
      ? ['its session', until ? `, until ${until} at most` : '']
      : [isolated(String(grant.for)), until ? `, until ${until}` : ''];
    const problem = h('p', { class: 'problem', role: 'alert', hidden: true });
    const revoke = h('button', { type: 'button', id: `${id}-revoke`, 'aria-labelledby': `${id}-revoke ${id}-title`, text: 'Revoke' });
    const made = h(
      'li',
      { class: 'grant-item', 'data-grant': grant.id },
      h('h3', { id: `${id}-title` }, what(grant)),
      h(
        'dl',
        { class: 'meta' },
        fact('Covers', covers),
        fact('For', lasting),
        fact('Given by', isolated(grant.by)),
        h('div', {}, h('dt', { text: 'Uses' }), uses),
      ),
      problem,
      h('div', { class: 'actions' }, revoke),
    );
    const entry = { grant, item: made, uses };
    revoke.addEventListener('click', () => revokeOne(entry, revoke, problem));
    return entry;
  };

  /** `DELETE /grants/{id}`: the grant leaves the list, or the gateway's refusal shows beside it. */
  const revokeOne = async (entry, button, problem) => {
    const { grant, item: shownItem } = entry;
    shownItem.setAttribute('aria-busy', 'true');
    button.disabled = true;
    problem.hidden = true;
    try {
      const response = await api(`grants/${encodeURIComponent(grant.id)}`, { method: 'DELETE' });
      const reply = await response.json().catch(() => ({}));
      if (response.ok || response.status === 404) {
        end(grant.id);
        if (response.ok) notify(['Revoked: ', what(grant), '. The next call it covered asks again.']);
        else notify(['That grant had ended already: ', what(grant)], 'error');
        return;
      }
      const why = reply.detail ? ` The gateway says: ${reply.detail}` : '';
      showProblem(problem, response.status === 403 ? `This token may not revoke this grant.${why}` : reply.detail || `The gateway answered ${response.status}.`);
    } catch (error) {
      if (!quiet(error)) showProblem(problem, `Not revoked: ${error.message}`);
    } finally {
      shownItem.removeAttribute('aria-busy');
      button.disabled = false;
    }
  };

  return {
    /** Lists the grants that hold (`GET /grants`); a grant an event brought in since stays. */
    async relist() {
      const before = new Set(shown.keys());
      try {
        const response = await api('grants');
        if (!response.ok) throw new Error(`GET /grants answered ${response.status}`);
        const listed = await response.json();
        const ids = new Set(listed.map((grant) => grant.id));
        for (const id of before) if (!ids.has(id)) end(id);
        for (const grant of listed) put(grant);
      } catch (error) {
        if (!quiet(error)) notify(`Could not list the standing grants: ${error.message}`, 'error');
      }
    },
    /** `grant.created` and `grant.revoked`: the grant as it is now. */
    changed: put,
    /** `grant.used`: a call ran under the grant, which now counts one more use. */
    used: (use) => put(use && use.grant),
    /** `session.updated`: a session that closed ends the `session` grants bound to it. */
    session(view) {
      if (!view || !['closed', 'failed'].includes(view.status)) return;
      for (const [id, { grant }] of shown) if (grant.session === view.id) end(id);
    },
    /** Takes off those whose time is up at `now` (the gateway's clock, as the page reckons it). */
    tick(now) {
      for (const [id, { grant }] of shown) if (grant.expiresAt && Date.parse(grant.expiresAt) <= now) end(id);
    },
    /** Forgets every grant (signed out). */
    clear() {
      for (const entry of shown.values()) entry.item.remove();
      shown.clear();
      ended.clear();
      refreshEmpty();
    },
  };
}
