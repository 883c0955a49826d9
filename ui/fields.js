// The fields of the inbox's forms, each generated from a JSON Schema property, and how the problems of an answer
// are shown beside them. Each piece of a server's text is shown as display.js says.

import { h, isolated, revealedText } from './display.js';

const RADIO_LIMIT = 5;

// ---- problems -------------------------------------------------------------------------------------------

/** Shows `text` in a form's problem line. */
export function showProblem(problem, text) {
  problem.textContent = text;
  problem.hidden = false;
}

/** Clears a form's problem line and its fields' errors. */
export function clearErrors(fields, problem) {
  problem.hidden = true;
  problem.textContent = '';
  for (const f of fields) f.setError(null);
}

/**
 * Shows violations (`[{path, message}]`, `path` a JSON Pointer) beside the fields their first segment names, and
 * the rest, with a summary, in the problem line; focuses the first marked field.
 */
export function showErrors(errors, fields, problem) {
  const unplaced = [];
  const byName = new Map(fields.map((f) => [f.name, f]));
  const messages = new Map();
  for (const error of errors) {
    const name = unpointer(String(error.path || '').split('/')[1] || '');
    if (byName.has(name)) messages.set(name, [...(messages.get(name) || []), error.message]);
    else unplaced.push(error.message);
  }
  for (const [name, list] of messages) byName.get(name).setError(list.join('; '));
  const count = messages.size;
  const summary = count ? [`Please correct ${count === 1 ? 'the marked field' : `the ${count} marked fields`}.`] : [];
  showProblem(problem, [...summary, ...unplaced].join(' '));
  const first = fields.find((f) => messages.has(f.name));
  if (first) first.focus();
}

/** A name as one segment of a JSON Pointer, and back. */
export const pointer = (name) => name.replace(/~/g, '~0').replace(/\//g, '~1');
const unpointer = (segment) => segment.replace(/~1/g, '/').replace(/~0/g, '~');

// ---- form fields ----------------------------------------------------------------------------------------

/** Options of an enum-like schema: `enum` (+ legacy `enumNames`) or titled `oneOf`/`anyOf` consts. */
export function choices(schema) {
  if (Array.isArray(schema.enum)) {
    const names = Array.isArray(schema.enumNames) ? schema.enumNames : [];
    return schema.enum.map((value, i) => ({ value, label: String(names[i] ?? value) }));
  }
  const titled = schema.oneOf || schema.anyOf;
  if (Array.isArray(titled) && titled.every((option) => option && 'const' in option)) {
    return titled.map((option) => ({ value: option.const, label: String(option.title ?? option.const) }));
  }
  return null;
}

/** What the page says about a schema's limits (its description, a server's text, is shown apart). */
function hints(schema) {
  const parts = [];
  const formats = { email: 'An email address.', uri: 'A web address (URI).', date: 'A date.', 'date-time': 'A date and time.' };
  if (formats[schema.format]) parts.push(formats[schema.format]);
  const { minLength: min, maxLength: max } = schema;
  if (min !== undefined && max !== undefined) parts.push(`${min} to ${max} characters.`);
  else if (min !== undefined) parts.push(`At least ${min} character${min === 1 ? '' : 's'}.`);
  else if (max !== undefined) parts.push(`At most ${max} characters.`);
  const { minimum: lo, maximum: hi } = schema;
  if (lo !== undefined && hi !== undefined) parts.push(`From ${lo} to ${hi}.`);
  else if (lo !== undefined) parts.push(`At least ${lo}.`);
  else if (hi !== undefined) parts.push(`At most ${hi}.`);
  if (schema.type === 'integer') parts.push('A whole number.');
  const { minItems: fewest, maxItems: most } = schema;
  if (fewest !== undefined && most !== undefined) parts.push(`Pick ${fewest} to ${most}.`);
  else if (fewest !== undefined) parts.push(`Pick at least ${fewest}.`);
  else if (most !== undefined) parts.push(`Pick at most ${most}.`);
  return parts.join(' ');
}

/** One form field for one schema property: `{name, element, read(), setError(text), focus()}`. */
export function field(id, name, schema, required) {
  const label = schema.title || name;
  const marker = required ? h('span', { class: 'required', text: ' (required)' }) : null;
  const hintText = hints(schema);
  const description = schema.description ? [isolated(schema.description), hintText && ' '] : null;
  const hint = description || hintText ? h('p', { class: 'hint', id: `${id}-hint` }, description, hintText) : null;
  const error = h('p', { class: 'error', id: `${id}-error`, hidden: true });
  const options = schema.type === 'array' ? choices(schema.items || {}) : choices(schema);
  let control;
  if (schema.type === 'array' && options) control = checkboxes(id, schema, options, required);
  else if (options) control = single(id, schema, options, required);
  else if (schema.type === 'boolean') control = checkbox(id, schema);
  else control = input(id, schema, required);

  const describedBy = [hint && hint.id].filter(Boolean);
  const setDescribed = (invalid) => {
    const ids = invalid ? [...describedBy, error.id] : describedBy;
    for (const element of control.inputs) {
      if (ids.length) element.setAttribute('aria-describedby', ids.join(' '));
      else element.removeAttribute('aria-describedby');
      if (invalid) element.setAttribute('aria-invalid', 'true');
      else element.removeAttribute('aria-invalid');
    }
  };
  setDescribed(false);

  let element;
  if (control.group) {
    element = h(
      'fieldset',
      { class: 'field group', 'data-field': name },
      h('legend', {}, isolated(label), marker),
      hint,
      error,
      control.element,
    );
  } else if (schema.type === 'boolean' && !options) {
    element = h(
      'div',
      { class: 'field check', 'data-field': name },
      h('label', { for: id }, control.element, h('span', {}, isolated(label), marker)),
      hint,
      error,
    );
  } else {
    element = h(
      'div',
      { class: 'field', 'data-field': name },
      h('label', { for: id }, isolated(label), marker),
      hint,
      control.element,
      error,
    );
  }
  return {
    name,
    element,
    read: control.read,
    focus: () => control.inputs[0].focus(),
    setError(text) {
      error.textContent = text || '';
      error.hidden = !text;
      element.classList.toggle('invalid', Boolean(text));
      setDescribed(Boolean(text));
    },
  };
}

function input(id, schema, required) {
  const type = schema.type;
  const numeric = type === 'number' || type === 'integer';
  const known = numeric || type === 'string' || type === undefined;
  const attrs = { id, name: id, required, autocomplete: 'off' };
  if (numeric) {
    Object.assign(attrs, {
      type: 'number',
      step: type === 'integer' ? 1 : 'any',
      inputmode: type === 'integer' ? 'numeric' : 'decimal',
      min: schema.minimum,
      max: schema.maximum,
    });
  } else if (known) {
    const types = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' };
    Object.assign(attrs, {
      type: types[schema.format] || 'text',
      minlength: schema.minLength,
      maxlength: schema.maxLength,
      step: schema.format === 'date-time' ? 1 : undefined,
    });
  }
  const element = known ? h('input', attrs) : h('textarea', { ...attrs, rows: 3 });
  if (schema.default !== undefined) {
    element.value = schema.format === 'date-time' ? toLocalInput(schema.default) : known
      ? String(schema.default)
      : JSON.stringify(schema.default);
  }
  const read = () => {
    const text = element.value;
    if (numeric && element.validity.badInput) return { error: 'is not a number' };
    if (text === '') return { present: false };
    if (numeric) return { present: true, value: Number(text) };
    if (schema.format === 'date-time') {
      const value = toRfc3339(text);
      return value ? { present: true, value } : { error: 'is not a date and time' };
    }
    if (known) return { present: true, value: text };
    try {
      return { present: true, value: JSON.parse(text) };
    } catch {
      return { present: true, value: text };
    }
  };
  return { element, inputs: [element], read };
}

function checkbox(id, schema) {
  const element = h('input', { type: 'checkbox', id, name: id });
  element.checked = schema.default === true;
  return { element, inputs: [element], read: () => ({ present: true, value: element.checked }) };
}

/** A single choice: radios for a few options (with "No answer" when optional), a select for more. */
function single(id, schema, options, required) {
  const hasDefault = options.some((option) => option.value === schema.default);
  if (options.length > RADIO_LIMIT) {
    const select = h('select', { id, name: id, required });
    if (!required || !hasDefault) select.append(h('option', { value: '', text: required ? 'Choose…' : 'No answer' }));
    options.forEach((option, i) => {
      const text = revealedText(option.label);
      select.append(h('option', { value: String(i), dir: 'auto', text, selected: option.value === schema.default }));
    });
    const read = () => (select.value === '' ? { present: false } : { present: true, value: options[Number(select.value)].value });
    return { element: select, inputs: [select], read };
  }
  const all = required ? options : [...options, { value: undefined, label: 'No answer' }];
  const radios = all.map((option, i) => {
    const radio = h('input', { type: 'radio', id: `${id}-${i}`, name: id, value: String(i), required });
    radio.checked = hasDefault ? option.value === schema.default : !required && option.value === undefined;
    return radio;
  });
  const element = h(
    'div',
    { class: 'options', role: 'radiogroup' },
    all.map((option, i) => h('label', { for: radios[i].id, class: 'option' }, radios[i], h('span', {}, isolated(option.label)))),
  );
  const read = () => {
    const checked = radios.findIndex((radio) => radio.checked);
    if (checked < 0 || all[checked].value === undefined) return { present: false };
    return { present: true, value: all[checked].value };
  };
  return { element, inputs: radios, read, group: true };
}

/** A multi-select: a checkbox per option, sent as an array of the chosen values. */
function checkboxes(id, schema, options, required) {
  const chosen = new Set(Array.isArray(schema.default) ? schema.default : []);
  const boxes = options.map((option, i) => {
    const box = h('input', { type: 'checkbox', id: `${id}-${i}`, name: id, value: String(i) });
    box.checked = chosen.has(option.value);
    return box;
  });
  const element = h(
    'div',
    { class: 'options' },
    options.map((option, i) => h('label', { for: boxes[i].id, class: 'option' }, boxes[i], h('span', {}, isolated(option.label)))),
  );
  const read = () => {
    const values = options.filter((_, i) => boxes[i].checked).map((option) => option.value);
    return values.length || required ? { present: true, value: values } : { present: false };
  };
  return { element, inputs: boxes, read, group: true };
}

/** `2025-01-31T09:30:00` (local, from datetime-local) → RFC 3339 with this browser's offset. */
function toRfc3339(local) {
  const date = new Date(local);
  if (Number.isNaN(date.getTime())) return null;
  const offset = -date.getTimezoneOffset();
  const sign = offset >= 0 ? '+' : '-';
  const pad = (n) => String(Math.floor(Math.abs(n))).padStart(2, '0');
  const seconds = local.length === 16 ? `${local}:00` : local.slice(0, 19);
  return `${seconds}${sign}${pad(offset / 60)}:${pad(offset % 60)}`;
}

/** An RFC 3339 instant → the `YYYY-MM-DDTHH:MM:SS` a datetime-local input shows, in local time. */
function toLocalInput(value) {
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return '';
  const pad = (n) => String(n).padStart(2, '0');
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}
