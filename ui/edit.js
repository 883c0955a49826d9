// Approving with changes: the arguments of an editable policy's approval edited in a form built from the tool's
// inputSchema, with a JSON object for what the form cannot show exactly, and the changes reviewed before they
// are sent. What the person left alone is sent as the gateway wrote it, every number with all its digits.

import { editableJson, h, hidesCharacters, jsonChanges, membersAsWritten, readJson, shownJson } from './display.js';
import { choices, clearErrors, field, pointer, showErrors } from './fields.js';

/** The words for each kind of change. */
const OPS = { add: 'Added', remove: 'Removed', replace: 'Changed' };
/** The formats whose inputs show a value otherwise than it is written: such a property is edited as text. */
const REWRITTEN_FORMATS = new Set(['date', 'date-time']);
/** The schema types a field edits, and the type of their values. */
const PRIMITIVE = new Map([['string', 'string'], ['number', 'number'], ['integer', 'number'], ['boolean', 'boolean']]);
/** A JSON number, as a number input may hold one. */
const JSON_NUMBER = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$/;

/** Whether an approval may be approved with other arguments: its policy is editable, and it has the tool's schema. */
export function isEditable(request) {
  const schema = request.data.call.inputSchema;
  return request.data.editable === true && schema !== null && typeof schema === 'object' && !Array.isArray(schema);
}

/**
 * The editor of an approval's arguments `args` (as `readJson` read them), a form of its own: `{form, toggle}`,
 * the toggle a button that shows and hides it. Review shows what changed; "Approve with changes" then calls
 * `approve(text, problem, invalid)` with the reviewed arguments' JSON text, which shows the gateway's `422` through
 * `invalid(errors)` beside the fields. `note`, if given, is shown beside "Approve with changes" and describes it.
 */
export function argumentEditor(request, args, approve, note = null) {
  const id = `e-${request.id}`;
  const schema = request.data.call.inputSchema;
  const members = membersAsWritten(args);
  const original = new Map(members.map(({ key, text }) => [key, text]));
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const { properties } = schema;
  const described = properties !== null && typeof properties === 'object' && !Array.isArray(properties) ? properties : {};

  const fields = Object.entries(described)
    .map(([name, property], index) => {
      const shown = shownBy(property, original.has(name) ? args[name] : undefined, original.get(name));
      return shown && field(`${id}-${index}`, name, shown, required.has(name));
    })
    .filter(Boolean);
  const named = new Set(fields.map((f) => f.name));
  let restName = '*';
  while (named.has(restName)) restName += '*';
  const rest = restField(id, restName, members.filter(({ key }) => !named.has(key)));
  const all = [...fields, rest];

  // What the person has not touched is sent as it was.
  const touched = new Set();
  for (const f of all) {
    for (const type of ['input', 'change']) f.element.addEventListener(type, () => touched.add(f.name));
  }

  const review = h('div', { class: 'review', 'aria-live': 'polite' });
  const problem = h('p', { class: 'problem', role: 'alert', hidden: true });
  const send = h('button', {
    type: 'button',
    class: 'primary',
    'data-held': '',
    disabled: true,
    'aria-describedby': note && note.id,
    text: 'Approve with changes',
  });
  const form = h(
    'form',
    { class: 'editor', id, novalidate: true, hidden: true, 'aria-labelledby': `${id}-title` },
    h('h3', { id: `${id}-title`, tabindex: -1, text: 'Edit arguments' }),
    h('p', {
      class: 'hint',
      text: 'Change what the tool is called with, then review the changes. The gateway checks them against the ' +
        'tool’s input schema before it forwards them.',
    }),
    all.map((f) => f.element),
    review,
    problem,
    note,
    h('div', { class: 'actions' }, h('button', { type: 'submit', text: 'Review changes' }), send),
  );

  /** The arguments reviewed last, as JSON text: what "Approve with changes" sends. */
  let reviewed = null;
  const hold = () => {
    reviewed = null;
    send.dataset.held = '';
    send.disabled = true;
  };
  form.addEventListener('input', () => {
    if (reviewed === null) return;
    hold();
    review.replaceChildren(h('p', { class: 'hint', text: 'The arguments changed since the review: review them again.' }));
  });

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    hold();
    clearErrors(all, problem);
    review.replaceChildren();
    const { text, local } = collect(fields, rest, touched, original, members);
    if (local.length) return showErrors(local, all, problem);
    const edited = readJson(text);
    const { changes, warnings } = jsonChanges(args, edited);
    if (!changes.length) {
      review.append(h('p', { class: 'hint', text: 'Nothing is changed: Approve sends the arguments as they are.' }));
      return;
    }
    review.append(changeList(`${id}-changes`, changes, warnings));
    review.querySelector('h4').focus();
    reviewed = text;
    delete send.dataset.held;
    send.disabled = false;
  });

  send.addEventListener('click', async () => {
    if (reviewed === null) return;
    clearErrors(all, problem);
    await approve(reviewed, problem, (errors) => showErrors(errors.map((error) => placed(error, named, restName)), all, problem));
  });

  const toggle = h('button', { type: 'button', 'aria-expanded': 'false', 'aria-controls': id, text: 'Edit arguments' });
  toggle.addEventListener('click', () => {
    form.hidden = !form.hidden;
    toggle.setAttribute('aria-expanded', String(!form.hidden));
    if (!form.hidden) form.querySelector('h3').focus();
  });
  return { form, toggle };
}

/**
 * The schema a form field is built from for a property whose value is `value`, written `text` (both undefined
 * when it is absent), pre-filled with that value; null when a field could not show it as it is written (a nested
 * object, an array other than of choices, a number a number input would round or rewrite, a string with
 * characters that hide or reorder text, a value of another type than the schema's): the JSON object takes it.
 */
function shownBy(property, value, text) {
  if (property === null || typeof property !== 'object' || Array.isArray(property)) return null;
  const present = text !== undefined;
  if (present && (text !== JSON.stringify(value) || (typeof value === 'string' && hidesCharacters(value)))) return null;
  const prefilled = { ...property, default: present ? value : undefined };
  if (REWRITTEN_FORMATS.has(property.format)) delete prefilled.format;
  const primitive = (option) => option.value === null || typeof option.value !== 'object';
  const among = (options, item) => options.some((option) => option.value === item);
  if (property.type === 'array') {
    const options = choices(property.items || {});
    if (!options || !options.every(primitive)) return null;
    return !present || (Array.isArray(value) && value.every((item) => among(options, item))) ? prefilled : null;
  }
  const options = choices(property);
  if (options) return options.every(primitive) && (!present || among(options, value)) ? prefilled : null;
  if (!PRIMITIVE.has(property.type)) return null;
  if (present && typeof value !== PRIMITIVE.get(property.type)) return null;
  return present && property.type === 'integer' && !Number.isInteger(value) ? null : prefilled;
}

/** The JSON object of the arguments no field shows, as a field named `name`, pre-filled with `members`. */
function restField(id, name, members) {
  const value = readJson(`{${members.map(({ key, text }) => `${JSON.stringify(key)}:${text}`).join(',')}}`);
  const description = 'A JSON object of the arguments the fields above do not show: nested objects, lists, and ' +
    'whatever the tool’s schema does not describe. Invisible and direction-changing characters are written as ' +
    '\\u escapes.';
  const rest = field(`${id}-rest`, name, { type: 'object', title: 'Other arguments (JSON)', description }, false);
  const area = rest.element.querySelector('textarea');
  area.value = editableJson(value);
  area.rows = Math.min(12, Math.max(3, area.value.split('\n').length));
  area.spellcheck = false;
  area.setAttribute('dir', 'ltr');
  area.classList.add('code');
  return { ...rest, area, members };
}

/**
 * The edited arguments as JSON text (`{text, local}`), or in `local` the problems to show beside the fields: the
 * members in their first order, then those added; each untouched one as it was written.
 */
function collect(fields, rest, touched, original, members) {
  const local = [];
  const problem = (name, message) => local.push({ path: `/${pointer(name)}`, message });
  const byName = new Map(fields.map((f) => [f.name, f]));
  const fieldText = (f) => {
    if (!touched.has(f.name)) return original.get(f.name);
    const read = f.read();
    if (read.error) return problem(f.name, read.error);
    if (!read.present) return undefined;
    const typed = f.element.querySelector('input[type="number"]');
    return typed && JSON_NUMBER.test(typed.value) ? typed.value : JSON.stringify(read.value);
  };
  let others = new Map(rest.members.map(({ key, text }) => [key, text]));
  if (touched.has(rest.name)) {
    try {
      const value = readJson(rest.area.value);
      if (value === null || typeof value !== 'object' || Array.isArray(value)) problem(rest.name, 'is not a JSON object');
      else others = new Map(membersAsWritten(value).map(({ key, text }) => [key, text]));
    } catch (error) {
      problem(rest.name, `is not JSON: ${error.message}`);
    }
    for (const key of others.keys()) {
      if (byName.has(key)) problem(rest.name, `${JSON.stringify(key)} has a field of its own above`);
    }
  }
  const texts = new Map();
  for (const { key } of members) {
    const text = byName.has(key) ? fieldText(byName.get(key)) : others.get(key);
    if (text !== undefined) texts.set(key, text);
  }
  for (const f of fields.filter((f) => !original.has(f.name))) {
    const text = fieldText(f);
    if (text !== undefined) texts.set(f.name, text);
  }
  for (const [key, text] of others) if (!texts.has(key) && !byName.has(key)) texts.set(key, text);
  const text = `{${[...texts].map(([key, member]) => `${JSON.stringify(key)}:${member}`).join(',')}}`;
  return { text, local };
}

/** A violation at `/arguments/…` placed at the field of its property, or at the JSON object's with its path. */
function placed(error, named, restName) {
  const path = String(error.path || '');
  if (!path.startsWith('/arguments/')) return error;
  const inner = path.slice('/arguments'.length);
  const name = inner.split('/')[1].replace(/~1/g, '/').replace(/~0/g, '~');
  if (named.has(name)) return { ...error, path: inner };
  return { path: `/${pointer(restName)}`, message: `${inner}: ${error.message}` };
}

/** The changes, each with its path and values as `shownJson` shows them. */
function changeList(id, changes, warnings) {
  const value = (nodes, label) => h('div', { class: 'value' }, h('span', { class: 'label', text: label }), h('pre', { dir: 'ltr' }, nodes));
  const items = changes.map((change) =>
    h(
      'li',
      { class: `change ${change.op}`, 'data-op': change.op, 'data-path': change.path },
      h('p', { class: 'what' }, h('strong', { text: OPS[change.op] }), ' ', h('code', { dir: 'ltr' }, shownJson(change.path).nodes)),
      h(
        'div',
        { class: 'values' },
        change.before && value(change.before, 'Was'),
        change.before && change.after && h('span', { class: 'arrow', 'aria-hidden': 'true', text: '→' }),
        change.after && value(change.after, change.before ? 'Now' : 'Value'),
      ),
    ),
  );
  const count = changes.length === 1 ? '1 change' : `${changes.length} changes`;
  return h(
    'section',
    { class: 'changes', 'aria-labelledby': id },
    h('h4', { id, tabindex: -1, text: `Review: ${count} to the arguments` }),
    h('ol', {}, items),
    warnings.map((text) => h('p', { class: 'warning', text })),
  );
}
