// The CPU backend is the exported wrappers gathered as one KernelBackend: the same functions, no copies.
import { describe, expect, it } from 'vitest';
import * as native from '@specd/native';

describe('cpuBackend', () => {
  it('is named cpu and its every kernel is the exported function of the same name', () => {
    const { cpuBackend } = native;
    expect(cpuBackend.name).toBe('cpu');
    const kernels = Object.entries(cpuBackend).filter(([key]) => key !== 'name');
    expect(kernels.length).toBe(49);
    for (const [key, fn] of kernels) expect(fn, key).toBe((native as Record<string, unknown>)[key]);
    expect(Object.isFrozen(cpuBackend)).toBe(true);
  });
});
