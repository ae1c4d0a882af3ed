export * from './types.js';
export {
  createPdPolicy,
  PD_POLICIES,
  RandomPolicy,
  RoundRobinPolicy,
  type PdCandidate,
  type PdPolicy,
  type PdRole,
} from './policy.js';
export { PdRouterMetrics } from './router-metrics.js';
export {
  PdRouter,
  randomRoom,
  type PdRouterOptions,
  type PdUpstreamState,
} from './router.js';
