export * from './types.js';
export * from './checksum.js';
export * from './transfer-engine.js';
export * from './zmq-transfer.js';
