// Signing in to the inbox at the gateway's OpenID provider: the authorization-code flow with PKCE (RFC 7636), as
// a public client that holds no secret. What it keeps (the attempt in flight, a refresh token) stays in this
// tab's session storage, as the access token does.

/** The attempt at the provider, while the browser is there: `{state, verifier}`. */
const ATTEMPT_KEY = 'toolnexus-gateway.sign-in';
/** The refresh token the provider gave, if it gave one. */
const REFRESH_KEY = 'toolnexus-gateway.refresh';

/**
 * The provider the gateway has the inbox sign in at (`GET /ui/sign-in.json`: `issuer`, `clientId`, `scope`,
 * `authorizationEndpoint`, `tokenEndpoint`), or null when it names none (`204`).
 */
export async function provider() {
  try {
    const response = await fetch('sign-in.json', { cache: 'no-store', signal: AbortSignal.timeout(10_000) });
    return response.status === 200 ? await response.json() : null;
  } catch {
    return null;
  }
}

/** Sends the browser to the provider's sign-in, to come back to this page with a code. */
export async function begin(provider) {
  forget();
  const verifier = base64url(crypto.getRandomValues(new Uint8Array(32)));
  const state = base64url(crypto.getRandomValues(new Uint8Array(16)));
  const digest = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(verifier));
  sessionStorage.setItem(ATTEMPT_KEY, JSON.stringify({ state, verifier }));
  const url = new URL(provider.authorizationEndpoint);
  url.search = new URLSearchParams({
    response_type: 'code',
    client_id: provider.clientId,
    redirect_uri: redirectUri(),
    scope: provider.scope,
    state,
    code_challenge: base64url(new Uint8Array(digest)),
    code_challenge_method: 'S256',
  });
  location.assign(url);
}

/**
 * Back from the provider, trades its code for tokens and returns the access token; null when this page load is
 * no return from it. Throws, saying why, when the provider refused or the return is not this tab's attempt.
 */
export async function complete(provider) {
  const params = new URLSearchParams(location.search);
  if (!params.has('code') && !params.has('error')) return null;
  // The code leaves the address bar and the history at once.
  history.replaceState(null, '', location.pathname);
  const attempt = JSON.parse(sessionStorage.getItem(ATTEMPT_KEY) || 'null');
  sessionStorage.removeItem(ATTEMPT_KEY);
  // Only a return for this tab's own attempt is heard, refusal included: a link cannot sign anyone out or in.
  if (!attempt || attempt.state !== params.get('state')) return null;
  if (params.has('error')) throw new Error(params.get('error_description') || params.get('error'));
  forget();
  return tokens(provider, {
    grant_type: 'authorization_code',
    code: params.get('code'),
    redirect_uri: redirectUri(),
    client_id: provider.clientId,
    code_verifier: attempt.verifier,
  });
}

/** The refresh in flight, which every call that met a `401` meanwhile waits for rather than starting another. */
let refreshing = null;

/**
 * A new access token for the refresh token the provider gave; null without one, or when it is refused. Calls
 * that ask while a refresh runs share it: a provider that rotates refresh tokens sees each one used once.
 */
export function refresh(provider) {
  refreshing ??= (async () => {
    const token = sessionStorage.getItem(REFRESH_KEY);
    if (!token) return null;
    try {
      return await tokens(provider, { grant_type: 'refresh_token', refresh_token: token, client_id: provider.clientId });
    } catch {
      if (sessionStorage.getItem(REFRESH_KEY) === token) sessionStorage.removeItem(REFRESH_KEY);
      return null;
    }
  })().finally(() => {
    refreshing = null;
  });
  return refreshing;
}

/** Forgets the refresh token, at sign-out. */
export function forget() {
  sessionStorage.removeItem(REFRESH_KEY);
}

async function tokens(provider, form) {
  const response = await fetch(provider.tokenEndpoint, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
    body: new URLSearchParams(form),
  });
  const body = await response.json().catch(() => ({}));
  if (!response.ok || typeof body.access_token !== 'string') {
    throw new Error(body.error_description || body.error || `the provider answered ${response.status}`);
  }
  if (typeof body.refresh_token === 'string') sessionStorage.setItem(REFRESH_KEY, body.refresh_token);
  return body.access_token;
}

/** This page's address, where the provider sends the browser back. */
function redirectUri() {
  return new URL('./', document.baseURI).href;
}

function base64url(bytes) {
  return btoa(String.fromCharCode(...bytes)).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
