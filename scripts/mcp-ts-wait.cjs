// Calls `threadgate_wait` through the official TypeScript MCP SDK with its default
// request timeout (60 s), as a TypeScript harness in the sandbox would, and prints
// what came back: `{"elapsed_ms": N, "result": {...}}`, or `{"error": "..."}` with exit
// status 1 when the SDK gave up first.
//
//   MCP_SDK_DIR=/path/with/node_modules node scripts/mcp-ts-wait.cjs SOCKET EXECUTION_ID
//
// SOCKET is a session's socket; the script forwards a loopback TCP port to it (the
// runner's bridge does the same inside the container). MCP_SDK_DIR is a directory where
// `npm install @modelcontextprotocol/sdk` was run. Its test: mcp_e2e's
// `progress::the_typescript_sdk_gets_an_answer_within_its_default_timeout`.
'use strict';

const net = require('node:net');
const path = require('node:path');
const { createRequire } = require('node:module');

async function main() {
  const [socket, executionId] = process.argv.slice(2);
  if (!socket || !executionId || !process.env.MCP_SDK_DIR) {
    throw new Error('usage: MCP_SDK_DIR=DIR node mcp-ts-wait.cjs SOCKET EXECUTION_ID');
  }
  const sdk = createRequire(path.join(process.env.MCP_SDK_DIR, 'package.json'));
  const { Client } = sdk('@modelcontextprotocol/sdk/client/index.js');
  const { StreamableHTTPClientTransport } = sdk(
    '@modelcontextprotocol/sdk/client/streamableHttp.js',
  );
  const bridge = net.createServer((conn) => {
    const upstream = net.connect(socket);
    conn.pipe(upstream).pipe(conn);
    upstream.on('error', () => conn.destroy());
    conn.on('error', () => upstream.destroy());
  });
  await new Promise((resolve) => bridge.listen(0, '127.0.0.1', resolve));
  const url = new URL(`http://127.0.0.1:${bridge.address().port}/mcp`);
  const client = new Client({ name: 'threadgate-ts-wait', version: '1.0.0' });
  try {
    await client.connect(new StreamableHTTPClientTransport(url));
    const started = Date.now();
    // No options: the SDK's default request timeout applies.
    const result = await client.callTool({
      name: 'threadgate_wait',
      arguments: { execution_id: executionId },
    });
    console.log(JSON.stringify({ elapsed_ms: Date.now() - started, result }));
  } finally {
    await client.close().catch(() => {});
    bridge.close();
  }
}

main().catch((e) => {
  console.log(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
  process.exit(1);
});
