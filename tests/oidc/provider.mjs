// The identity provider the tests sign in with: panva's oidc-provider (OpenID Certified) on loopback, with the
// test clients, users and groups below.
//
//   node provider.mjs [--port N] --keys FILE
//
// Listens on 127.0.0.1 (port N, or a free one) and prints `issuer http://127.0.0.1:<port>` when it serves.
// FILE holds its private signing keys (JWKS); a missing FILE is made with new RS256, ES256 and EdDSA keys, each
// with its own `kid`, so a second FILE is a key rotation. Agents and services take tokens by the
// client-credentials grant; people sign in through the provider's own login and consent pages. Every access
// token is a JWT for the audience `toolnexus-gateway` carrying `groups`, `preferred_username` and `email`.
//
// Beside the provider, two routes for the tests: `GET /test/jwks-fetches` counts the requests for the signing
// keys, and `POST /test/sign` signs `{header, claims}` with this provider's key for `header.alg`, or with
// `"hmac": "public-key"` as HS256 keyed with the RS256 public key's PEM (a token the gateway must refuse).
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import * as jose from 'jose';
import Provider from 'oidc-provider';

export const AUDIENCE = 'toolnexus-gateway';
// The resource indicator (RFC 8707) a token is asked for when its request names none.
const RESOURCE = 'urn:toolnexus:gateway';

// Services that take tokens by the client-credentials grant (secret: `<id>-secret`), with their groups and the
// algorithm their tokens are signed with.
const SERVICES = {
  'agent-1': { groups: ['agents'] },
  'agent-2': { groups: ['agents'] },
  'agent-es256': { groups: ['agents'], alg: 'ES256' },
  'agent-eddsa': { groups: ['agents'], alg: 'EdDSA' },
  'sre-bot': { groups: ['sre'] },
  'on-call-bot': { groups: ['on-call', 'marketing'] },
  'admin-bot': { groups: ['gateway-admins', 'agents'] },
  'marketing-bot': { groups: ['marketing'] },
  'groupless-bot': { groups: [] },
};

// People, who sign in with their login and any password.
const PEOPLE = {
  alice: { email: 'alice@example.com', groups: ['sre'] },
  bob: { email: 'bob@example.com', groups: ['sre'] },
  carol: { email: 'carol@example.com', groups: ['agents'] },
  // Her email is the name of a gateway token: she must get nothing of that token's.
  mallory: { email: 'lead', groups: ['sre'] },
};

const { values: args } = parseArgs({
  options: { port: { type: 'string', default: '0' }, keys: { type: 'string' } },
});
if (!args.keys) {
  console.error('usage: node provider.mjs [--port N] --keys FILE');
  process.exit(2);
}

async function signingKeys(file) {
  if (existsSync(file)) {
    return JSON.parse(readFileSync(file, 'utf8'));
  }
  const keys = [];
  for (const alg of ['RS256', 'ES256', 'EdDSA']) {
    const { privateKey } = await jose.generateKeyPair(alg, {
      extractable: true,
      ...(alg === 'EdDSA' ? { crv: 'Ed25519' } : {}),
    });
    const jwk = await jose.exportJWK(privateKey);
    keys.push({ ...jwk, alg, use: 'sig', kid: `${alg.toLowerCase()}-${crypto.randomUUID()}` });
  }
  const jwks = { keys };
  writeFileSync(file, JSON.stringify(jwks));
  return jwks;
}

function claimsOf(who) {
  const service = SERVICES[who];
  if (service) {
    return { groups: service.groups, preferred_username: who, email: `${who}@services.example.com` };
  }
  const person = PEOPLE[who];
  return person ? { groups: person.groups, preferred_username: who, email: person.email } : {};
}

const jwks = await signingKeys(args.keys);
const server = createServer();
await new Promise((resolve) => server.listen(Number(args.port), '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const inboxRedirects = (process.env.OIDC_INBOX_REDIRECTS ?? '').split(/\s+/).filter(Boolean);
const provider = new Provider(issuer, {
  clients: [
    ...Object.keys(SERVICES).map((id) => ({
      client_id: id,
      client_secret: `${id}-secret`,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
      token_endpoint_auth_method: 'client_secret_post',
    })),
    {
      client_id: 'toolnexus-inbox',
      token_endpoint_auth_method: 'none',
      application_type: 'web',
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      redirect_uris: inboxRedirects.length ? inboxRedirects : ['http://127.0.0.1/ui/'],
    },
  ],
  jwks,
  findAccount: (ctx, id) =>
    PEOPLE[id] ? { accountId: id, claims: () => ({ sub: id, ...claimsOf(id) }) } : undefined,
  claims: { openid: ['sub'], profile: ['preferred_username', 'groups'], email: ['email'] },
  features: {
    clientCredentials: { enabled: true },
    devInteractions: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => RESOURCE,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resource, client) => ({
        scope: 'openid profile email',
        audience: AUDIENCE,
        accessTokenFormat: 'jwt',
        accessTokenTTL: 600,
        jwt: { sign: { alg: SERVICES[client.clientId]?.alg ?? 'RS256' } },
      }),
    },
  },
  extraTokenClaims: (ctx, token) => claimsOf(token.accountId ?? token.clientId),
  pkce: { required: () => true },
});

let jwksFetches = 0;
const publicRsaPem = async () => {
  const rsa = jwks.keys.find((key) => key.alg === 'RS256');
  const { d, p, q, dp, dq, qi, ...publicJwk } = rsa;
  return jose.exportSPKI(await jose.importJWK(publicJwk, 'RS256'));
};

async function sign({ header, claims, hmac }) {
  if (hmac === 'public-key') {
    const secret = new TextEncoder().encode(await publicRsaPem());
    return new jose.SignJWT(claims).setProtectedHeader({ ...header, alg: 'HS256' }).sign(secret);
  }
  const key = jwks.keys.find((candidate) => candidate.alg === header.alg);
  return new jose.SignJWT(claims)
    .setProtectedHeader({ kid: key.kid, ...header })
    .sign(await jose.importJWK(key, header.alg));
}

const callback = provider.callback();
server.on('request', (request, response) => {
  if (request.url === '/jwks') {
    jwksFetches += 1;
  }
  if (request.url === '/test/jwks-fetches') {
    response.setHeader('content-type', 'application/json');
    response.end(JSON.stringify({ fetches: jwksFetches }));
    return;
  }
  if (request.url === '/test/sign' && request.method === 'POST') {
    let body = '';
    request.on('data', (chunk) => (body += chunk));
    request.on('end', async () => {
      try {
        response.end(await sign(JSON.parse(body)));
      } catch (error) {
        response.statusCode = 400;
        response.end(String(error));
      }
    });
    return;
  }
  callback(request, response);
});
console.log(`issuer ${issuer}`);
