// Hosts for the prefill/decode tests: Linux network namespaces (`ip netns`) joined by veth pairs on a bridge, so that
// the router, P and D each run on their own network stack with their own address, and a link can be shaped with
// `tc qdisc … tbf` (netem is not in this kernel). Needs root (CI runs as root).
//
// Names: `specdt<pid>x<random>-<host>` per test run (the pid of the test process, so a concurrent run's namespaces are
// never touched); namespaces of earlier runs whose process is gone are removed at start, the run's own at the end
// (and at process exit, if the end never ran). Addresses are private (10.87.0.0/24) and exist only inside the
// namespaces: the bridge `br0` lives in the hub host's namespace (the first host, e.g. the router), every other host
// has a veth `v0` whose peer is a port of that bridge.
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as path from 'node:path';

import { ROOT } from './pd-cluster.js';

/** The namespaces' name prefix (`ip netns list` shows `specdt<pid>x<rand>-<host>`). */
const PREFIX = 'specdt';
/** The private subnet inside the namespaces (/24): the hub is .1, the other hosts .2, .3, … in order. */
const SUBNET = '10.87.0';

/** One host: its namespace, its address and the device its traffic leaves by (`tc` shapes it). */
export interface NetnsHost {
  readonly name: string;
  readonly ns: string;
  readonly address: string;
  /** `br0` on the hub, `v0` elsewhere. */
  readonly dev: string;
}

/** Runs `ip ARGS` (throws with its stderr on failure). */
function ip(args: readonly string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** The namespaces `ip netns list` shows. */
function listNamespaces(): string[] {
  return ip(['netns', 'list'])
    .split('\n')
    .map((l) => l.split(' ')[0] ?? '')
    .filter((n) => n !== '');
}

/** Whether process `pid` is alive on this machine. */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Removes the namespaces of earlier test runs whose process is gone. @returns their names. */
export function removeStaleNamespaces(): string[] {
  const stale = listNamespaces().filter((n) => {
    const m = new RegExp(`^${PREFIX}(\\d+)x[0-9a-f]+-`).exec(n);
    return m !== null && Number(m[1]) !== process.pid && !alive(Number(m[1]));
  });
  for (const n of stale) spawnSync('ip', ['netns', 'del', n], { stdio: 'ignore' });
  return stale;
}

/**
 * Why namespaces cannot be made here (not root, no `ip`, a kernel without them), or undefined when they can: makes
 * and deletes a probe namespace with a veth pair and a bridge.
 */
export function netnsUnavailable(): string | undefined {
  const ns = `${PREFIX}${process.pid}x${randomBytes(3).toString('hex')}-probe`;
  try {
    ip(['netns', 'add', ns]);
    try {
      ip(['-n', ns, 'link', 'add', 'br0', 'type', 'bridge']);
      ip(['-n', ns, 'link', 'add', 'v0', 'type', 'veth', 'peer', 'name', 'v1']);
      execFileSync('tc', ['-V'], { stdio: 'ignore' });
    } finally {
      spawnSync('ip', ['netns', 'del', ns], { stdio: 'ignore' });
    }
    return undefined;
  } catch (err) {
    const e = err as { stderr?: Buffer | string; message: string };
    return `${String(e.stderr ?? '').trim() || e.message}`;
  }
}

/** A set of hosts joined by one bridge; {@link close} removes them. */
export class NetnsLab {
  readonly hosts: Readonly<Record<string, NetnsHost>>;
  private readonly base: string;
  private closed = false;
  private readonly onExit = (): void => this.close();

  /**
   * Makes one namespace per name (the first is the hub, holding the bridge), each with loopback up and an address
   * on the bridge's subnet. @throws the failing `ip` command's error (whatever was made is removed first).
   */
  constructor(names: readonly string[]) {
    this.base = `${PREFIX}${process.pid}x${randomBytes(3).toString('hex')}`;
    const hosts: Record<string, NetnsHost> = {};
    process.once('exit', this.onExit);
    try {
      names.forEach((name, i) => {
        const ns = `${this.base}-${name}`;
        ip(['netns', 'add', ns]);
        ip(['-n', ns, 'link', 'set', 'lo', 'up']);
        const address = `${SUBNET}.${i + 1}`;
        const hub = hosts[names[0] ?? ''];
        if (hub === undefined) {
          ip(['-n', ns, 'link', 'add', 'br0', 'type', 'bridge']);
          ip(['-n', ns, 'addr', 'add', `${address}/24`, 'dev', 'br0']);
          ip(['-n', ns, 'link', 'set', 'br0', 'up']);
          hosts[name] = { name, ns, address, dev: 'br0' };
          return;
        }
        // v0 in the host's namespace, its peer p<i> a port of the hub's bridge
        const port = `p${i}`;
        ip(['-n', ns, 'link', 'add', 'v0', 'type', 'veth', 'peer', 'name', port, 'netns', hub.ns]);
        ip(['-n', ns, 'addr', 'add', `${address}/24`, 'dev', 'v0']);
        ip(['-n', ns, 'link', 'set', 'v0', 'up']);
        ip(['-n', hub.ns, 'link', 'set', port, 'master', 'br0']);
        ip(['-n', hub.ns, 'link', 'set', port, 'up']);
        hosts[name] = { name, ns, address, dev: 'v0' };
      });
    } catch (err) {
      this.close();
      throw err;
    }
    this.hosts = hosts;
  }

  /** The host named `name`. @throws naming it when there is none. */
  host(name: string): NetnsHost {
    const h = this.hosts[name];
    if (h === undefined) throw new Error(`netns lab: no host ${name}`);
    return h;
  }

  /** The command line that runs `argv` inside `host`'s namespace (for spawn). */
  wrap(host: string, argv: readonly string[]): string[] {
    return ['ip', 'netns', 'exec', this.host(host).ns, ...argv];
  }

  /**
   * Shapes the traffic leaving `host` with a token bucket (`tc qdisc replace … root tbf`): `rate` e.g. `'10mbit'`;
   * undefined removes the shaping.
   */
  shape(host: string, rate: string | undefined): void {
    const h = this.host(host);
    if (rate === undefined) {
      spawnSync('ip', ['netns', 'exec', h.ns, 'tc', 'qdisc', 'del', 'dev', h.dev, 'root'], { stdio: 'ignore' });
      return;
    }
    execFileSync(
      'ip',
      ['netns', 'exec', h.ns, 'tc', 'qdisc', 'replace', 'dev', h.dev, 'root', 'tbf'].concat([
        'rate',
        rate,
        'burst',
        '64kb',
        'latency',
        '5s',
      ]),
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
  }

  /**
   * Runs HTTP requests from inside `host` (test/netns-client.mjs in that namespace), one after the other.
   * @returns each answer's status, headers and body text. @throws when the client fails (its stderr in the message).
   */
  fetch(host: string, requests: readonly NetnsRequest[]): NetnsAnswer[] {
    const client = path.join(ROOT, 'test/netns-client.mjs');
    const r = spawnSync('ip', this.wrap(host, [process.execPath, client]).slice(1), {
      input: JSON.stringify(requests),
      encoding: 'utf8',
      maxBuffer: 64 << 20,
      timeout: 120_000,
    });
    if (r.status !== 0) throw new Error(`netns client in ${host} failed (${r.status ?? r.signal}): ${r.stderr}`);
    return JSON.parse(r.stdout) as NetnsAnswer[];
  }

  /** Removes the lab's namespaces (idempotent; processes still inside keep running on their own). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    process.removeListener('exit', this.onExit);
    for (const n of listNamespaces()) if (n.startsWith(`${this.base}-`)) spawnSync('ip', ['netns', 'del', n]);
  }
}

/** One HTTP request of {@link NetnsLab.fetch}. */
export interface NetnsRequest {
  readonly url: string;
  readonly method?: string;
  readonly body?: unknown;
}

/** One answer of {@link NetnsLab.fetch}. */
export interface NetnsAnswer {
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly text: string;
}
