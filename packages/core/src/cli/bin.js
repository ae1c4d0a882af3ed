#!/usr/bin/env node
// `specd` executable (linked by npm into node_modules/.bin). Plain JavaScript so the link exists
// before `npm run build`; it runs the compiled CLI from dist/.
import('../../dist/cli/main.js').then(
  async ({ main }) => {
    process.exitCode = await main(process.argv.slice(2));
  },
  (err) => {
    process.stderr.write(`specd: error: cannot load the CLI (${err.message}); run \`npm run build\` first\n`);
    process.exitCode = 1;
  },
);
