// How the inbox shows what an upstream server sent: each piece of text isolated in a direction of its own, the
// characters that hide or reorder text made visible, an address as the browser's own URL parser reads it, and
// JSON as it was written (every number with all its digits), read by a JSON reader of its own.

/** Builds an element: `h('p', {class: 'x'}, 'text', child)`; children may be arrays, nested as deep as need be. */
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === undefined || value === null) continue;
    if (name === 'text') element.textContent = value;
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) element.append(child);
  }
  return element;
}

/** Invisible characters, and those that change the direction of text, by code point. */
const NAMES = new Map([
  [0x0085, 'NEXT LINE'],
  [0x00ad, 'SOFT HYPHEN'],
  [0x034f, 'COMBINING GRAPHEME JOINER'],
  [0x061c, 'ARABIC LETTER MARK'],
  [0x115f, 'HANGUL CHOSEONG FILLER'],
  [0x1160, 'HANGUL JUNGSEONG FILLER'],
  [0x17b4, 'KHMER VOWEL INHERENT AQ'],
  [0x17b5, 'KHMER VOWEL INHERENT AA'],
  [0x180e, 'MONGOLIAN VOWEL SEPARATOR'],
  [0x200b, 'ZERO WIDTH SPACE'],
  [0x200c, 'ZERO WIDTH NON-JOINER'],
  [0x200d, 'ZERO WIDTH JOINER'],
  [0x200e, 'LEFT-TO-RIGHT MARK'],
  [0x200f, 'RIGHT-TO-LEFT MARK'],
  [0x2028, 'LINE SEPARATOR'],
  [0x2029, 'PARAGRAPH SEPARATOR'],
  [0x202a, 'LEFT-TO-RIGHT EMBEDDING'],
  [0x202b, 'RIGHT-TO-LEFT EMBEDDING'],
  [0x202c, 'POP DIRECTIONAL FORMATTING'],
  [0x202d, 'LEFT-TO-RIGHT OVERRIDE'],
  [0x202e, 'RIGHT-TO-LEFT OVERRIDE'],
  [0x2060, 'WORD JOINER'],
  [0x2061, 'FUNCTION APPLICATION'],
  [0x2062, 'INVISIBLE TIMES'],
  [0x2063, 'INVISIBLE SEPARATOR'],
  [0x2064, 'INVISIBLE PLUS'],
  [0x2066, 'LEFT-TO-RIGHT ISOLATE'],
  [0x2067, 'RIGHT-TO-LEFT ISOLATE'],
  [0x2068, 'FIRST STRONG ISOLATE'],
  [0x2069, 'POP DIRECTIONAL ISOLATE'],
  [0x206a, 'INHIBIT SYMMETRIC SWAPPING'],
  [0x206b, 'ACTIVATE SYMMETRIC SWAPPING'],
  [0x206c, 'INHIBIT ARABIC FORM SHAPING'],
  [0x206d, 'ACTIVATE ARABIC FORM SHAPING'],
  [0x206e, 'NATIONAL DIGIT SHAPES'],
  [0x206f, 'NOMINAL DIGIT SHAPES'],
  [0x3164, 'HANGUL FILLER'],
  [0xfeff, 'ZERO WIDTH NO-BREAK SPACE'],
  [0xffa0, 'HALFWIDTH HANGUL FILLER'],
]);

/**
 * What may not hide in an approval's arguments or an address: controls, the line and paragraph separators, and
 * what Unicode calls default-ignorable (invisible: zero-width spaces and joiners, marks, fillers, variation
 * selectors, tags) or a bidi control (it changes the direction of text). Every character of `NAMES` is one.
 */
const INVISIBLE = String.raw`\p{Cc}\p{Default_Ignorable_Code_Point}\p{Bidi_Control}\u2028\u2029`;
const HIDDEN = new RegExp(`([${INVISIBLE}])`, 'u');

/** An address may not hide spaces either. */
const HIDDEN_IN_URL = new RegExp(`([${INVISIBLE} ])`, 'u');

/**
 * What other text may not hide: the embeddings, overrides and isolates, which reorder the text after them.
 * Joiners and marks stay, as some scripts and emoji need them, and isolation keeps their effect inside the text.
 */
const REORDERING = /([\u202a-\u202e\u2066-\u2069])/u;

/** `U+202E`: how a code point is written. */
function codePoint(char) {
  return `U+${char.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}`;
}

/** `RIGHT-TO-LEFT OVERRIDE`: what a hidden character is called in a tooltip or a warning. */
function charName(char) {
  const code = char.codePointAt(0);
  if (NAMES.has(code)) return NAMES.get(code);
  if (code === 0x20) return 'SPACE';
  if (/\p{Cc}/u.test(char)) return 'CONTROL CHARACTER';
  if (code >= 0xfe00 && code <= 0xfe0f) return `VARIATION SELECTOR-${code - 0xfe00 + 1}`;
  if (code >= 0xe0100 && code <= 0xe01ef) return `VARIATION SELECTOR-${code - 0xe0100 + 17}`;
  if (code >= 0xe0000 && code <= 0xe007f) return 'TAG CHARACTER';
  return 'INVISIBLE CHARACTER';
}

/** `U+202E RIGHT-TO-LEFT OVERRIDE, U+200B ZERO WIDTH SPACE`: hidden characters, named for a warning. */
function named(chars) {
  return chars.map((char) => `${codePoint(char)} ${charName(char)}`).join(', ');
}

/**
 * `text` as nodes, each character `hidden` (a pattern with one capturing group) matches shown as `⟨U+XXXX⟩`,
 * with its name as a tooltip.
 */
function revealed(text, hidden) {
  return text.split(hidden).map((part, i) => {
    if (i % 2 === 0) return part;
    return h('span', { class: 'escape', title: `${codePoint(part)} ${charName(part)}`, text: `⟨${codePoint(part)}⟩` });
  });
}

/** Text from a server, isolated so its direction neither leaks out nor takes in the page around it. */
export function isolated(text) {
  return h('bdi', {}, revealed(String(text), REORDERING));
}

/** The same, for where only a string fits (an <option>): reordering characters written as `⟨U+XXXX⟩`. */
export function revealedText(text) {
  return String(text).replace(new RegExp(REORDERING.source, 'gu'), (char) => `⟨${codePoint(char)}⟩`);
}

/**
 * An address to show and perhaps link to: `{shown, sent, href, warnings}`. `shown` are the nodes of the URL
 * the browser parses from it (what a link opens), its host in a <mark>; `sent` the nodes of the text as the
 * server sent it, only when it differs; `href` what to link to, null when it is not a web address.
 */
export function address(url) {
  const hidden = [...new Set(url.split(HIDDEN_IN_URL).filter((_, i) => i % 2))];
  const warnings = hidden.length
    ? [
        'The address contains characters that are invisible, blank or change the direction of text: ' +
          `${named(hidden)}. ` +
          'They can make it look like another address; they are shown as ⟨U+…⟩, and the highlighted host ' +
          'is the one the browser reads.',
      ]
    : [];
  let parsed;
  try {
    parsed = new URL(url);
  } catch {
    warnings.unshift('This address cannot be parsed; do not open it unless you know where it leads.');
    return { shown: revealed(url, HIDDEN_IN_URL), sent: null, href: null, warnings };
  }
  if (parsed.hostname.split('.').some((label) => label.startsWith('xn--'))) {
    warnings.push(`The host is punycode (${parsed.hostname}): it may imitate a familiar name with look-alike letters.`);
  }
  if (parsed.username || parsed.password) {
    warnings.push('The address has a user name before the host: the real host is the highlighted one.');
  }
  if (parsed.protocol === 'http:') warnings.push('The address is not encrypted (http, not https).');
  const web = parsed.protocol === 'https:' || parsed.protocol === 'http:';
  return {
    shown: hostMarked(parsed),
    sent: url === parsed.href ? null : revealed(url, HIDDEN_IN_URL),
    href: web ? parsed.href : null,
    warnings,
  };
}

/** The parsed URL as text nodes, with the host the parser found in a <mark>. */
function hostMarked(parsed) {
  const { href, hostname, username, password } = parsed;
  const userinfo = username || password ? `${username}${password ? `:${password}` : ''}@` : '';
  const before = `${parsed.protocol}//${userinfo}`;
  if (!hostname || !href.startsWith(before + hostname)) return [h('span', {}, revealed(href, HIDDEN_IN_URL))];
  return [
    h('span', {}, revealed(before, HIDDEN_IN_URL)),
    h('mark', { class: 'host' }, revealed(hostname, HIDDEN_IN_URL)),
    h('span', {}, revealed(href.slice(before.length + hostname.length), HIDDEN_IN_URL)),
  ];
}

// ---- JSON as written ------------------------------------------------------------------------------------

/**
 * How each object and array `readJson` built was written: `{value, members: [{key, node}]}` or
 * `{value, items: [node]}`, where a key's node and any other value's is `{value, source}`, `source` its JSON text.
 */
const WRITTEN = new WeakMap();

/**
 * Reads JSON text into the values `JSON.parse` gives, and remembers how each object and array in it was written
 * (`shownJson` and `canonicalJson` read that back): the literal text of every number, so an integer past 2^53
 * is not rounded where it is shown, and every member in its order, repeated keys included. Throws a
 * `SyntaxError` where `JSON.parse` would.
 */
export function readJson(text) {
  return parse(String(text)).value;
}

/** The JSON grammar of a number (RFC 8259), matched where the reader stands. */
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const LITERAL = /true|false|null/y;

/** `{value, source}` or, for an object or array, `{value, members}` / `{value, items}`, its value in `WRITTEN`. */
function parse(text) {
  let at = 0;
  const fail = (what) => {
    throw new SyntaxError(`${what} at position ${at} of the JSON text`);
  };
  const space = () => {
    while (at < text.length && ' \t\n\r'.includes(text[at])) at += 1;
  };
  const expect = (char) => {
    space();
    if (text[at] !== char) fail(`Expected '${char}'`);
    at += 1;
  };
  const token = (pattern) => {
    pattern.lastIndex = at;
    const match = pattern.exec(text);
    if (!match) return null;
    at = pattern.lastIndex;
    return match[0];
  };
  // A string is scanned to its closing quote here, and decoded (its escapes checked) by JSON.parse.
  const string = () => {
    const start = at;
    at += 1;
    for (;;) {
      const code = text.charCodeAt(at);
      if (Number.isNaN(code) || code < 0x20) fail('Unterminated string');
      at += code === 0x5c ? 2 : 1;
      if (code === 0x22) break;
    }
    const source = text.slice(start, at);
    return { value: JSON.parse(source), source };
  };
  const node = () => {
    space();
    const char = text[at];
    if (char === '"') return string();
    if (char === '{' || char === '[') return container(char);
    const source = token(NUMBER) ?? token(LITERAL) ?? fail('Unexpected character');
    return { value: JSON.parse(source), source };
  };
  const container = (open) => {
    at += 1;
    const close = open === '{' ? '}' : ']';
    const written = open === '{' ? { value: {}, members: [] } : { value: [], items: [] };
    space();
    if (text[at] === close) at += 1;
    else {
      for (;;) {
        if (written.members) {
          space();
          if (text[at] !== '"') fail('Expected a key');
          const key = string();
          expect(':');
          const member = node();
          // As JSON.parse: an own property even for `__proto__`, the last of repeated keys its value.
          const property = { value: member.value, enumerable: true, writable: true, configurable: true };
          Object.defineProperty(written.value, key.value, property);
          written.members.push({ key, node: member });
        } else {
          const item = node();
          written.value.push(item.value);
          written.items.push(item);
        }
        space();
        if (text[at] === close) {
          at += 1;
          break;
        }
        expect(',');
      }
    }
    WRITTEN.set(written.value, written);
    return written;
  };
  const top = node();
  space();
  if (at < text.length) fail('Unexpected text after the JSON value');
  return top;
}

/** How `value` was written, when `readJson` read it; otherwise as `JSON.stringify` writes it. */
function written(value) {
  return (value !== null && WRITTEN.get(value)) || parse(JSON.stringify(value) ?? 'null');
}

/**
 * JSON to show, as `{nodes, warnings}`: indented two spaces, each key and string in a left-to-right <bdi> of its
 * own, written as the JSON text writes it, every character of `HIDDEN` in it shown as `⟨U+XXXX⟩` and named in a
 * warning; each number as its literal text. `value` comes from `readJson`.
 */
export function shownJson(value) {
  const hidden = new Set();
  const nodes = [];
  layOut(written(value), '', nodes, hidden);
  return { nodes, warnings: hiddenWarnings(hidden) };
}

/** The warning about the characters `shownJson` found hidden in JSON, if any. */
function hiddenWarnings(hidden) {
  return hidden.size
    ? [
        'There are characters in this JSON that are invisible or change the direction of text: ' +
          `${named([...hidden])}. Each is shown as ⟨U+…⟩ where it stands, and is sent as it is: ` +
          'they can make a key or a value read as another.',
      ]
    : [];
}

function layOut(node, indent, out, hidden) {
  if (node.members || node.items) {
    const [open, close, entries] = node.members ? ['{', '}', node.members] : ['[', ']', node.items];
    if (!entries.length) return out.push(open + close);
    out.push(open);
    const inner = `${indent}  `;
    entries.forEach((entry, i) => {
      out.push(`${i ? ',' : ''}\n${inner}`);
      if (node.members) out.push(jsonString(entry.key, hidden), ': ');
      layOut(node.members ? entry.node : entry, inner, out, hidden);
    });
    return out.push(`\n${indent}${close}`);
  }
  return out.push(typeof node.value === 'string' ? jsonString(node, hidden) : node.source);
}

function jsonString({ source }, hidden) {
  for (const [i, char] of source.split(HIDDEN).entries()) if (i % 2) hidden.add(char);
  return h('bdi', { dir: 'ltr' }, revealed(source, HIDDEN));
}

// ---- JSON to edit ---------------------------------------------------------------------------------------

/**
 * The members of an object `readJson` read, in order, each `{key, text}`: its key, and its value's JSON text as
 * written, without whitespace (every number with all its digits). A repeated key is listed once, where it first
 * stands, with the value it has last (as `JSON.parse` reads it).
 */
export function membersAsWritten(value) {
  const members = new Map();
  for (const { key, node } of written(value).members || []) members.set(key.value, compact(node));
  return [...members].map(([key, text]) => ({ key, text }));
}

function compact(node) {
  if (node.members) return `{${node.members.map(({ key, node: member }) => `${key.source}:${compact(member)}`).join(',')}}`;
  if (node.items) return `[${node.items.map(compact).join(',')}]`;
  return node.source;
}

/**
 * `value` (from `readJson`) as JSON text to edit in a text box: indented two spaces, as written, but with each
 * character of `HIDDEN` in a key or string written as a `\u` escape, so that what hides or reorders text shows
 * there too. The text reads back as the same value.
 */
export function editableJson(value) {
  return editable(written(value), '');
}

const HIDDEN_EVERYWHERE = new RegExp(`[${INVISIBLE}]`, 'gu');

function editable(node, indent) {
  if (node.members || node.items) {
    const [open, close, entries] = node.members ? ['{', '}', node.members] : ['[', ']', node.items];
    if (!entries.length) return open + close;
    const inner = `${indent}  `;
    const lines = entries.map((entry) =>
      node.members ? `${inner}${escaped(entry.key.source)}: ${editable(entry.node, inner)}` : `${inner}${editable(entry, inner)}`,
    );
    return `${open}\n${lines.join(',\n')}\n${indent}${close}`;
  }
  return typeof node.value === 'string' ? escaped(node.source) : node.source;
}

/** A JSON string's text with each hidden character written as `\uXXXX` (each UTF-16 unit of it). */
function escaped(source) {
  const unit = (char, i) => `\\u${char.charCodeAt(i).toString(16).padStart(4, '0')}`;
  return source.replace(HIDDEN_EVERYWHERE, (char) => Array.from({ length: char.length }, (_, i) => unit(char, i)).join(''));
}

/** Whether `text` has a character that is invisible or changes the direction of text. */
export function hidesCharacters(text) {
  return HIDDEN.test(String(text));
}

/**
 * What changed from `before` to `after` (objects `readJson` read), as `{changes, warnings}`. Each change is
 * `{op, path, before, after}`: `op` is `add`, `remove` or `replace`, `path` a JSON Pointer, and `before` and
 * `after` the values as `shownJson` shows them (absent on the side that has none). Objects are compared member by
 * member, anything else whole, and as written: `1.0` is not `1`.
 */
export function jsonChanges(before, after) {
  const hidden = new Set();
  const changes = [];
  const show = (node) => {
    const nodes = [];
    layOut(node, '', nodes, hidden);
    return nodes;
  };
  const walk = (from, to, path) => {
    if (from.members && to.members) {
      const was = lastOfEach(from.members);
      const now = lastOfEach(to.members);
      const at = (key) => `${path}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`;
      for (const [key, node] of was) {
        if (now.has(key)) walk(node, now.get(key), at(key));
        else changes.push({ op: 'remove', path: at(key), before: show(node) });
      }
      for (const [key, node] of now) if (!was.has(key)) changes.push({ op: 'add', path: at(key), after: show(node) });
    } else if (canonical(from) !== canonical(to)) {
      changes.push({ op: 'replace', path, before: show(from), after: show(to) });
    }
  };
  walk(written(before), written(after), '');
  return { changes, warnings: hiddenWarnings(hidden) };
}

/** An object's members by key, in order, each key once with the value it has last. */
function lastOfEach(members) {
  const each = new Map();
  for (const { key, node } of members) each.set(key.value, node);
  return each;
}

/**
 * The canonical JSON of `value` that an approval's digest covers, as the gateway writes it
 * (`approvals::canonical_json`): every object's keys sorted by code point (the order of their UTF-8 bytes), no
 * whitespace, strings escaped as serde_json escapes them, numbers as written. `value` comes from `readJson`.
 */
export function canonicalJson(value) {
  return canonical(written(value));
}

function canonical(node) {
  if (node.members) {
    const members = [...node.members].sort((a, b) => byCodePoint(a.key.value, b.key.value));
    return `{${members.map(({ key, node: member }) => `${serdeString(key.value)}:${canonical(member)}`).join(',')}}`;
  }
  if (node.items) return `[${node.items.map(canonical).join(',')}]`;
  return typeof node.value === 'string' ? serdeString(node.value) : node.source;
}

function byCodePoint(a, b) {
  const x = Array.from(a, (char) => char.codePointAt(0));
  const y = Array.from(b, (char) => char.codePointAt(0));
  for (let i = 0; i < Math.min(x.length, y.length); i += 1) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
}

/** The escapes serde_json writes; any other control character is `\u00xx`, lowercase. */
const ESCAPES = { '"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function serdeString(text) {
  const escape = (char) => ESCAPES[char] || `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`;
  return `"${text.replace(/["\\\u0000-\u001f]/g, escape)}"`;
}

/** The lowercase hex SHA-256 of `text` in UTF-8; null where the browser has none (outside https and localhost). */
export async function sha256(text) {
  if (!globalThis.crypto || !crypto.subtle) return null;
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (byte) => byte.toString(16).padStart(2, '0')).join('');
}
