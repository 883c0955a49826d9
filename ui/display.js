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
 * What an address may not hide: controls, spaces, the line and paragraph separators, and what Unicode calls
 * default-ignorable (invisible: zero-width spaces and joiners, marks, fillers, variation selectors, tags) or a
 * bidi control (it changes the direction of text). Every character of `NAMES` is one.
 */
const HIDDEN_IN_URL = /([\p{Cc}\p{Default_Ignorable_Code_Point}\p{Bidi_Control}\u2028\u2029 ])/u;

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
