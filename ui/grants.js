// Standing grants in the inbox: the "Don't ask again" choice an approval offers beside Approve. Each piece of a
// server's text is shown as display.js says.

import { h, isolated } from './display.js';

/** What each `match` a grant may have covers, as the choice names it and as a sentence says it. */
const MATCHES = [
  { value: 'same-arguments', label: 'these arguments', says: 'with these arguments', changed: 'with the changed arguments' },
  { value: 'tool', label: 'any arguments to this tool', says: 'with any arguments', changed: 'with any arguments' },
];

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
    write(says, whose(), rest(match.says));
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
