// The HTTP client of test/netns.ts, run inside a network namespace (`ip netns exec NS node netns-client.mjs`):
// reads a JSON list of requests {url, method?, body?} on stdin, runs them one after the other and writes a JSON list
// of answers {status, headers, text} on stdout. A request that cannot be sent fails the whole run (exit 1).
const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const requests = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const out = [];
for (const r of requests) {
  const res = await fetch(r.url, {
    method: r.method ?? (r.body === undefined ? 'GET' : 'POST'),
    headers: r.body === undefined ? {} : { 'content-type': 'application/json' },
    body: r.body === undefined ? undefined : JSON.stringify(r.body),
  });
  out.push({ status: res.status, headers: Object.fromEntries(res.headers), text: await res.text() });
}
process.stdout.write(JSON.stringify(out));
