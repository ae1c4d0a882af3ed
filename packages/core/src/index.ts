/** @specd/core public entry point. Re-exports each module's public API. */
export {};
export * from './io/index.js';
export * from './kv/index.js';
export * from './plugin/index.js';
export * from './engine/index.js';
export * from './config/index.js';
export * from './serve/index.js';
export * from './pipeline/index.js';
export * from './tensor-parallel/index.js';
export * from './cli/index.js';
export * from './util/columns.js';
