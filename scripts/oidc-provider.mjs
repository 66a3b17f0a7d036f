// A real, certified OpenID provider (npm's `oidc-provider`) on a loopback port, for the
// review page's sign-in tests. Not a stand-in: discovery, keys, the authorization code
// flow with PKCE, the login and consent pages (the package's development interactions:
// any login name, any password) and the ID token are the package's own.
//
// Usage: OIDC_PROVIDER_DIR=.oidc-provider node scripts/oidc-provider.mjs CONFIG_JSON
// where CONFIG_JSON is {"client_id", "client_secret", "redirect_uri", "accounts": {NAME:
// {claims...}}, "port"?}. A login name not in `accounts` is unknown to the provider.
// Each start signs with an RSA key of its own (a restart on the same port is a provider
// that rotated its keys). Prints `ready ISSUER` on stdout once it listens on 127.0.0.1
// (`port`, or a free one); stops when its standard input closes (the test that started
// it ended).
import crypto from 'node:crypto';
import http from 'node:http';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const dir = process.env.OIDC_PROVIDER_DIR;
if (!dir) {
  console.error('oidc-provider.mjs: set OIDC_PROVIDER_DIR (scripts/oidc-provider.sh setup installs it)');
  process.exit(2);
}
const config = JSON.parse(process.argv[2] ?? '{}');
for (const key of ['client_id', 'client_secret', 'redirect_uri', 'accounts']) {
  if (!(key in config)) {
    console.error(`oidc-provider.mjs: the configuration has no ${key}`);
    process.exit(2);
  }
}
const entry = path.resolve(dir, 'node_modules/oidc-provider/lib/index.js');
const { default: Provider } = await import(pathToFileURL(entry).href);

const server = http.createServer();
await new Promise((resolve) => server.listen(config.port ?? 0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

function signingKey() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: crypto.randomUUID(), use: 'sig', alg: 'RS256' };
}

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: [config.redirect_uri],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  // Every client must send a PKCE challenge (S256).
  pkce: { required: () => true },
  // The claims of the granted scopes go into the ID token, as most providers do.
  conformIdTokenClaims: false,
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  jwks: { keys: [signingKey()] },
  async findAccount(_ctx, id) {
    const claims = config.accounts[id];
    if (!claims) {
      return undefined;
    }
    return { accountId: id, claims: async () => ({ sub: id, ...claims }) };
  },
});
server.on('request', provider.callback());
console.log(`ready ${issuer}`);

process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
