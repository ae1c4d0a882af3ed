#!/usr/bin/env node
// A TCP relay that adds latency (netem is not in this kernel): every chunk read from either side is written to the
// other side `delay` ms later, in order. Used by pd-netns.test.ts inside a network namespace (`ip netns exec`).
//   node test/delay-relay.mjs <listen host> <target host:port> <delay ms>
// Prints `relay listening on <host>:<port>` once bound (port 0: the system picks one).
import * as net from 'node:net';

const [host, target, delayArg] = process.argv.slice(2);
const delay = Number(delayArg);
const m = /^(.+):(\d+)$/.exec(target ?? '');
if (host === undefined || m === null || !(delay >= 0)) {
  process.stderr.write('usage: delay-relay.mjs <listen host> <target host:port> <delay ms>\n');
  process.exit(2);
}
const [, toHost, toPort] = m;

/** Forwards `from`'s chunks to `to`, each `delay` ms after it arrived (timers of equal delay fire in order). */
function pipeDelayed(from, to) {
  from.on('data', (chunk) => setTimeout(() => to.destroyed || to.write(chunk), delay));
  from.on('end', () => setTimeout(() => to.end(), delay));
  from.on('error', () => to.destroy());
}

const server = net.createServer((client) => {
  const upstream = net.connect({ host: toHost, port: Number(toPort) });
  pipeDelayed(client, upstream);
  pipeDelayed(upstream, client);
  client.on('close', () => setTimeout(() => upstream.destroy(), delay));
  upstream.on('close', () => setTimeout(() => client.destroy(), delay));
});
server.listen(0, host, () => {
  const a = server.address();
  process.stdout.write(`relay listening on ${a.address}:${a.port}\n`);
});
