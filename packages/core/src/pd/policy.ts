/**
 * How the PD router picks a prefill and a decode server for a request. A policy sees only the healthy
 * servers of one role, in the order they were configured, and returns one; a new policy implements
 * {@link PdPolicy} and joins {@link createPdPolicy}'s table. The shapes follow SGLang's PD router
 * (sgl-router `--policy round_robin | random`).
 */

/** A side of a disaggregated deployment. */
export type PdRole = 'prefill' | 'decode';

/** What a policy knows about an upstream server. */
export interface PdCandidate {
  /** Base URL, e.g. `http://127.0.0.1:30001`. */
  readonly url: string;
  /** Position in the configured list of its role (0-based). */
  readonly index: number;
}

/** Picks one server of a role per request. */
export interface PdPolicy {
  /** The name `--policy` gives it. */
  readonly name: string;
  /**
   * One of `healthy` (non-empty, ascending `index`) for a request on `role`. Called once per role per request.
   */
  pick<T extends PdCandidate>(role: PdRole, healthy: readonly T[]): T;
}

/**
 * Round robin over the configured order, per role: the next healthy server after the last one picked
 * (wrapping), so a server that leaves the rotation and comes back keeps its place.
 */
export class RoundRobinPolicy implements PdPolicy {
  readonly name = 'round_robin';
  private readonly last: Record<PdRole, number> = { prefill: -1, decode: -1 };

  pick<T extends PdCandidate>(role: PdRole, healthy: readonly T[]): T {
    const next = healthy.find((c) => c.index > this.last[role]) ?? healthy[0];
    if (next === undefined) throw new Error(`RoundRobinPolicy.pick: healthy: no ${role} server to pick from`);
    this.last[role] = next.index;
    return next;
  }
}

/** Uniformly random among the healthy servers of the role. */
export class RandomPolicy implements PdPolicy {
  readonly name = 'random';

  /** @param random a source in [0, 1) (default Math.random). */
  constructor(private readonly random: () => number = Math.random) {}

  pick<T extends PdCandidate>(role: PdRole, healthy: readonly T[]): T {
    const c = healthy[Math.min(healthy.length - 1, Math.floor(this.random() * healthy.length))];
    if (c === undefined) throw new Error(`RandomPolicy.pick: healthy: no ${role} server to pick from`);
    return c;
  }
}

/** The policies `--policy` names. */
export const PD_POLICIES: Readonly<Record<string, () => PdPolicy>> = {
  round_robin: () => new RoundRobinPolicy(),
  random: () => new RandomPolicy(),
};

/** A fresh policy by name. @throws {Error} naming the unknown name and the known ones. */
export function createPdPolicy(name: string): PdPolicy {
  const make = Object.hasOwn(PD_POLICIES, name) ? PD_POLICIES[name] : undefined;
  if (make === undefined)
    throw new Error(`policy: unknown ${JSON.stringify(name)} (expected one of ${Object.keys(PD_POLICIES).join(', ')})`);
  return make();
}
