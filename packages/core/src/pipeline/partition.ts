/**
 * Pipeline partitions: how many layers each stage runs (REFERENCE.md §8).
 */

/** Thrown for a partition that does not fit the model. */
export class PartitionError extends Error {
  override readonly name = 'PartitionError';
}

/**
 * vLLM's default split (`get_pp_indices`): every stage gets ⌊L / P⌋ layers and the remainder goes,
 * one layer each, to the stages just before the last (stage P−2, then P−3, …); the last stage keeps
 * ⌊L / P⌋ because it also runs the final norm and lm_head. E.g. L = 8: P = 3 → [3, 3, 2].
 * @throws {PartitionError} when P < 1 or P > L.
 */
export function defaultPartition(numLayers: number, pp: number): number[] {
  if (!Number.isInteger(pp) || pp < 1) throw new PartitionError(`pp: expected an integer >= 1, got ${pp}`);
  if (pp > numLayers)
    throw new PartitionError(`pp ${pp}: the model has only ${numLayers} layers (each stage needs at least one)`);
  const parts = new Array<number>(pp).fill(Math.floor(numLayers / pp));
  const rest = numLayers % pp;
  for (let i = 2; i < rest + 2; i++) parts[pp - i]!++;
  return parts;
}

/**
 * Layer ranges `[start, end)` of a partition (layer counts per stage), validated.
 * @throws {PartitionError} naming the problem: wrong length, a stage under one layer, a sum other than L.
 */
export function partitionRanges(
  partition: readonly number[],
  numLayers: number,
  pp = partition.length,
): [number, number][] {
  if (partition.length !== pp)
    throw new PartitionError(
      `partition [${partition.join(', ')}]: expected ${pp} entries (one per pipeline stage), got ${partition.length}`,
    );
  partition.forEach((n, i) => {
    if (!Number.isInteger(n) || n < 1)
      throw new PartitionError(
        `partition [${partition.join(', ')}]: stage ${i}: expected at least one layer, got ${n}`,
      );
  });
  const sum = partition.reduce((a, b) => a + b, 0);
  if (sum !== numLayers)
    throw new PartitionError(`partition [${partition.join(', ')}]: sums to ${sum} layers, the model has ${numLayers}`);
  const out: [number, number][] = [];
  let at = 0;
  for (const n of partition) {
    out.push([at, at + n]);
    at += n;
  }
  return out;
}
