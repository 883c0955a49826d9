// How the inbox shows what an upstream server sent: each piece of text isolated in a direction of its own, the
// characters that hide or reorder text made visible, and an address as the browser's own URL parser reads it.

/** Builds an element: `h('p', {class: 'x'}, 'text', child)`. */
export function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === undefined || value === null) continue;
    if (name === 'text') element.textContent = value;
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) element.append(child);
  }
  return element;
}

/** Invisible characters, and those that change the direction of text, by code point. */
const NAMES = new Map([
  [0x00ad, 'SOFT HYPHEN'],
  [0x061c, 'ARABIC LETTER MARK'],
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
  [0xfeff, 'ZERO WIDTH NO-BREAK SPACE'],
]);

/** What an address may not hide: controls, spaces and every character of `NAMES`. */
const HIDDEN_IN_URL = /([\0-\x20\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff])/u;

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
  return NAMES.get(code) || (code === 0x20 ? 'SPACE' : 'CONTROL CHARACTER');
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
          `${hidden.map((char) => `${codePoint(char)} ${charName(char)}`).join(', ')}. ` +
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
