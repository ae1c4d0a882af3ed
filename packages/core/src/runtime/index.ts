/**
 * @specd/core runtime: assembles what the CLI, the server, benches and tests run — a target (whole,
 * tensor parallel, pipeline parallel, or both) and a drafter bound to it — from the plugin packages.
 */
export {
  checkLoadedCheckpoint,
  ggufPathOf,
  loadTarget,
  sanityOf,
  type LoadedTarget,
  type SanityLoadOptions,
  type TargetLoadOptions,
  deviceLoadOptions,
} from './target.js';
export {
  checkParallelism,
  loadParallelTarget,
  loadPipelineTarget,
  loadTensorParallelTarget,
  ParallelismError,
  type ParallelTargetOptions,
  type PipelineTargetOptions,
  type TensorParallelTargetOptions,
} from './parallel.js';
export { checkDrafterTokenizer, loadDrafter, type DrafterChoice, type LoadedDrafter } from './drafter.js';
