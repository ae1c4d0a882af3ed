/** @specd/core public entry point. Re-exports each module's public API. */
export {};
export * from './io/index.js';
