import { defineConfig } from 'vitest/config';

// Tests run against the built packages (dist/), so `npm test` builds first.
export default defineConfig({
  test: {
    include: ['native/test/**/*.test.ts', 'packages/*/test/**/*.test.ts', 'test/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
  },
});
