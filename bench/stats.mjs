// The benches' summary statistics. Bench-only.

/**
 * The median of numbers: the middle value, or the mean of the two middle values for an even count (so that two
 * repetitions give their mean, not the larger one). @param xs numbers (not modified). @returns the median.
 * @throws {RangeError} on an empty list.
 */
export function median(xs) {
  if (xs.length === 0) throw new RangeError('median: expected at least one value');
  const s = [...xs].sort((a, b) => a - b);
  const h = s.length >> 1;
  return s.length % 2 === 1 ? s[h] : (s[h - 1] + s[h]) / 2;
}
